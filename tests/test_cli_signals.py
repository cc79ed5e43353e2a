"""SIGTERM and SIGINT while ``trouper run`` streams: a graceful close that leaves nothing.

The CLI runs for real with a scripted model whose first step starts a long command;
once that command runs, the test signals the CLI, then checks the exit code, that every
process of the run is gone (found through the home's pid files, server.json and
/proc), and that the session carries on to FINISHED.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trouper.host.processes import descendants, pid_alive, start_time
from trouper.testing import FakeLLMServer, check_log, wait_until

from accel import forkserver
from accel.zygote import STACKS_SIGNAL

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

SCRIPT = [
    {"tool": "run", "args": {"command": "touch started && sleep 600"}},
    {"tool": "finish", "args": {"message": "carried on after the signal"}},
]


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "TROUPER_HOME": str(home), "COLUMNS": "200"}
    for name in ("TROUPER_MODEL", "TROUPER_DEBUG", "TROUPER_TRANSPORT_KEY_FILE"):
        env.pop(name, None)
    return env


def _pid_in(path: Path) -> int | None:
    try:
        text = path.read_text()
        return int(json.loads(text)["pid"] if path.suffix == ".json" else text.split()[0])
    except (OSError, ValueError, KeyError):
        return None


def _published(home: Path) -> list[int]:
    """Pids the home names: the admin and shared actors, the session's actors, sandboxes."""
    files = [*home.glob("actors/*.pid"), *home.glob("sessions/*/actors/*.pid"),
             *home.glob("sessions/*/runtime/server.json")]
    return [pid for pid in map(_pid_in, files) if pid]


def _tree(roots: list[int]) -> dict[int, int | None]:
    """Each live process under ``roots`` (them included), with its start time, so that a
    later check never mistakes a reused pid for a survivor."""
    return {pid: start_time(pid) for pid in descendants(roots)}


def _command(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def _survivors(processes: dict[int, int | None]) -> list[str]:
    return [f"{pid} {_command(pid)[:80]!r}" for pid, started in processes.items()
            if pid_alive(pid) and start_time(pid) == started]


def _run_until_the_command_sleeps(tmp_path: Path) -> tuple[subprocess.Popen, dict, Path]:
    """Start ``trouper run --script``; return it once ``sleep 600`` runs in its sandbox,
    with every process of the run by then."""
    home, workspace = tmp_path / "home", tmp_path / "ws"
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    out = (tmp_path / "out.txt").open("w")
    err = (tmp_path / "err.txt").open("w")
    # its own session, as a shell's foreground job: a Ctrl-C reaches the whole group
    cli = forkserver.Popen(
        [sys.executable, "-m", "trouper", "run", "wait a while", "--script", str(script),
         "--workspace", str(workspace)],
        env=_env(home), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
        start_new_session=True)
    out.close()
    err.close()

    def sleeping() -> dict[int, int | None] | None:
        if not (workspace / "started").exists():
            return None  # the cheap check first: the tree is a walk over /proc
        processes = _tree([cli.pid, *_published(home)])
        commands = [_command(pid) for pid in processes]
        return processes if (workspace / "started").exists() and any(
            c.startswith(b"sleep 600") for c in commands) else None

    try:
        processes = wait_until(sleeping, 90, "the scripted command to sleep in the sandbox")
    except BaseException:
        cli.terminate()
        cli.wait(60)
        raise
    return cli, processes, script


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP],
                         ids=["TERM", "INT", "HUP"])
