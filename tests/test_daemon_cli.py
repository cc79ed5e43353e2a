"""The CLI on top of the daemon, as a user types it: sessions, events --follow, send,
pause, resume, stop, approve, reject, run --daemon (Ctrl-C detaches), open, logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from trouper.testing import wait_until
from trouper.testing.daemon import running_daemon

from accel import forkserver

pytestmark = pytest.mark.slow  # starts a daemon process

FINISH = {"tool": "finish", "args": {"message": "done"}}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with running_daemon(tmp_path_factory.mktemp("chome")) as d:
        yield d


def trouper(daemon, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "TROUPER_HOME": str(daemon.home.root), "COLUMNS": "200"}
    return forkserver.run([sys.executable, "-m", "trouper", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def test_commands_drive_a_session_in_the_daemon(daemon, scripted, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo one > one.txt"}},
        {"tool": "run", "args": {"command": "rm -f keep.txt"}},
        {"say": "What next?"},
        {"tool": "run", "args": {"command": "echo two > two.txt"}},
        FINISH,
    ])
    (tmp_path / "keep.txt").write_text("keep\n")
    session = daemon.client().start_session("work", llm=llm, workspace=tmp_path,
                                            confirm="always")
    sid = session.id
    assert session.wait(timeout=60).value == "awaiting_user_confirmation"

    listed = trouper(daemon, "sessions", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {"id": sid, "state": "awaiting_user_confirmation"}.items() <= \
        next(r for r in rows if r["id"] == sid).items()
    waiting = trouper(daemon, "sessions", "--state", "awaiting_user_confirmation")
    assert sid in waiting.stdout

    approved = trouper(daemon, "approve", sid)
    assert approved.returncode == 0 and sid in approved.stdout, approved.stderr
    assert session.wait(timeout=60).value == "awaiting_user_confirmation"
    assert (tmp_path / "one.txt").exists()
    rejected = trouper(daemon, "reject", sid, "--reason", "keep it")
    assert rejected.returncode == 0, rejected.stderr
    assert session.wait(timeout=60).value == "awaiting_user_input"
    assert (tmp_path / "keep.txt").exists()

    sent = trouper(daemon, "send", sid, "write two")
    assert sent.returncode == 0, sent.stderr
    followed = trouper(daemon, "events", sid, "--follow", "--json")
    assert followed.returncode == 0, followed.stderr
    seqs = [json.loads(line)["seq"] for line in followed.stdout.splitlines()]
    assert seqs == list(range(1, len(seqs) + 1))
    # --follow ended once the session settled: waiting to have "echo two" approved
    assert session.wait(timeout=0).value == "awaiting_user_confirmation"
    assert trouper(daemon, "approve", sid).returncode == 0
    rest = trouper(daemon, "events", sid, "--follow", "--json", "--since", str(seqs[-1]))
    more = [json.loads(line) for line in rest.stdout.splitlines()]
    assert [e["seq"] for e in more] == list(range(seqs[-1] + 1, seqs[-1] + 1 + len(more)))
    assert session.wait(timeout=0).value == "finished" and (tmp_path / "two.txt").exists()
    kinds = [json.loads(line)["kind"] for line in followed.stdout.splitlines()]
    assert kinds.count("confirmation") == 2
    plain = trouper(daemon, "events", sid)  # without --follow: the log as it stands
    assert plain.returncode == 0 and "rejected" in plain.stdout


def test_pause_resume_and_stop_from_the_command_line(daemon, scripted):
    _, llm = scripted([{"tool": "run", "args": {"command": f"echo {i}"}, "delay_s": 0.2}
                       for i in range(40)] + [FINISH])
    session = daemon.client().start_session("count", llm=llm, max_iterations=100)
    wait_until(lambda: session.info().actions >= 1, 60, "a first action")
    paused = trouper(daemon, "pause", session.id)
    assert paused.returncode == 0 and "paused" in paused.stdout, paused.stderr
    # resume goes through the daemon (never a second actor system on the session) and
    # follows it; --timeout ends the following, not the session
    resumed = trouper(daemon, "resume", session.id, "--timeout", "1")
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert session.state.value == "running"
    stopped = trouper(daemon, "stop", session.id)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout


def test_run_daemon_follows_and_ctrl_c_detaches(daemon, scripted, tmp_path):
    """Even started with SIGINT ignored (Python then installs no handler of its own)."""
    server, _ = scripted([{"tool": "run", "args": {"command": f"echo {i}"}, "delay_s": 0.2}
                          for i in range(15)] + [FINISH])
    env = {**os.environ, "TROUPER_HOME": str(daemon.home.root)}
    proc = forkserver.Popen(
        [sys.executable, "-m", "trouper", "run", "count to fifteen", "--daemon",
         "--model", "hosted_vllm/scripted", "--base-url", server.url, "--api-key", "test-key",
         "--workspace", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        sigint_ignored=True)  # as a `cmd &` shell starts it
    try:
        wait_until(lambda: any(s.task == "count to fifteen" and s.last_seq > 5
                               for s in daemon.client().sessions()), 60, "the session running")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    sid = next(s.id for s in daemon.client().sessions() if s.task == "count to fifteen")
    assert f"detached: session {sid} goes on in the daemon" in err
    assert daemon.client().session(sid).wait(timeout=120).value == "finished"


def test_open_prints_the_token_in_the_fragment_and_logs_show_the_daemon(daemon):
    opened = trouper(daemon, "daemon", "open")
    assert opened.returncode == 0
    assert opened.stdout.strip() == f"{daemon.url}/#token={daemon.token}"
    logs = trouper(daemon, "daemon", "logs", "-n", "200")
    assert logs.returncode == 0 and f"daemon serving {daemon.url}" in logs.stdout
    assert daemon.token not in logs.stdout


def test_without_a_daemon_session_commands_say_so(tmp_path):
    env = {**os.environ, "TROUPER_HOME": str(tmp_path / "empty")}
    out = forkserver.run([sys.executable, "-m", "trouper", "pause", "s-123"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 3 and "no daemon runs for" in out.stderr
    listed = forkserver.run([sys.executable, "-m", "trouper", "sessions", "--json"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert listed.returncode == 0 and listed.stdout == ""
