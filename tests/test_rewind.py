"""Rewinding a session: a fork that takes the original's place in the list of sessions.
The original is stopped if it is still working and left out of the lists, but its log and
files stay as they were and it still opens by its id; embedded, through the daemon (HTTP
and its client) and by the CLI, with and without a daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_fork import FINISH, STEPS, files, outcome_seq

from trouper import AgentState, Trouper
from trouper.client.store_reader import StoreReader
from trouper.exceptions import InvalidRequest
from trouper.messages.events import SessionForked
from trouper.store.base import REPLACES
from trouper.testing import wait_until

pytestmark = pytest.mark.slow  # real sessions

SLOW = {"tool": "run", "args": {"command": "touch started; sleep 60"}}
"""A command still running when the test rewinds its session (a stop interrupts it)."""


def test_a_rewind_takes_the_place_of_a_finished_session_and_leaves_it_as_it_was(
        tmp_path, scripted):
    _, llm = scripted(STEPS)
    ws, home = tmp_path / "ws", tmp_path / "home"
    with Trouper(home=home) as t:
        original = t.start_session("write files", llm=llm, workspace=ws)
        assert original.wait(timeout=60) == AgentState.FINISHED
        before = list(original.events())
        at = outcome_seq(before, 2)  # after b.txt, before a.txt's rewrite
        with pytest.raises(InvalidRequest, match="cannot fork at 10000"):
            t.rewind(original.id, at_seq=10_000)
        assert [s.id for s in t.sessions()] == [original.id]  # a refused rewind: no trace
        rewound = t.rewind(original.id, at_seq=at)
        assert [s.id for s in t.sessions()] == [rewound.id]
        assert t.sessions(state=AgentState.FINISHED) == []
        assert {s.id: s.replaced_by for s in t.sessions(replaced=True)} == {
            rewound.id: None, original.id: rewound.id}
        assert rewound.info().state == AgentState.PAUSED
        assert files(Path(rewound.workspace)) == {"a.txt": "one\n", "b.txt": "two\n"}
        [mark] = [e for e in rewound.events() if isinstance(e, SessionForked)]
        assert (mark.from_session, mark.at_seq) == (original.id, at)
        assert t.store.get_meta(rewound.id, REPLACES) == original.id
        again = t.session(original.id)  # still opened by its id, as it was
        assert list(again.events()) == before and again.state == AgentState.FINISHED
        assert again.info().replaced_by == rewound.id
        assert files(ws) == {"a.txt": "three\n", "b.txt": "two\n"}
    with Trouper(home=home) as t:  # the place is the store's: it outlives the program
        assert [s.id for s in t.sessions()] == [rewound.id]


def test_a_rewind_of_a_running_session_stops_it_and_takes_its_place(tmp_path, scripted):
    _, llm = scripted([STEPS[0], SLOW, FINISH])
    ws = tmp_path / "ws"
    with Trouper(home=tmp_path / "home") as t:
        original = t.start_session("slowly", llm=llm, workspace=ws)
        wait_until(lambda: (ws / "started").exists(), 60, "the slow command")
        at = outcome_seq(list(original.events()), 1)
        rewound = t.rewind(original.id, at_seq=at)
        assert original.state == AgentState.STOPPED  # the stop returned once recorded
        assert original.info().replaced_by == rewound.id
        assert [s.id for s in t.sessions()] == [rewound.id]
        assert rewound.info().state == AgentState.PAUSED
        assert files(Path(rewound.workspace)) == {"a.txt": "one\n"}
        assert not (Path(rewound.workspace) / "started").exists()


def test_a_rewind_through_the_daemon_by_http_and_by_its_client(tmp_path, scripted):
    from trouper.testing.daemon import running_daemon

    _, llm = scripted(STEPS)
    with running_daemon(tmp_path / "dhome") as daemon:
        client, http = daemon.client(), daemon.http()
        original = client.start_session("write files", llm=llm, workspace=tmp_path / "ws")
        assert original.wait(timeout=60) == AgentState.FINISHED
        at = outcome_seq(list(original.events()), 2)
        refused = http.post(f"/v1/sessions/{original.id}/rewind", json={"at_seq": 10_000})
        assert refused.status_code == 409 and "cannot fork at 10000" in refused.text
        answer = http.post(f"/v1/sessions/{original.id}/rewind", json={"at_seq": at})
        assert answer.status_code == 201, answer.text
        made = answer.json()
        assert made["session_id"] == made["id"] and made["state"] == "paused"
        assert files(Path(made["workspace"])) == {"a.txt": "one\n", "b.txt": "two\n"}
        listed = http.get("/v1/sessions").json()["sessions"]
        assert [row["id"] for row in listed] == [made["id"]]
        every = http.get("/v1/sessions", params={"replaced": "true"}).json()["sessions"]
        assert {row["id"]: row["replaced_by"] for row in every} == {
            made["id"]: None, original.id: made["id"]}
        detail = http.get(f"/v1/sessions/{original.id}").json()
        assert detail["replaced_by"] == made["id"] and detail["state"] == "finished"
        assert http.get("/v1/health").json()["sessions"] == 2  # every session is counted
        _, again = scripted([*STEPS[:2], {"tool": "run", "args": {
            "command": "cat a.txt b.txt > c.txt"}}, FINISH])
        second = client.rewind(made["id"], at, "join them", llm=again)  # a rewind's rewind
        assert second.wait(timeout=60) == AgentState.FINISHED
        assert files(Path(second.info().workspace))["c.txt"] == "one\ntwo\n"
        assert [s.id for s in client.sessions()] == [second.id]
        assert {s.id: s.replaced_by for s in client.sessions(replaced=True)} == {
            second.id: None, made["id"]: second.id, original.id: made["id"]}


def _trouper(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TROUPER_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "trouper", *args], env=env, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def test_trouper_rewind_replaces_the_session_in_trouper_sessions(tmp_path):
    from trouper.testing import FakeLLMServer, load_script

    home = tmp_path / "home"
    script = tmp_path / "script.json"
    script.write_text(json.dumps(STEPS))
    with FakeLLMServer(load_script(script)) as server:
        first = _trouper(home, "run", "write files", "--model", "hosted_vllm/x",
                         "--base-url", server.url, "--api-key", "k",
                         "--workspace", str(tmp_path / "ws"))
        assert first.returncode == 0, first.stdout + first.stderr
    original = _trouper(home, "sessions").stdout.split()[0]
    with Trouper(home=home) as t:
        at = outcome_seq(list(t.session(original).events()), 2)
    rewound = _trouper(home, "rewind", original, "--at", str(at))
    assert rewound.returncode == 0, rewound.stdout + rewound.stderr
    assert f"{original} rewound at event {at} as " in rewound.stdout
    assert "after action" in rewound.stdout and f"{original} is replaced" in rewound.stdout
    listed = _trouper(home, "sessions").stdout.splitlines()
    assert len(listed) == 1 and original not in listed[0]
    new = listed[0].split()[0]
    every = _trouper(home, "sessions", "--all").stdout.splitlines()
    assert [line.split()[0] for line in every] == [new, original]
    assert every[1].endswith(f"(replaced by {new})")
    rows = [json.loads(line) for line in _trouper(home, "sessions", "--all", "--json")
            .stdout.splitlines()]
    assert [(row["id"], row["replaced_by"]) for row in rows] == [(new, None), (original, new)]
    assert files(tmp_path / "ws") == {"a.txt": "three\n", "b.txt": "two\n"}  # untouched


def test_trouper_rewind_without_a_daemon_stops_a_session_left_working(tmp_path, scripted):
    _, llm = scripted([STEPS[0], SLOW, FINISH])
    ws, home = tmp_path / "ws", tmp_path / "home"
    with Trouper(home=home) as t:
        original = t.start_session("slowly", llm=llm, workspace=ws)
        wait_until(lambda: (ws / "started").exists(), 60, "the slow command")
        at = outcome_seq(list(original.events()), 1)
        # its actors gone and its command left running: the store says RUNNING (a
        # stopped sandbox would end the command, and the session would carry on)
        t.close(stop_sandboxes=False)
    with StoreReader(home) as reader:
        assert reader.session(original.id).state == AgentState.RUNNING
    rewound = _trouper(home, "rewind", original.id, "--at", str(at))
    assert rewound.returncode == 0, rewound.stdout + rewound.stderr
    assert f"{original.id} was stopped and is replaced" in rewound.stdout
    with Trouper(home=home, resume=False) as t:
        assert t.session(original.id).state == AgentState.STOPPED
        [shown] = t.sessions()
        assert shown.id != original.id and shown.state == AgentState.PAUSED
        assert t.session(original.id).info().replaced_by == shown.id