def test_a_signal_closes_everything_and_the_session_carries_on(tmp_path, signum):
    cli, processes, script = _run_until_the_command_sleeps(tmp_path)
    home = tmp_path / "home"
    try:
        if signum == signal.SIGINT:
            os.killpg(cli.pid, signum)  # as Ctrl-C in a terminal: the foreground group
        else:
            cli.send_signal(signum)  # as kill(1) or a service manager
        assert _exit_code(cli, tmp_path) == 128 + signum
        assert len(processes) >= 8, processes  # CLI, admin, logger, 5 actors, sandbox...
        wait_until(lambda: not _survivors(processes), 10,
                   f"every process of the run to end: {_survivors(processes)}")
        assert [pid for pid in _published(home) if pid_alive(pid)] == []
    finally:
        _end(cli, processes)

    stderr = (tmp_path / "err.txt").read_text()
    stdout = (tmp_path / "out.txt").read_text()
    assert "Traceback" not in stderr, stderr
    session_id = stdout.split("session ", 1)[1].split()[0]
    name = signal.Signals(signum).name
    assert stderr.splitlines()[-1] == (
        f"trouper: interrupted by {name}: session {session_id} can be resumed with: "
        f"trouper resume {session_id} --script {script}")
    assert f"reason     interrupted by {name}; paused while trouper closed" in stdout

    _carry_on(home, session_id, script, by_cli=signum == signal.SIGTERM)


def _exit_code(cli: subprocess.Popen, tmp_path: Path, timeout_s: float = 60) -> int:
    """The CLI's exit code; a CLI still running after ``timeout_s`` fails the test with
    where each of its threads is (the zygote's stack dump), its stderr and its log."""
    try:
        return cli.wait(timeout_s)
    except subprocess.TimeoutExpired:
        err = tmp_path / "err.txt"
        os.kill(cli.pid, STACKS_SIGNAL)
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: "most recent call first" in err.read_text(), 10, "the stacks")
        log = tmp_path / "home" / "logs" / "trouper.log"
        pytest.fail(f"the CLI still ran {timeout_s:g} s after the signal.\n"
                    f"its stderr:\n{err.read_text()[-8000:]}\n"
                    f"its log:\n{log.read_text()[-8000:] if log.exists() else ''}")


def _end(cli: subprocess.Popen, processes: dict[int, int | None]) -> None:
    """After a failure: end what this test started (nothing is left when it passed)."""
    if cli.poll() is None:
        cli.terminate()
        cli.wait(60)
    for pid in [int(s.split()[0]) for s in _survivors(processes)]:
        os.kill(pid, signal.SIGTERM)
    try:
        wait_until(lambda: not _survivors(processes), 10, "the leftovers to end")
    except TimeoutError:
        for pid in [int(s.split()[0]) for s in _survivors(processes)]:
            os.kill(pid, signal.SIGKILL)


def _carry_on(home: Path, session_id: str, script: Path, by_cli: bool) -> None:
    """The session was paused, not ended: resume it (from the CLI, or the API) to FINISHED."""
    from trouper import AgentState, Trouper
    from trouper.cli.scripted import scripted_port

    if by_cli:
        again = forkserver.run(
            [sys.executable, "-m", "trouper", "resume", session_id, "--script", str(script)],
            env=_env(home), stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=120)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "state → finished" in again.stdout
    with Trouper(home=home, resume=False) as trouper:
        session = trouper.session(session_id)
        if not by_cli:
            assert session.state == AgentState.PAUSED
            port = scripted_port(session.record.config.llm.base_url)
            with FakeLLMServer(SCRIPT, port=port):
                session.resume()
                assert session.wait(timeout=60) == AgentState.FINISHED
        events = list(session.events())
        assert session.state == AgentState.FINISHED
    assert check_log(events) == []
    killed = next(e for e in events if e.kind == "observation").outcome
    # the shell killed with the server (interrupted: the sandbox stopped, or error), or the
    # command alone (exit 137): either way it ended unfinished and was never run again
    # (I2 in docs/promises.md)
    assert killed.status in ("interrupted", "error") or killed.exit_code == 128 + signal.SIGKILL, \
        killed
    assert sum(1 for e in events if e.kind == "action") == 2


def test_a_second_signal_exits_at_once():
    """The handler alone, in a process of its own: no trouper process to leave behind."""
    code = textwrap.dedent("""
        import os, signal, sys, time
        from trouper.cli.drive import Interrupts
        with Interrupts().installed() as interrupts:
            os.kill(os.getpid(), signal.SIGTERM)
            assert interrupts.stop.wait(10), "the first signal set stop"
            print("first handled", flush=True)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(60)  # the close the second signal cuts short
        sys.exit(99)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.stdout == "first handled\n"
    assert done.stderr == "trouper: interrupted again: exiting at once\n"
    assert done.returncode == 128 + signal.SIGINT
