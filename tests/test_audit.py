"""The audit trail of a session's actions (``client/audit.py``, docs/audit.md): derived from
hand-built logs (a restart's two attempts, a rejection, a loss, a setup step, actions in
flight), the outcome naming the epoch and the sandbox process that ran it, and from a real
session whose RuntimeProxy is SIGKILLed mid-command; then its faces: the daemon's
``GET /v1/sessions/{id}/actions`` and ``trouper audit --json``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from trouper.agent.prompt import render_outcome
from trouper.cli.main import main
from trouper.client.audit import audit
from trouper.messages.actions import Finish, RunCommand, Think, WriteFile
from trouper.messages.events import (
    ActionEvent,
    AgentState,
    ConfirmationEvent,
    Event,
    ObservationEvent,
    RuntimeEvent,
    StateChanged,
)
from trouper.messages.outcomes import Outcome
from trouper.runtimes.action_calls import ActionCalls
from trouper.testing import check_log, kill_actor, sandbox_pid, wait_until
from trouper.testing.daemon import running_daemon

FINISH = {"tool": "finish", "args": {"message": "done"}}
SLOW_LEDGER = "touch started; sleep 1.5; echo one >> ledger.txt"
SECRET = "s3cret-value-never-shown"


def numbered(*events: Event) -> list[Event]:
    """The events with the seqs a store would give them (1, 2, ...)."""
    return [e.model_copy(update={"seq": n}) for n, e in enumerate(events, 1)]


def act(action_id: str, action: Any = None, source: str = "agent", tool: str = "run",
        turn_id: str = "t1") -> ActionEvent:
    return ActionEvent(action_id=action_id, turn_id=turn_id, tool_call_id=f"c-{action_id}",
                       tool=tool, arguments="{}", action=action, source=source)  # type: ignore[arg-type]


def observed(action_id: str, **outcome: Any) -> ObservationEvent:
    outcome.setdefault("content", "")
    return ObservationEvent(action_id=action_id, outcome=Outcome(**outcome))


# -- the derivation, on hand-built logs ----------------------------------------------------

def test_an_action_resolved_after_a_runtime_restart_shows_two_attempts_under_two_epochs():
    log = numbered(
        RuntimeEvent(phase="started", epoch=1),
        act("a1", RunCommand(command="make test")),
        RuntimeEvent(phase="failed", epoch=1, detail="exited (SIGKILL)"),
        StateChanged(state=AgentState.ERROR),
        RuntimeEvent(phase="attached", epoch=2),
        StateChanged(state=AgentState.RUNNING),
        observed("a1", status="ok", content="x" * 10, exit_code=0, elided_chars=5,
                 duration_s=1.5, checkpoint="a1", epoch=1, server_pid=4242, boot_id="b-1"),
    )
    entry, = audit(log)
    assert (entry.seq, entry.outcome_seq, entry.status, entry.cause) == (2, 7, "ok", "ran")
    assert [(a.kind, a.epoch) for a in entry.attempts] == [("dispatch", 1), ("resolve", 2)]
    first, again = entry.attempts
    assert first.started_it and first.server == "pid 4242, boot b-1"
    assert not again.started_it and again.after_seq == 5
    assert again.why == ("the sandbox failed (exited (SIGKILL)), then a sandbox attached: "
                         "its journal asked")
    assert (entry.summary, entry.asked_by, entry.kind) == ("$ make test", "the model", "run")
    assert (entry.output_chars, entry.checkpoint, entry.duration_s) == (15, "a1", 1.5)
    assert (entry.epoch, entry.server_pid, entry.boot_id) == (1, 4242, "b-1")


def test_a_rejected_action_was_never_sent_and_says_by_whom():
    log = numbered(
        RuntimeEvent(phase="started", epoch=1),
        act("a1", RunCommand(command="rm -rf build")),
        StateChanged(state=AgentState.AWAITING_USER_CONFIRMATION),
        ConfirmationEvent(action_id="a1", approved=False, reason="not now"),
        observed("a1", status="rejected", content="The user rejected this action: not now"),
        act("a2", None, tool="nonsense", turn_id="t2"),
        observed("a2", status="rejected", content="The call to 'nonsense' was malformed."),
    )
    by_user, malformed = audit(log)
    assert by_user.attempts == () and by_user.cause == "rejected by the user: not now"
    assert malformed.attempts == () and malformed.kind is None
    assert malformed.cause.startswith("malformed call, not run")


def test_an_approved_action_is_sent_after_its_approval_and_one_waiting_is_not_sent():
    log = numbered(
        RuntimeEvent(phase="started", epoch=1),
        act("a1", RunCommand(command="echo ok")),
        StateChanged(state=AgentState.AWAITING_USER_CONFIRMATION),
        ConfirmationEvent(action_id="a1", approved=True),
        observed("a1", status="ok", content="ok\n", exit_code=0, epoch=1),
        act("a2", RunCommand(command="echo more"), turn_id="t2"),
        StateChanged(state=AgentState.AWAITING_USER_CONFIRMATION),
        StateChanged(state=AgentState.PAUSED),  # paused while it waits: still not sent
    )
    approved, waiting = audit(log)
    assert [(a.kind, a.epoch, a.after_seq) for a in approved.attempts] == [("dispatch", 1, 4)]
    assert waiting.status is None and waiting.attempts == ()
    assert waiting.cause == "waiting for the user's approval"


def test_a_lost_action_names_the_sandbox_it_was_lost_with():
    log = numbered(
        RuntimeEvent(phase="started", epoch=1),
        act("a1", RunCommand(command="sleep 30")),
        RuntimeEvent(phase="failed", epoch=1, detail="the sandbox server exited"),
        RuntimeEvent(phase="started", epoch=2),
        observed("a1", status="lost", content="This action's result is unknown: ..."),
    )
    entry, = audit(log)
    assert [a.epoch for a in entry.attempts] == [1, 2]
    assert entry.cause == ("lost with its sandbox (epoch 1: the sandbox server exited); "
                           "not run again")


def test_a_setup_step_is_asked_by_the_environment_and_sent_once_the_sandbox_started():
    log = numbered(
        act("s1", RunCommand(command="pip install -e ."), source="environment",
            turn_id="setup"),
        RuntimeEvent(phase="started", epoch=1),
        observed("s1", status="ok", content="", exit_code=3, epoch=1),
    )
    entry, = audit(log)
    assert (entry.source, entry.asked_by, entry.cause) == ("environment", "setup",
                                                           "ran with exit 3")
    attempt, = entry.attempts
    assert (attempt.kind, attempt.epoch, attempt.after_seq) == ("dispatch", 1, 2)
    assert attempt.started_it and attempt.server is None  # the outcome named no process


def test_actions_in_flight_and_queued_have_no_outcome_and_say_so():
    log = numbered(
        RuntimeEvent(phase="started", epoch=1),
        act("a1", RunCommand(command="sleep 9")),
        act("a2", WriteFile(path="a.txt", content="A")),
    )
    running, queued = audit(log)
    assert (running.status, running.outcome_seq, running.cause) == (None, None, "in flight")
    assert [a.epoch for a in running.attempts] == [1]
    assert queued.attempts == () and queued.cause.startswith("waiting: an earlier action")


def test_the_session_s_own_answers_timeouts_and_not_run_actions_have_their_causes():
    log = numbered(
        RuntimeEvent(phase="started", epoch=1),
        act("a1", Think(thought="hmm"), tool="think"),
        observed("a1", status="ok", content="Thought recorded."),
        act("a2", RunCommand(command="sleep 999")),
        observed("a2", status="error", content="killed", timed_out="hard", epoch=1),
        act("a3", Finish(message="done"), tool="finish", turn_id="t3"),
        act("a4", RunCommand(command="ls"), turn_id="t3"),
        observed("a3", status="ok", content="done"),
        observed("a4", status="rejected",
                 content="Not run: the agent finished before this action."),
    )
    think, hard, finish, after = audit(log)
    assert think.attempts == () and think.cause.startswith("answered by the session")
    assert hard.cause == "timed out hard: it was killed" and len(hard.attempts) == 1
    assert finish.summary == "finish"
    assert after.attempts == ()
    assert after.cause == "Not run: the agent finished before this action."


def test_who_ran_it_never_reaches_the_prompt():
    plain = Outcome(status="lost", content="unknown")
    named = plain.model_copy(update={"epoch": 3, "server_pid": 77, "boot_id": "b"})
    assert render_outcome(named) == render_outcome(plain)


class OneRecord(ActionCalls):
    """A transport whose server answers one journal record."""

    where, epoch, poll_s, request_timeout_s = "a scripted sandbox", 5, 1.0, 1.0

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def _send_action(self, body: dict[str, Any], *, timeout_s: float,
                     operation: str) -> dict[str, Any]:
        return self.record

    def _fetch_record(self, action_id: str, wait_s: float, *, timeout_s: float,
                      operation: str) -> dict[str, Any]:
        return self.record


def test_the_client_names_the_epoch_of_the_journal_record_in_the_outcome():
    record = {"action_id": "a1", "state": "finished", "epoch": 4,
              "outcome": {"status": "ok", "content": "", "server_pid": 9, "boot_id": "b9"}}
    outcome = OneRecord(record).execute("a1", RunCommand(command="true"), timeout_s=5,
                                        no_output_timeout_s=5)
    assert (outcome.epoch, outcome.server_pid, outcome.boot_id) == (4, 9, "b9")
    legacy = {"action_id": "a1", "state": "finished", "outcome": {"status": "ok", "content": ""}}
    assert OneRecord(legacy).resolve("a1").outcome.epoch is None  # type: ignore[union-attr]


# -- a real session ----------------------------------------------------------------------

@pytest.mark.slow
def test_a_runtime_proxy_killed_mid_command_shows_two_attempts_and_one_outcome(
        trouper, trouper_home, scripted, tmp_path):
    _, llm = scripted([{"tool": "run", "args": {"command": SLOW_LEDGER}},
                       {"tool": "write_file", "args": {"path": "b.txt", "content": "B"}},
                       FINISH])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path)
    wait_until(lambda: (tmp_path / "started").exists(), 30, "the slow command to start")
    server = sandbox_pid(session)
    kill_actor(session, "runtime")  # SIGKILL; the sandbox server and its shell live on
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (tmp_path / "ledger.txt").read_text() == "one\n"  # run once
    log = list(session.events())
    assert check_log(log) == []
    slow, write, finish = audit(log)
    assert slow.status == "ok" and slow.cause == "ran" and slow.summary == f"$ {SLOW_LEDGER}"
    epochs = [a.epoch for a in slow.attempts]
    assert [a.kind for a in slow.attempts] == ["dispatch", "resolve"]
    assert len(set(epochs)) == 2 and epochs[1] > epochs[0]  # type: ignore[operator]
    assert [a.started_it for a in slow.attempts] == [True, False]
    assert slow.epoch == epochs[0] and slow.server_pid == server
    assert slow.attempts[0].server == f"pid {server}, boot {slow.boot_id}"
    assert sum(isinstance(e, ObservationEvent) and e.action_id == slow.action_id
               for e in log) == 1  # one outcome
    assert [a.epoch for a in write.attempts] == [epochs[1]]  # sent to the new proxy
    assert write.checkpoint == write.action_id and write.output_chars
    assert finish.attempts == ()

    cli = CliRunner().invoke(main, ["audit", session.id, "--json", "--home", str(trouper_home)])
    assert cli.exit_code == 0, cli.output
    shown = json.loads(cli.stdout)["actions"]
    assert shown == [entry.model_dump(mode="json") for entry in (slow, write, finish)]
    text = CliRunner().invoke(main, ["audit", session.id, "--home", str(trouper_home)])
    assert text.exit_code == 0, text.output
    assert f"attempt 2: resolve under epoch {epochs[1]}" in text.stdout


def test_the_cli_says_an_unknown_session_is_unknown(tmp_path):
    result = CliRunner().invoke(main, ["audit", "s-nope", "--home", str(tmp_path)])
    assert result.exit_code != 0 and "s-nope" in result.stderr


@pytest.mark.slow
def test_the_daemon_answers_the_audit_masked(tmp_path_factory, scripted, tmp_path):
    _, llm = scripted([{"tool": "run", "args": {"command": f"echo {SECRET} > out.txt"}},
                       FINISH])
    with running_daemon(tmp_path_factory.mktemp("ahome")) as daemon:
        http = daemon.http()
        made = http.post("/v1/sessions", json={
            "task": "write it", "llm": llm, "workspace": str(tmp_path),
            "secrets": {"MY_SECRET": SECRET}})
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
        assert daemon.client().session(sid).wait(timeout=60) == AgentState.FINISHED
        answer = http.get(f"/v1/sessions/{sid}/actions")
        assert answer.status_code == 200, answer.text
        assert SECRET not in answer.text
        run, finish = answer.json()["actions"]
        assert (run["tool"], run["status"], run["cause"], run["asked_by"]) == (
            "run", "ok", "ran", "the model")
        assert len(run["attempts"]) == 1 and run["attempts"][0]["started_it"]
        assert run["checkpoint"] == run["action_id"] and run["server_pid"] != os.getpid()
        assert finish["attempts"] == [] and finish["outcome_seq"] > run["outcome_seq"]
        missing = http.get("/v1/sessions/s-nope/actions")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "unknown_session"


def test_the_page_sets_the_actions_view_as_text_and_forks_by_the_contract():
    page = Path(__file__).resolve().parent.parent / "daemon" / "page"
    script = (page / "changes.js").read_text()  # a public file: the view needs no other
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script
    assert '"/fork"' in script and "at_seq: atSeq" in script
    assert 'id="tab-actions"' in (page / "index.html").read_text()


@pytest.mark.slow
def test_the_page_lists_the_audit_and_forks_from_an_action_s_outcome(
        tmp_path_factory, scripted, tmp_path):
    """Headless Chromium as in tests/test_daemon_page.py; the fork route is another part's,
    so its answer is mocked here: the page must POST the contract and go to the new session."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    from playwright.sync_api import expect
    from test_daemon_page import CHROMIUM, browser_required

    if not os.access(CHROMIUM, os.X_OK):
        if browser_required():
            pytest.fail(f"the browser test must run here: {CHROMIUM} is missing")
        pytest.skip(f"{CHROMIUM} is missing (bash scripts/browser installs it)")
    _, llm = scripted([{"tool": "write_file", "args": {"path": "a.txt", "content": "A"}},
                       {"tool": "think", "args": {"thought": "hmm"}}, FINISH])
    with running_daemon(tmp_path_factory.mktemp("phome")) as daemon, sync_playwright() as pw:
        client = daemon.client()
        session = client.start_session("write a.txt", llm=llm, workspace=tmp_path)
        other = client.start_session("the fork, as if", llm=llm, workspace=tmp_path / "o")
        assert session.wait(timeout=60) == AgentState.FINISHED
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            forks: list[dict[str, Any]] = []

            def answer_fork(route: Any) -> None:
                forks.append(json.loads(route.request.post_data or "{}"))
                route.fulfill(status=201, content_type="application/json",
                              body=json.dumps({"session_id": other.id}))

            page.route(f"**/v1/sessions/{session.id}/fork", answer_fork)
            page.on("dialog", lambda dialog: dialog.accept("try it another way"))
            page.goto(f"{daemon.url}/#token={daemon.token}")
            page.locator(f"#sessions li[data-id='{session.id}']").click(timeout=60_000)
            page.click("#tab-actions")
            rows = page.locator("#actions-list li.audit")
            expect(rows).to_have_count(3, timeout=60_000)
            write = rows.first
            expect(write).to_contain_text("write_file a.txt")
            expect(write.locator(".attempt")).to_have_count(1)
            expect(write.locator(".attempt")).to_contain_text("dispatch under epoch")
            expect(write.locator(".outcome")).to_contain_text("ok: ran")
            expect(rows.nth(1).locator("button.fork")).to_have_count(0)  # no checkpoint
            audit_row = daemon.http().get(f"/v1/sessions/{session.id}/actions").json()
            at_seq = audit_row["actions"][0]["outcome_seq"]
            write.locator("button.fork").click()
            expect(page.locator("#session-id")).to_have_text(other.id, timeout=60_000)
            assert forks == [{"at_seq": at_seq, "message": "try it another way"}]
            assert errors == []
        finally:
            browser.close()
