"""One face for every client, for real: the same small scenario through an embedded
``Trouper`` and through a daemon's client gives the same results, of the same types; a
followed stream ends soon after it is told to stop on both sides; and the CLI, which
picks its client once, does the same through the daemon as in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState, Trouper
from trouper.client.protocol import SessionHandle, TrouperClient
from trouper.client.store_reader import StoreReader
from trouper.exceptions import ConfigError, UnknownSession
from trouper.messages.events import StateChanged
from trouper.testing import FakeLLMServer, load_script, wait_until
from trouper.testing.daemon import running_daemon

from accel import forkserver

pytestmark = pytest.mark.slow  # an actor system and a daemon process

STEPS = [
    {"tool": "run", "args": {"command": "echo one > one.txt"}},
    {"say": "What next?"},
    {"tool": "finish", "args": {"message": "done"}},
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    # no heartbeat within a test: a followed stream that ends on stop does so by itself
    with running_daemon(tmp_path_factory.mktemp("face"),
                        env={"TROUPER_DAEMON_HEARTBEAT_S": "3600"}) as d:
        yield d


def llm_of(server: FakeLLMServer) -> dict[str, str]:
    return {"model": "hosted_vllm/scripted", "base_url": server.url, "api_key": "test-key"}


def scenario(client: TrouperClient, llm: dict[str, str], workspace: Path) -> dict[str, Any]:
    """Start, approve, answer and finish a session; what every call returned."""
    session = client.start_session("write one.txt", llm=llm, workspace=workspace,
                                   session_id="face-1", confirm="always")
    states = [session.wait(timeout=60)]
    waiting = session.awaiting_confirmation
    assert waiting is not None
    approved = session.approve(waiting.action_id)
    states.append(session.wait(timeout=60))
    sent = session.send("finish now")
    states.append(session.wait(timeout=60))
    events = list(session.events())
    info, view, again = session.info(), session.view(), client.session("face-1")
    summary = next(s for s in client.sessions() if s.id == "face-1")
    with pytest.raises(UnknownSession):
        client.session("face-none")
    with pytest.raises(ConfigError):
        client.sessions(state="sleeping")
    return {
        "types": [type(v).__name__ for v in (states[0], waiting, approved, events[0], info,
                                             summary, view)],
        "states": states,
        "state, fault, workspace": (session.state, session.fault,
                                    session.workspace == str(workspace.resolve())),
        "found again": (again.id, again.state, isinstance(again, type(session))),
        "waiting": (waiting.tool, waiting.arguments, waiting.source),
        # a command answers with the seq of the last event it appended
        "commands": [(type(e).__name__, e.kind) for e in events if e.seq in (approved, sent)],
        "log states": [e.state for e in events if isinstance(e, StateChanged)],
        "log kinds": sorted({e.kind for e in events}),
        "followed": [e.seq for e in session.events(follow=True)] == [e.seq for e in events],
        "since": [e.seq for e in session.events(approved)] == [
            e.seq for e in events if e.seq > approved],
        "info": info.model_dump(exclude={"created_at", "updated_at", "workspace", "config"}),
        "config": info.config.model_dump(exclude={"workspace": True, "llm": {"base_url"}}),
        "summary": summary.model_dump(exclude={"created_at", "updated_at", "workspace"}),
        "finished": [s.id for s in client.sessions(state=AgentState.FINISHED)],
        "view": (view.state, view.total_iterations, view.actions, view.outcomes,
                 view.last_seq == info.last_seq),
    }


def test_the_same_scenario_gives_the_same_results_embedded_and_through_a_daemon(
        daemon, tmp_path):
    results = {}
    with FakeLLMServer(load_script(STEPS)) as server, \
            Trouper(home=tmp_path / "home") as embedded:
        results["embedded"] = scenario(embedded, llm_of(server), tmp_path / "ws-e")
    with FakeLLMServer(load_script(STEPS)) as server:
        results["daemon"] = scenario(daemon.client(), llm_of(server), tmp_path / "ws-d")
    assert results["embedded"] == results["daemon"]
    got = results["daemon"]
    assert got["states"] == [AgentState.AWAITING_USER_CONFIRMATION,
                             AgentState.AWAITING_USER_INPUT, AgentState.FINISHED]
    assert got["types"] == ["AgentState", "ActionEvent", "int", "MessageEvent", "SessionInfo",
                            "SessionSummary", "SessionView"]
    assert got["commands"] == [("StateChanged", "state")] * 2  # each: RUNNING again
    assert got["followed"] and got["since"] and got["finished"] == ["face-1"]
    assert (tmp_path / "ws-e" / "one.txt").exists() and (tmp_path / "ws-d" / "one.txt").exists()


@pytest.mark.parametrize("side", ["embedded", "daemon"])
def test_stop_ends_a_quiet_followed_stream_on_both_sides(daemon, scripted, side):
    """Nothing comes (the session waits for input, the daemon sends no heartbeat): the
    stream ends because ``stop`` was set, not because something arrived."""
    _, llm = scripted([{"say": "Anything else?"}])
    started = daemon.client().start_session("ask", llm=llm)
    assert started.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
    with StoreReader(daemon.home) as reader:
        session: SessionHandle = reader.session(started.id) if side == "embedded" else started
        last = session.info().last_seq
        stop, first = threading.Event(), threading.Event()
        seen: list[int] = []

        def follow() -> None:
            for event in session.events(last - 1, follow=True, until_settled=False, stop=stop):
                seen.append(event.seq)
                first.set()

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        assert first.wait(30), "the last event of the backlog"
        stop.set()  # the follower waits for more by now: a read that nothing will end
        wait_until(lambda: not follower.is_alive(), 10,  # the stream's read timeout is 30 s
                   "the followed stream to end once stop was set")
    assert seen == [last]


def cli(daemon: Any, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TROUPER_HOME": str(daemon.home.root), "COLUMNS": "200"}
    return forkserver.run([sys.executable, "-m", "trouper", *args], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


def summary_rows(stdout: str) -> dict[str, str]:
    rows = stdout.split("── summary", 1)[1].strip().splitlines()
    return dict(line.split(None, 1) for line in rows)


def test_resume_approve_through_the_daemon_approves(daemon, scripted):
    """As it does in the command's own actor system (it used to resume instead)."""
    _, llm = scripted([{"tool": "run", "args": {"command": "echo approved"}},
                       {"tool": "finish", "args": {"message": "done"}}])
    session = daemon.client().start_session("approve me", llm=llm, confirm="always")
    assert session.wait(timeout=60) == AgentState.AWAITING_USER_CONFIRMATION
    resumed = cli(daemon, "resume", session.id, "--approve")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "user approved the action" in resumed.stdout
    rows = summary_rows(resumed.stdout)
    assert rows["state"] == "finished" and rows["session"] == session.id
    assert rows["steps"] == "2 model calls, 2 actions"


