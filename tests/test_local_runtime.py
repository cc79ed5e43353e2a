"""LocalSandbox: journal, idempotency, epochs, survival of its proxy, death of its server."""

from __future__ import annotations

import ast
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trouper.exceptions import ConfigError, InvalidRequest, RuntimeUnavailable, StaleEpoch
from trouper.host.processes import children_of, parent_of, pid_alive, process_name
from trouper.messages.actions import RunCommand
from trouper.runtimes import Runtime, Sandbox, load_sandbox
from trouper.runtimes.local import LocalSandbox
from trouper.testing import wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

LIMITS = {"timeout_s": 10.0, "no_output_timeout_s": 5.0}


def _servers_on(state_dir: Path) -> list[int]:
    """Pids of sandbox servers whose command line names ``state_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if os.fsencode(str(state_dir)) in argv and pid_alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def _post_execute(state_dir: Path, action_id: str, command: str, epoch: int) -> dict:
    """Start an action with a raw POST /execute, as a proxy that dies right after would."""
    info = json.loads((state_dir / "server.json").read_text())
    conn = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=5)
    body = {
        "action_id": action_id,
        "epoch": epoch,
        "timeout_s": 30,
        "no_output_timeout_s": 0,
        "action": {"kind": "run", "command": command},
    }
    headers = {"Authorization": f"Bearer {info['token']}"}
    try:
        conn.request("POST", "/execute", body=json.dumps(body).encode(), headers=headers)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Workspace and state folder; at the end no server may run on the state folder."""
    state_dir = tmp_path / "rt"
    yield tmp_path / "ws", state_dir
    leftover = _servers_on(state_dir)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"sandbox servers left running: {leftover}"


@pytest.fixture
def make_sandbox(dirs: tuple[Path, Path]) -> Iterator[Callable[..., LocalSandbox]]:
    """New LocalSandbox objects on the same folders; all are stopped at the end."""
    made: list[LocalSandbox] = []

    def make(**kwargs: object) -> LocalSandbox:
        sandbox = LocalSandbox("s1", dirs[0], dirs[1], **kwargs)
        made.append(sandbox)
        return sandbox

    try:
        yield make
    finally:
        for sandbox in reversed(made):
            sandbox.stop()


def test_protocols_and_backend_loading(dirs: tuple[Path, Path]) -> None:
    sandbox = load_sandbox("local", session_id="s1", workspace=dirs[0], state_dir=dirs[1])
    assert isinstance(sandbox, LocalSandbox)
    with pytest.raises(ConfigError, match="known backends: docker, local"):
        load_sandbox("kubernetes")
    with pytest.raises(RuntimeUnavailable, match="not started"):
        _ = sandbox.runtime
    assert sandbox.alive().cause == "not_started"
    sandbox.stop()  # nothing started: a no-op


