"""``trouper top``: one row a session (state, model calls, cost, last action, time in its
state, sandbox restarts), from the store when no daemon runs and through the daemon when
one does, the same rows either way; ``--once`` as plain text, ``--json`` an object a
session."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from trouper.cli.main import main
from trouper.cli.top import Top, duration
from trouper.client.store_reader import StoreReader
from trouper.config.models import LLMConfig, SessionConfig
from trouper.home.paths import Home
from trouper.messages.actions import Finish, RunCommand
from trouper.messages.events import (
    ActionEvent,
    AgentState,
    LLMCompleted,
    MessageEvent,
    ObservationEvent,
    RuntimeEvent,
    StateChanged,
)
from trouper.messages.outcomes import Outcome
from trouper.store import open_store
from trouper.testing.daemon import running_daemon

PAUSED_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def action(action_id: str, act: Any) -> ActionEvent:
    return ActionEvent(action_id=action_id, turn_id=f"t-{action_id}",
                       tool_call_id=f"c-{action_id}", tool=act.kind, arguments="{}",
                       action=act)


def llm_call(cost: float) -> LLMCompleted:
    return LLMCompleted(request_id="r", model="x", cost_usd=cost)


def stored_home(home: Path) -> None:
    """A finished session (two calls, a run then a finish, its sandbox restarted twice)
    and a paused one (one call, one run), nothing driving either."""
    store = open_store(Home.at(home))
    try:
        for sid, task in (("s-finished", "build it"), ("s-paused", "wait")):
            store.create_session(sid, SessionConfig(task=task, workspace=str(home / sid),
                                                    llm=LLMConfig(model="hosted_vllm/x")))
        store.append("s-finished", [
            MessageEvent(source="user", text="build it"), StateChanged(state=AgentState.RUNNING),
            llm_call(0.25), action("a1", RunCommand(command="make all")),
            RuntimeEvent(phase="restarted", epoch=2), RuntimeEvent(phase="restarted", epoch=3),
            ObservationEvent(action_id="a1", outcome=Outcome(status="ok", content="ok")),
            llm_call(0.5), action("a2", Finish(message="built")),
            StateChanged(state=AgentState.FINISHED)])
        store.append("s-paused", [
            MessageEvent(source="user", text="wait"), StateChanged(state=AgentState.RUNNING),
            llm_call(0.125), action("b1", RunCommand(command="sleep 1000")),
            StateChanged(state=AgentState.PAUSED, ts=PAUSED_AT)])
    finally:
        store.close()


def top_json(home: Path) -> dict[str, dict[str, Any]]:
    result = CliRunner().invoke(main, ["top", "--json", "--home", str(home)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    return {row["id"]: row for row in rows}


def test_json_rows_of_a_home_without_a_daemon(tmp_path):
    home = tmp_path / "home"
    stored_home(home)
    rows = top_json(home)
    assert list(rows) == ["s-paused", "s-finished"]  # newest first
    paused, finished = rows["s-paused"], rows["s-finished"]
    assert finished["state"] == "finished" and finished["task"] == "build it"
    assert (finished["iterations"], finished["cost_usd"], finished["restarts"]) == (2, 0.75, 2)
    assert finished["last_action"] == {"tool": "finish", "summary": "finish"}
    assert paused["state"] == "paused" and paused["restarts"] == 0
    assert (paused["iterations"], paused["cost_usd"]) == (1, 0.125)
    assert paused["last_action"] == {"tool": "run", "summary": "run: sleep 1000"}
    assert datetime.fromisoformat(paused["state_since"]) == PAUSED_AT
    in_state = datetime.now(UTC) - PAUSED_AT
    assert abs(paused["in_state_s"] - in_state.total_seconds()) < 60


def test_once_prints_one_plain_table(tmp_path):
    home = tmp_path / "home"
    stored_home(home)
    for args in (["top", "--once"], ["top"]):  # not a terminal: once, whatever the flags
        result = CliRunner().invoke(main, [*args, "--home", str(home)])
        assert result.exit_code == 0, result.output
        header, *lines = result.output.splitlines()
        assert header.split() == ["SESSION", "STATE", "STEP", "COST", "IN", "STATE",
                                  "RESTARTS", "LAST", "ACTION"]
        assert "\x1b[" not in result.output  # plain: no terminal codes
        assert [line.split()[:4] for line in lines] == [
            ["s-paused", "paused", "1", "$0.1250"], ["s-finished", "finished", "2", "$0.7500"]]
        assert lines[0].endswith("run: sleep 1000") and lines[1].split()[5:] == ["2", "finish"]


def test_a_refresh_folds_only_what_was_appended_since(tmp_path):
    home = tmp_path / "home"
    stored_home(home)
    with StoreReader(Home.at(home)) as client:
        top = Top(client, Home.at(home))
        before = {row.id: row for row in top.refresh()}
        assert before["s-paused"].state == "paused"
        store = open_store(Home.at(home))
        try:
            store.append("s-paused", [StateChanged(state=AgentState.RUNNING), llm_call(1.0),
                                      action("b2", RunCommand(command="echo on"))])
        finally:
            store.close()
        after = {row.id: row for row in top.refresh()}
    row = after["s-paused"]
    assert (row.state, row.iterations, row.cost_usd) == ("running", 2, 1.125)
    assert (row.last_tool, row.last_summary) == ("run", "run: echo on")
    assert row.state_since > PAUSED_AT
    unchanged = after["s-finished"]  # its log did not grow: the same row, a later clock
    assert unchanged == replace(before["s-finished"], in_state_s=unchanged.in_state_s)


def test_durations_read_at_a_glance():
    assert [duration(s) for s in (0, 59.9, 60, 184, 3600 + 300, 86400 * 3 + 4 * 3600)] == [
        "0s", "59s", "1m00s", "3m04s", "1h05m", "3d04h"]


@pytest.mark.slow
def test_through_a_daemon_the_same_rows_and_a_live_session(tmp_path, scripted):
    home = tmp_path / "home"
    stored_home(home)
    alone = top_json(home)
    _, llm = scripted([{"tool": "run", "args": {"command": "echo hi"}},
                       {"tool": "finish", "args": {"message": "done"}}])
    with running_daemon(home) as daemon:
        session = daemon.client().start_session("say hi", llm=llm, workspace=tmp_path / "ws")
        assert session.wait(timeout=90) == AgentState.FINISHED
        through = top_json(home)
    live = through.pop(session.id)
    assert (live["state"], live["iterations"], live["restarts"]) == ("finished", 2, 0)
    assert live["last_action"] == {"tool": "finish", "summary": "finish"}
    assert live["task"] == "say hi"

    def steady(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {sid: {k: v for k, v in row.items() if k != "in_state_s"}
                for sid, row in rows.items()}

    assert steady(through) == steady(alone)
    assert timedelta(seconds=through["s-paused"]["in_state_s"]) >= timedelta(
        seconds=alone["s-paused"]["in_state_s"])
