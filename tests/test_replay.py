"""Replaying a recorded session (``testing/replay.py``, ``trouper replay``): a real session
on a scripted model is recorded, its replies turned back into a script, and played again
in a fresh workspace: as recorded it does not diverge; in a workspace prepared otherwise
the first action whose outcome differs is named with both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState, Trouper
from trouper.messages.events import LLMCompleted, PromptCondensed
from trouper.testing import Script, ScriptError, load_script, replay_session
from trouper.testing.replay import normalise

from accel import forkserver

pytestmark = pytest.mark.slow  # real sessions

FINISH = {"tool": "finish", "args": {"message": "done"}}
STEPS: list[dict[str, Any]] = [
    {"tool": "run", "args": {"command": "echo hello > notes.txt"}, "say": "first a file"},
    {"tools": [{"tool": "run", "args": {"command": "cat notes.txt"}},
               {"tool": "think", "args": {"thought": "it holds hello"}}]},
    {"tool": "run", "args": {"command": "pwd"}},
    {"tool": "run", "args": {"command": "cat config.txt"}},
    {"say": "config.txt is missing; what now?"},
    {"tool": "run", "args": {"command": "echo later >> notes.txt && cat notes.txt"}},
    FINISH,
]
"""Seven model replies: two calls in one turn, a text reply that waits for the user, and
a ``cat`` of a file the recorded workspace did not have (action 4)."""
CAT_CONFIG = 4
"""The place of ``cat config.txt`` among the actions (``think`` counts as one)."""
LATER = "carry on: append a line"


def played(script: Script) -> list[tuple[tuple[tuple[str, str], ...], str | None]]:
    """Each step as the fake server serves it: its calls (name, arguments string), its text."""
    return [(tuple((c.tool, c.arguments) for c in step.calls), step.say)
            for step in script.steps]


def record(home: Path, workspace: Path, llm: dict[str, Any], later: str | None = None,
           **options: Any) -> str:
    """Run a session on the scripted ``llm`` to its end (sending ``later`` once it waits
    for the user); return its id."""
    with Trouper(home=home) as t:
        session = t.start_session("write notes", llm=llm, workspace=workspace, **options)
        state = session.wait(timeout=90)
        if later is not None:
            assert state == AgentState.AWAITING_USER_INPUT
            session.send(later)
            state = session.wait(timeout=90)
        assert state == AgentState.FINISHED
        return session.id


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A home holding the recorded session of ``STEPS`` (and its id)."""
    from trouper.testing import FakeLLMServer

    home = tmp_path_factory.mktemp("replay-home")
    with FakeLLMServer(load_script(STEPS)) as server:
        sid = record(home, home.parent / f"{home.name}-ws", server.llm(api_key="test-key"),
                     later=LATER)
    return home, sid


def test_from_session_gives_back_the_steps_that_were_played(recorded):
    home, sid = recorded
    with Trouper(home=home) as t:
        events = list(t.session(sid).events())
    assert sum(isinstance(e, LLMCompleted) for e in events) == len(STEPS)
    script = Script.from_session(events)
    assert played(script) == played(load_script(STEPS))
    last_call = max(i for i, e in enumerate(events) if isinstance(e, LLMCompleted))
    with pytest.raises(ScriptError, match="has no reply after it"):  # a log cut short
        Script.from_session(events[:last_call + 1])


def test_a_replay_in_a_workspace_like_the_original_does_not_diverge(recorded, tmp_path):
    home, sid = recorded
    with Trouper(home=home) as t:
        report = replay_session(t, sid, workspace=tmp_path / "fresh", timeout_s=120)
        replayed = list(t.session(report.replay_session_id).events())
    assert report.divergence is None and not report.diverged, report.text()
    assert report.settled and report.messages_sent == 1
    assert report.steps == len(STEPS)
    assert report.recorded_actions == report.replayed_actions == report.matched == 7
    assert report.recorded_state == report.replayed_state == "finished"
    assert (tmp_path / "fresh" / "notes.txt").read_text() == "hello\nlater\n"
    assert report.replay_session_id != sid
    assert any(getattr(e, "text", None) == LATER for e in replayed)  # sent again
    assert "no divergence" in report.text()