def test_run_daemon_gives_the_daemon_the_runtime_it_was_asked_for(daemon, tmp_path):
    """--runtime local --no-network reaches the daemon's session whole (it used to send
    the runtime's bare name)."""
    with FakeLLMServer(load_script([{"tool": "finish", "args": {"message": "ok"}}])) as server:
        ran = cli(daemon, "run", "cut off", "--daemon", "--no-network", "--model",
                  "hosted_vllm/scripted", "--base-url", server.url, "--api-key", "k",
                  "--workspace", str(tmp_path / "ws"))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    session_id = summary_rows(ran.stdout)["session"]
    runtime = daemon.client().session(session_id).info().config.runtime
    assert runtime.kind == "local" and runtime.network is False


def test_sessions_list_the_same_through_the_daemon_and_from_the_store(daemon, scripted):
    _, llm = scripted([{"say": "hi"}])
    daemon.client().start_session("listed", llm=llm).wait(timeout=60)
    through_daemon = cli(daemon, "sessions", "--json")
    assert through_daemon.returncode == 0, through_daemon.stderr
    with StoreReader(daemon.home) as reader:
        from_store = [json.dumps(s.to_json()) for s in reader.sessions()]
    assert through_daemon.stdout.splitlines() == from_store
    assert [s.to_json() for s in daemon.client().sessions()] == [
        json.loads(line) for line in from_store]
