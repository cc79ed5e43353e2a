"""The journal contract on ``RemoteSandbox`` against a real ``trouper runtime-server``,
and what the remote API adds: long commands polled, output by offset, a restarted server."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trouper.config.models import RemoteRuntime
from trouper.exceptions import StaleEpoch
from trouper.messages.actions import RunCommand
from trouper.runtimes import load_sandbox
from trouper.runtimes.remote import RemoteSandbox
from trouper.security.tls import default_ssl_context
from trouper.testing import wait_until
from trouper.testing.runtime_contract import LIMITS, SandboxContract

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

SESSION = "contract-1"


@pytest.fixture
def server(remote_server):
    return remote_server()


def make(server, tmp_path: Path, **options) -> RemoteSandbox:
    config = RemoteRuntime(url=server.url, token=server.token, ready_timeout_s=10)
    sandbox = load_sandbox(config, session_id=SESSION, workspace=tmp_path / "unused",
                           state_dir=tmp_path / "state", **options)
    assert isinstance(sandbox, RemoteSandbox)
    return sandbox


class TestRemoteContract(SandboxContract):
    @pytest.fixture
    def workspace(self, server) -> Path:
        return server.workspace(SESSION)

    @pytest.fixture
    def new_sandbox(self, server, tmp_path) -> Iterator[Callable[[], RemoteSandbox]]:
        made: list[RemoteSandbox] = []

        def new() -> RemoteSandbox:
            made.append(make(server, tmp_path))
            return made[-1]

        yield new
        for sandbox in reversed(made):
            sandbox.stop()


def test_a_long_command_is_started_then_polled_never_one_blocking_request(server, tmp_path):
    sandbox = make(server, tmp_path, poll_s=0.3)
    sandbox.start()
    outcome = sandbox.runtime.execute(
        "long", RunCommand(command="for i in 1 2 3 4; do echo $i; sleep 0.4; done"),
        **LIMITS)
    assert (outcome.status, outcome.exit_code) == ("ok", 0)
    assert outcome.content.split() == ["1", "2", "3", "4"]
    text, offset = sandbox.output("long")
    assert text.split() == ["1", "2", "3", "4"]
    rest, end = sandbox.output("long", offset=2)
    assert text[2:] == rest and end == offset
    sandbox.stop()


def test_the_stale_epoch_is_refused_with_409(server, tmp_path):
    import httpx

    first = make(server, tmp_path)
    first.start()
    second = make(server, tmp_path)
    second.start()
    reply = httpx.post(f"{server.url}/v1/sessions/{SESSION}/actions", trust_env=False,
                       verify=default_ssl_context(),
                       headers={"Authorization": f"Bearer {server.token}"},
                       json={"action_id": "x", "epoch": first.epoch, "timeout_s": 5,
                             "action": {"kind": "run", "command": "echo no >> ledger.txt"}})
    assert reply.status_code == 409 and reply.json()["error"] == "StaleEpoch"
    with pytest.raises(StaleEpoch):
        first.runtime.execute("y", RunCommand(command="echo no >> ledger.txt"), **LIMITS)
    assert not (server.workspace(SESSION) / "ledger.txt").exists()
    assert second.runtime.resolve("x").state == "absent"
    second.stop()


def health(server) -> dict:
    import httpx

    return httpx.get(f"{server.url}/v1/sessions/{SESSION}/health", trust_env=False,
                     verify=default_ssl_context(),
                     headers={"Authorization": f"Bearer {server.token}"}).json()


def session_members(leader: int) -> list[int]:
    """Live processes of the session ``leader`` leads (zombies are gone for good)."""
    from trouper.host.processes import pid_alive

    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) == leader and pid_alive(int(name)):
                    found.append(int(name))
            except OSError:
                continue
    return found


def test_a_server_killed_mid_action_tells_the_truth_after_its_restart(server, tmp_path):
    """Finished stays finished, the interrupted action is unknown (-> lost), nothing runs
    twice, and the shell the dead server left is gone."""
    workspace = server.workspace(SESSION)
    sandbox = make(server, tmp_path, poll_s=0.5)
    sandbox.start()
    done = sandbox.runtime.execute("done", RunCommand(command="echo zero >> ledger.txt"),
                                   **LIMITS)
    assert done.status == "ok"
    # its subshell ignores the SIGHUP a dying pty sends: only the next boot can stop it
    slow = RunCommand(command="touch started; (trap '' HUP; sleep 6; echo one >> ledger.txt)")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sandbox.runtime.execute("slow", slow, **LIMITS)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            errors.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    wait_until(lambda: (workspace / "started").exists(), 30, "the slow command to start")
    shell = health(server)["shell_pid"]
    assert session_members(shell)  # bash and its sleep
    server.kill()
    worker.join(30)
    assert errors and "cannot reach" in str(errors[0])
    server.start()
    assert session_members(shell) == []  # the new boot killed what the dead one left
    again = make(server, tmp_path)
    assert again.start() is False  # a new sandbox: the old shell died with its server
    assert again.runtime.resolve("done").outcome == done
    assert again.runtime.resolve("slow").state == "unknown"
    lost = again.runtime.execute("slow", slow, **LIMITS)
    assert lost.status == "lost"
    assert again.runtime.execute("after", RunCommand(command="true"), **LIMITS).status == "ok"
    assert (workspace / "ledger.txt").read_text() == "zero\n"
    again.stop()


def test_a_request_on_a_kept_alive_connection_takes_no_delayed_ack(server, tmp_path):
    """Headers and body leave in separate writes: without TCP_NODELAY on both ends every
    request on a reused connection waited ~40 ms for a delayed ACK."""
    import time

    sandbox = make(server, tmp_path)
    sandbox.start()
    took = []
    for _ in range(15):
        began = time.perf_counter()
        assert sandbox.alive().alive
        took.append(time.perf_counter() - began)
    assert sorted(took)[len(took) // 2] < 0.025, took
    sandbox.stop()


def test_an_idle_shell_is_closed_and_its_journal_kept(remote_server, tmp_path):
    server = remote_server("--idle-timeout-s", "0.5")
    sandbox = make(server, tmp_path)
    sandbox.start()
    done = sandbox.runtime.execute("a", RunCommand(command="echo kept"), **LIMITS)
    wait_until(lambda: not sandbox.running(), 30, "the idle shell to be closed")
    assert not sandbox.alive().alive
    again = make(server, tmp_path)
    assert again.start() is False and again.epoch == sandbox.epoch + 1
    assert again.runtime.resolve("a").outcome == done
    again.stop()


def test_a_refused_start_never_stops_the_newer_owners_sandbox(server, tmp_path):
    owner = make(server, tmp_path)
    owner.start(5)
    stale = make(server, tmp_path)
    with pytest.raises(StaleEpoch):
        stale.start(4)
    stale.stop()
    assert owner.alive().alive
    assert owner.runtime.execute("a", RunCommand(command="true"), **LIMITS).status == "ok"
    owner.stop()
    assert not owner.running()