def test_a_workspace_prepared_otherwise_names_the_first_divergent_action(recorded, tmp_path):
    home, sid = recorded
    workspace = tmp_path / "prepared"
    workspace.mkdir()
    (workspace / "config.txt").write_text("mode = fast\n")
    with Trouper(home=home) as t:
        report = replay_session(t, sid, workspace=workspace, timeout_s=120)
    divergence = report.divergence
    assert divergence is not None, report.text()
    assert divergence.index == CAT_CONFIG == report.matched
    assert set(divergence.differs) == {"exit_code", "content"}
    recorded_side, replayed_side = divergence.recorded, divergence.replayed
    assert recorded_side is not None and replayed_side is not None
    for side in (recorded_side, replayed_side):
        assert side.tool == "run" and json.loads(side.arguments) == {"command": "cat config.txt"}
        assert side.index == CAT_CONFIG
    assert recorded_side.exit_code == 1 and "No such file" in (recorded_side.content or "")
    assert replayed_side.exit_code == 0 and replayed_side.content == "mode = fast\n"
    text = report.text()
    assert f"diverged at action {CAT_CONFIG}" in text
    assert f"seq {recorded_side.seq} in {sid}" in text
    assert f"seq {replayed_side.seq} in {report.replay_session_id}" in text
    assert "mode = fast" in text and "No such file" in text


def test_what_differs_between_runs_by_nature_is_normalised():
    text = "/w/s-1/ws/a took 12 s, then 0.3s and 40ms; see .trouper/outputs/act1.log (s-2)"
    assert normalise(text, ["/w/s-1/ws", "/w"], ["s-1", "s-2"], "act1") == (
        "<workspace>/a took <duration>, then <duration> and <duration>; see "
        ".trouper/outputs/<action>.log (<session>)")
    assert normalise("3 sheep in v1.5s", [], []) == "3 sheep in v1.5s"


def test_a_summarized_session_replays_aligned(tmp_path, scripted):
    summary = "SUMMARY: the agent printed four long lines (a to d); nothing failed."
    long_lines = [{"tool": "run", "args": {"command": f"yes {c} | head -c 3000"}}
                  for c in "abcd"]
    steps = [*long_lines, {"say": summary},
             {"tool": "run", "args": {"command": "yes e | head -c 3000"}}, FINISH]
    home = tmp_path / "home"
    options = {"condenser": "summarize", "summarize_at_tokens": 3000}
    server, llm = scripted(steps)
    sid = record(home, tmp_path / "ws", llm, **options)
    assert [i for i, r in enumerate(server.requests) if not (r.body or {}).get("tools")] == [4]
    with Trouper(home=home) as t:
        events = list(t.session(sid).events())
        assert played(Script.from_session(events)) == played(load_script(steps))
        report = replay_session(t, sid, workspace=tmp_path / "again", timeout_s=120)
        replayed = list(t.session(report.replay_session_id).events())
    assert report.divergence is None, report.text()
    assert report.matched == 6 and report.replayed_state == "finished"
    assert [e.summary for e in replayed if isinstance(e, PromptCondensed)] == [summary]


def trouper_cmd(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TROUPER_HOME": str(home), "COLUMNS": "200"}
    return forkserver.run([sys.executable, "-m", "trouper", *args], env=env, text=True,
                          capture_output=True, timeout=300, stdin=subprocess.DEVNULL)


def test_the_replay_command_prints_json_and_exits_by_what_it_found(recorded, tmp_path):
    home, sid = recorded
    same = trouper_cmd("replay", sid, "--json", "--workspace", str(tmp_path / "same"),
                       home=home)
    assert same.returncode == 0, same.stdout + same.stderr
    report = json.loads(same.stdout)
    assert report["session_id"] == sid and report["divergence"] is None
    assert report["matched"] == 7 and report["settled"] is True

    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "config.txt").write_text("mode = fast\n")
    other = trouper_cmd("replay", sid, "--json", "--workspace", str(prepared), home=home)
    assert other.returncode == 1, other.stdout + other.stderr
    divergence = json.loads(other.stdout)["divergence"]
    assert divergence["index"] == CAT_CONFIG
    assert divergence["recorded"]["exit_code"] == 1
    assert divergence["replayed"]["content"] == "mode = fast\n"

    text = trouper_cmd("replay", sid, "--workspace", str(tmp_path / "text"), home=home)
    assert text.returncode == 0 and "no divergence" in text.stdout, text.stdout + text.stderr

    unknown = trouper_cmd("replay", "s-nosuchsession", "--json", home=home)
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "s-nosuchsession" in unknown.stderr and unknown.stdout == ""
