"""The daemon process: killed mid-session and started again, stopped and started again,
never two on one home, and a port in use said plainly."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from trouper import AgentState
from trouper.client.daemon import parse_sse
from trouper.daemon.files import lock_is_held
from trouper.daemon.process import start as start_daemon
from trouper.daemon.server import DaemonError
from trouper.home.paths import Home
from trouper.messages.events import ActionEvent, ObservationEvent
from trouper.store import open_store
from trouper.testing import check_log, wait_until
from trouper.testing.daemon import TestDaemon, running_daemon

from accel import forkserver

pytestmark = pytest.mark.slow  # starts daemon processes

FINISH = {"tool": "finish", "args": {"message": "done"}}


def slow_steps(n: int, delay_s: float = 0.2) -> list[dict]:
    return [{"tool": "run", "args": {"command": f"echo step {i}"}, "delay_s": delay_s}
            for i in range(n)] + [FINISH]


def stored(home, sid):
    store = open_store(Home.at(home))
    try:
        return store.session(sid), store.read(sid)
    finally:
        store.close()


def test_sigkill_mid_session_then_start_again_finishes_it_exactly_once(tmp_path, scripted):
    _, llm = scripted(slow_steps(20))
    with running_daemon(tmp_path / "home") as daemon:
        session = daemon.client().start_session("count", llm=llm, max_iterations=100)
        followed: list = []
        stop = threading.Event()

        def follow() -> None:  # one client, following across the crash and the restart
            for event in daemon.client().session(session.id).events(follow=True, stop=stop):
                followed.append(event)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        wait_until(lambda: len(followed) >= 25, 60, "the session midway")
        daemon.kill()
        killed_at = len(followed)
        record, _ = stored(daemon.home.root, session.id)
        assert record.state == AgentState.RUNNING  # a crash changes nothing in the log
        daemon.start()  # same home, same port: it restores the session at once
        follower.join(timeout=120)
        stop.set()
        assert not follower.is_alive()
        assert daemon.client().session(session.id).wait(timeout=60) == AgentState.FINISHED
    record, log = stored(tmp_path / "home", session.id)
    assert check_log(log) == []  # seq contiguous, every action exactly one outcome
    actions = [e for e in log if isinstance(e, ActionEvent)]
    assert len(actions) == 21 and len([e for e in log if isinstance(e, ObservationEvent)]) == 21
    assert [e.seq for e in followed] == list(range(1, len(log) + 1))  # once each, in order
    assert followed == log and len(followed) > killed_at


def test_daemon_stop_leaves_sessions_resumable_and_start_carries_them_on(tmp_path, scripted):
    _, llm = scripted(slow_steps(12))
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        sid = daemon.client().start_session("count", llm=llm).id
        wait_until(lambda: daemon.client().session(sid).info().actions >= 3, 60, "3 actions")
        ends: list[dict] = []

        def listen() -> None:  # a live stream open while the daemon stops
            with daemon.http().stream("GET", f"/v1/sessions/{sid}/events/stream") as s:
                ends.extend(d for kind, d in parse_sse(s.iter_lines()) if kind == "end")

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        wait_until(lambda: daemon.http().get("/v1/health").json()["streams"] == 1, 30,
                   "the stream open")
        out = forkserver.run([sys.executable, "-m", "trouper", "daemon", "stop", "--home",
                              str(home)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "stopped" in out.stdout and not lock_is_held(daemon.files)
        assert not daemon.files.info.exists() and not daemon.files.pid.exists()
        record, log = stored(home, sid)
        assert record.state == AgentState.RUNNING  # not paused, stopped or failed
        assert log[-1].seq == record.last_seq
        listener.join(timeout=10)
        assert [e["reason"] for e in ends] == ["closing"]
        assert ends[0]["after"] <= record.last_seq
        daemon.start()
        assert daemon.client().session(sid).wait(timeout=120) == AgentState.FINISHED
    assert check_log(stored(home, sid)[1]) == []


def test_two_daemons_never_share_a_home(tmp_path):
    home = tmp_path / "home"
    with running_daemon(home) as first:
        with pytest.raises(DaemonError, match="already runs"):
            start_daemon(Home.at(home), port=0, timeout_s=60)
        # started by hand, past the check: the home's lock refuses it
        out = forkserver.run([sys.executable, "-m", "trouper", "daemon", "run", "--home",
                              str(home)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 3 and "already runs" in out.stderr
        assert first.http().get("/v1/health").json()["pid"] == first.pid
        assert first.files.info.exists() and first.files.pid.exists()  # left as they were
        other = TestDaemon(tmp_path / "other", port=first.port)  # a port in use
        with pytest.raises(DaemonError, match=f"127.0.0.1:{first.port}: in use"):
            other.start(timeout_s=60)
        assert not lock_is_held(other.files)


def test_status_says_whether_it_runs(tmp_path):
    home = tmp_path / "home"

    def status() -> subprocess.CompletedProcess:
        return forkserver.run([sys.executable, "-m", "trouper", "daemon", "status", "--home",
                               str(home)], capture_output=True, text=True, timeout=60)

    assert status().returncode == 1 and "not running" in status().stdout
    with running_daemon(home) as daemon:
        out = status()
        assert out.returncode == 0 and daemon.url in out.stdout
    assert status().returncode == 1


def test_a_command_sent_again_across_a_daemon_crash_is_carried_out_once(tmp_path, scripted):
    """Under the same Idempotency-Key, a message the killed daemon carried out is answered
    by the next one, not doubled; and a client's send made while the daemon is down is
    sent again until it is back, and carried out once."""
    _, llm = scripted([{"say": "What next?"}, {"say": "And?"}, {"say": "More?"}])
    with running_daemon(tmp_path / "home") as daemon:
        remote = daemon.client().start_session("t", llm=llm)
        assert remote.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        url, key = f"/v1/sessions/{remote.id}/messages", {"Idempotency-Key": "before-crash"}
        first = daemon.http().post(url, json={"text": "go on"}, headers=key)
        assert first.status_code == 200, first.text
        daemon.kill()
        answer: dict[str, object] = {}

        def send_while_down() -> None:
            try:
                answer["seq"] = daemon.client().session(remote.id).send("while down")
            except Exception as exc:  # noqa: BLE001 - the test reports it
                answer["error"] = exc

        sender = threading.Thread(target=send_while_down)
        sender.start()
        daemon.start()
        again = daemon.http().post(url, json={"text": "go on"}, headers=key)
        assert again.status_code == 200, again.text
        sender.join(60)
        assert isinstance(answer.get("seq"), int), answer
        said = [e for e in daemon.client().session(remote.id).events()
                if e.kind == "message" and e.source == "user"]
        assert sorted(e.text for e in said) == sorted(["t", "go on", "while down"])
        assert [e.seq for e in said if e.text == "go on"] == [again.json()["seq"]]