def test_start_creates_the_workspace_and_secrets_reach_commands(
    make_sandbox: Callable[..., LocalSandbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TROUPER_NOT_FOR_THE_AGENT", "leak")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    sandbox = make_sandbox(env={"MY_SECRET": "hunter2"})
    assert sandbox.start(1) is False
    assert sandbox.workspace.is_dir()
    assert isinstance(sandbox, Sandbox) and isinstance(sandbox.runtime, Runtime)
    command = (
        '[ "$MY_SECRET" = hunter2 ] && echo reached; '
        "echo $MY_SECRET ${TROUPER_NOT_FOR_THE_AGENT:-unset} ${PYTHONPATH:-unset}"
    )
    outcome = sandbox.runtime.execute("a1", RunCommand(command=command), **LIMITS)
    # the value reaches the command; what the command prints shows only the placeholder
    assert outcome.content == "reached\n<secret:MY_SECRET> unset unset\n"
    assert sandbox.alive().alive
    info = json.loads(sandbox.info_path.read_text())
    assert sandbox.info_path.stat().st_mode & 0o777 == 0o600
    assert set(info) >= {"pid", "port", "token", "boot_id", "workspace"}


def test_requests_without_the_token_are_refused(make_sandbox: Callable[..., LocalSandbox]) -> None:
    sandbox = make_sandbox()
    sandbox.start(1)
    info = json.loads(sandbox.info_path.read_text())
    conn = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=5)
    try:
        conn.request("GET", "/alive", headers={"Authorization": "Bearer wrong"})
        response = conn.getresponse()
        assert response.status == 401
        assert json.loads(response.read())["error"] == "Unauthorized"
    finally:
        conn.close()


def test_concurrent_execute_of_one_id_runs_it_once(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:
    sandbox = make_sandbox()
    sandbox.start(1)
    action = RunCommand(command="sleep 0.3; echo ran >> ledger")
    outcomes = []
    threads = [
        threading.Thread(
            target=lambda: outcomes.append(sandbox.runtime.execute("c", action, **LIMITS))
        )
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(outcomes) == 4 and len(set(outcomes)) == 1
    assert (sandbox.workspace / "ledger").read_text() == "ran\n"


def test_resolve_absent_running_and_finished(make_sandbox: Callable[..., LocalSandbox]) -> None:
    sandbox = make_sandbox()
    sandbox.start(1)
    runtime = sandbox.runtime
    assert runtime.resolve("never").state == "absent"
    _post_execute(sandbox.state_dir, "slow", "sleep 0.5; echo slow", epoch=1)
    assert runtime.resolve("slow").state == "running"
    record = runtime.resolve("slow", wait_s=5)
    assert record.state == "finished" and record.outcome is not None
    assert record.outcome.content == "slow\n" and record.epoch == 1


def test_malformed_actions_are_refused_before_the_journal(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:
    sandbox = make_sandbox()
    sandbox.start(1)
    with pytest.raises(InvalidRequest, match="timeout_s must be > 0"):
        sandbox.runtime.execute(
            "bad", RunCommand(command="true"), timeout_s=0, no_output_timeout_s=0
        )
    assert sandbox.runtime.resolve("bad").state == "absent"


def test_actions_survive_the_death_of_their_proxy(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:
    first = make_sandbox()
    assert first.start(1) is False
    ledger = first.workspace / "ledger"
    record = _post_execute(first.state_dir, "survivor", "sleep 1; echo done >> ledger", epoch=1)
    assert record["state"] == "running"
    old_runtime = first.runtime
    pid = json.loads(first.info_path.read_text())["pid"]
    del first  # the proxy dies; its sandbox must not

    second = make_sandbox()
    assert second.start(2) is True
    assert json.loads(second.info_path.read_text())["pid"] == pid
    record = second.runtime.resolve("survivor", wait_s=10)
    assert record.state == "finished" and record.outcome is not None
    assert record.outcome.status == "ok" and record.outcome.exit_code == 0
    assert ledger.read_text() == "done\n"
    again = second.runtime.execute("survivor", RunCommand(command="echo done >> ledger"), **LIMITS)
    assert again == record.outcome and ledger.read_text() == "done\n"
    with pytest.raises(StaleEpoch):
        old_runtime.execute("late", RunCommand(command="echo late >> ledger"), **LIMITS)
    with pytest.raises(StaleEpoch):
        old_runtime.resolve("survivor")
    assert second.runtime.resolve("late").state == "absent"
    old_runtime.close()


def test_an_older_epoch_cannot_claim_or_stop_the_sandbox(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:
    newer = make_sandbox()
    newer.start(5)
    older = make_sandbox()
    with pytest.raises(StaleEpoch):
        older.start(4)
    older.stop()  # refused: the sandbox belongs to epoch 5
    assert newer.alive().alive
    stale = make_sandbox()
    stale.start(5)
    newest = make_sandbox()
    newest.start(6)
    assert stale.alive().cause == "superseded"
    stale.stop()  # refused by the server: it belongs to epoch 6 now
    assert newest.alive().alive


def test_a_killed_server_is_replaced_and_its_action_is_unknown(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:
    first = make_sandbox()
    first.start(1)
    alive_info = first.runtime.alive()
    command = "sh -c 'echo $$ > doomed.pid; exec sleep 3'; echo done >> ledger"
    _post_execute(first.state_dir, "doomed", command, epoch=1)
    pid_file = first.workspace / "doomed.pid"
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
    os.kill(alive_info["pid"], signal.SIGKILL)
    wait_until(lambda: not pid_alive(alive_info["pid"]))
    wait_until(lambda: not pid_alive(alive_info["shell_pid"]))  # the shell goes with it
    wait_until(lambda: not pid_alive(int(pid_file.read_text())))  # and its command
    health = first.alive()
    assert (health.alive, health.cause) == (False, "exited")

    second = make_sandbox()
    assert second.start(2) is False
    assert second.runtime.alive()["pid"] != alive_info["pid"]
    assert second.runtime.resolve("doomed").state == "unknown"
    lost = second.runtime.execute("doomed", RunCommand(command="echo again >> ledger"), **LIMITS)
    assert lost.status == "lost"
    assert not (second.workspace / "ledger").exists()


def test_two_proxies_starting_at_once_share_one_server(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:

    sandboxes = [make_sandbox(), make_sandbox()]
    results: list[bool] = []
    threads = [threading.Thread(target=lambda s=s: results.append(s.start(1))) for s in sandboxes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(results) == [False, True]
    pids = {s.runtime.alive()["pid"] for s in sandboxes}
    assert len(pids) == 1 and _servers_on(sandboxes[0].state_dir) == list(pids)


def test_idle_server_exits_with_its_shell(make_sandbox: Callable[..., LocalSandbox]) -> None:
    sandbox = make_sandbox(idle_timeout_s=0.5)
    sandbox.start(1)
    answer = sandbox.runtime.alive()
    wait_until(lambda: not pid_alive(answer["pid"]), 5)
    wait_until(lambda: not pid_alive(answer["shell_pid"]), 2)
    assert not sandbox.info_path.exists()
    assert sandbox.alive().cause == "exited"


def test_a_frozen_server_is_unreachable(make_sandbox: Callable[..., LocalSandbox]) -> None:
    sandbox = make_sandbox()
    sandbox.start(1)
    pid = sandbox.runtime.alive()["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        # kill() returns before every thread has stopped: a connection thread woken by the
        # request could still answer it (the test's rare failure on a loaded machine)
        wait_until(lambda: _all_threads_stopped(pid), 10, "every thread of the server to stop")
        health = sandbox.alive()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert (health.alive, health.cause) == (False, "unreachable")
    assert "alive" in health.detail and "127.0.0.1" in health.detail
    wait_until(lambda: sandbox.alive().alive)


def test_stop_is_idempotent_and_kills_everything(make_sandbox: Callable[..., LocalSandbox]) -> None:
    sandbox = make_sandbox()
    sandbox.start(1)
    answer = sandbox.runtime.alive()
    _post_execute(sandbox.state_dir, "bg", "sleep 30", epoch=1)
    started = time.monotonic()
    sandbox.stop()
    sandbox.stop()
    assert time.monotonic() - started < 5
    assert not pid_alive(answer["pid"])
    wait_until(lambda: not pid_alive(answer["shell_pid"]), 2)
    assert sandbox.alive().cause == "not_started"
    assert not sandbox.info_path.exists()


MCP_MODULES = {"mcp_hub.py", "mcp_stdio.py"}
"""The sandbox's MCP client: it needs the mcp package, imported only by a sandbox whose
session uses a server (``mcp_launch.hub_class``), never at another module's top."""


def test_sandbox_package_is_stdlib_only_and_self_contained() -> None:
    package = Path(__file__).resolve().parents[1] / "runtimes" / "sandbox"
    for module in package.glob("*.py"):
        tree = ast.parse(module.read_text(), str(module))
        assert isinstance(tree.body[1], ast.ImportFrom) and tree.body[1].module == "__future__"
        if module.name in MCP_MODULES:
            continue
        top = [node for node in tree.body if isinstance(node, ast.ImportFrom) and node.level]
        assert not [n.module for n in top if f"{n.module}.py" in MCP_MODULES], module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", (module, name)
    interpreters = [sys.executable, *map(str, Path.home().glob(".pyenv/versions/3.8*/bin/python"))]
    boot = "import sys; sys.path.insert(0, sys.argv[1]); import sandbox.__main__, sandbox.server"
    for python in interpreters:
        done = subprocess.run(
            [python, "-I", "-S", "-c", boot, str(package.parent)], capture_output=True, timeout=30
        )
        assert done.returncode == 0, (python, done.stderr.decode())


def test_the_server_leaves_openssl_unloaded(make_sandbox: Callable[..., LocalSandbox]) -> None:
    """A sandbox per session: OpenSSL's ~1.2 MB of private pages in each would add up."""
    sandbox = make_sandbox()
    sandbox.start(1)
    pid = sandbox.runtime.alive()["pid"]
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "libssl" not in maps and "_hashlib" not in maps and "libcrypto" not in maps
    assert sandbox.runtime.alive()["pid"] == pid  # the token check still answers


def _all_threads_stopped(pid: int) -> bool:
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            continue
    return bool(states) and all(state in ("T", "t") for state in states)


@pytest.fixture(params=["forked", "afresh"])
def server_launch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                  ) -> Iterator[str]:
    """Each way a server comes to be: forked by this process's sandbox zygote, or started."""
    from trouper.runtimes import sandbox_zygote

    monkeypatch.delenv(sandbox_zygote.ENABLED_ENV, raising=False)
    if request.param == "afresh":
        yield request.param
        return
    sandbox_zygote.prepare()
    try:
        sandbox_zygote.ensure_started()
        yield request.param
    finally:
        sandbox_zygote.release()


def _forked_by_our_zygote(pid: int) -> bool:
    """Whether ``pid``'s parent is a sandbox zygote this process started (an earlier
    test's may still be ending beside it)."""
    parent = parent_of(pid)
    return (parent is not None and parent in children_of(os.getpid())
            and process_name(parent) == "trouper-zygote")


def test_a_start_waits_out_a_dying_server_that_still_holds_the_lock(
    make_sandbox: Callable[..., LocalSandbox], server_launch: str,
) -> None:
    """A SIGKILLed server holds its folder's lock until the kernel has finished it, which
    under load comes after the next start began: the new server, refused, must not fail
    that start; once the lock is free a server starts. (The holder here is a process that
    locked the folder and lets go without ever writing a server.json, as a dying one.)"""
    sandbox = make_sandbox()
    sandbox.state_dir.mkdir(parents=True, mode=0o700)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, os; fd = os.open(sys.argv[1], "
         "os.O_RDWR | os.O_CREAT, 0o600); fcntl.flock(fd, fcntl.LOCK_EX); print('held', "
         "flush=True); sys.stdin.read()", str(sandbox.state_dir / "server.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        refused = threading.Event()
        log = sandbox.state_dir / "server.log"

        def let_go_once_refused() -> None:  # the start is under way and its server refused
            wait_until(lambda: log.exists() and "another sandbox server" in log.read_text())
            refused.set()
            assert holder.stdin is not None
            holder.stdin.close()

        letting_go = threading.Thread(target=let_go_once_refused)
        letting_go.start()
        attached = sandbox.start(1)
        letting_go.join(10)
        assert refused.is_set() and attached is False
        server = sandbox.server_pid()
        assert server is not None and sandbox.runtime.alive()["pid"] == server != holder.pid
        assert _forked_by_our_zygote(server) is (server_launch == "forked")
    finally:
        holder.kill()
        holder.wait()


def test_attaching_to_a_live_server_reads_no_lock_and_a_silent_one_is_checked_first(
    make_sandbox: Callable[..., LocalSandbox], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer to the ping, with the boot id of ``server.json``, proves which server
    it is: a proxy's restart does not wait for ``/proc/locks`` (8-15 ms here after a quiet
    spell). A server that does not answer is killed only once the lock says it is ours
    (its pid may belong to another process by now)."""
    from trouper.runtimes import local

    first = make_sandbox()
    first.start(1)
    server = first.server_pid()
    reads: list[object] = []
    real_lock_holder = local.lock_holder
    monkeypatch.setattr(local, "lock_holder",
                        lambda path: reads.append(path) or real_lock_holder(path))
    second = make_sandbox()
    assert second.start(2) is True and second.server_pid() == server and reads == []
    os.kill(server, signal.SIGSTOP)  # silent: does not answer the next ping
    try:
        third = make_sandbox(start_timeout_s=30)
        assert third.start(3) is False  # the silent one was ours: killed, a new one started
        assert reads and third.server_pid() != server and not pid_alive(server)
    finally:
        if pid_alive(server):
            os.kill(server, signal.SIGKILL)
