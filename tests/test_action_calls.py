"""The sandbox clients' shared core (``runtimes/action_calls.py``) on a scripted journal and
a fake clock, and the one failure table (``runtimes/call_failures.py``) both clients
raise through: every rule in milliseconds, then both real clients against one scripted
HTTP server to show they answer alike."""

from __future__ import annotations

import http.server
import json
import pickle
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from trouper.config.models import RemoteRuntime
from trouper.exceptions import InvalidRequest, StaleEpoch, StoreUnavailable
from trouper.messages.actions import RunCommand, WriteFile
from trouper.messages.causes import RuntimeFailure
from trouper.runtimes.action_calls import STOP_MARGIN_S, ActionCalls
from trouper.runtimes.call_failures import (
    SandboxUnavailable,
    answer_json,
    cause_of,
    refusal,
    unreachable,
)
from trouper.runtimes.remote import RemoteSandbox, RemoteUnavailable
from trouper.runtimes.sandbox_client import SandboxClient

LIMITS = {"timeout_s": 30.0, "no_output_timeout_s": 10.0}
DONE = {"action_id": "a1", "state": "finished", "epoch": 3,
        "outcome": {"status": "ok", "content": "hi", "exit_code": 0, "future_field": 1}}
RUNNING = {"action_id": "a1", "state": "running", "epoch": 3}


class ScriptedJournal(ActionCalls):
    """A transport whose server answers from a script; each wait moves the fake clock."""

    where = "the scripted sandbox"

    def __init__(self, *answers: dict[str, Any], poll_s: float = 20.0) -> None:
        self.answers = list(answers)
        self.epoch, self.poll_s, self.request_timeout_s = 3, poll_s, 10.0
        self.now = 1000.0
        self.clock = lambda: self.now
        self.sent: list[dict[str, Any]] = []
        self.polls: list[tuple[float, float]] = []
        """(wait_s, timeout_s) of each long-poll."""

    def _send_action(self, body: dict[str, Any], *, timeout_s: float,
                     operation: str) -> dict[str, Any]:
        self.sent.append(body)
        self.now += body["wait_s"]
        return self.answers.pop(0)

    def _fetch_record(self, action_id: str, wait_s: float, *, timeout_s: float,
                      operation: str) -> dict[str, Any]:
        self.polls.append((wait_s, timeout_s))
        self.now += wait_s
        return self.answers.pop(0)


def test_execute_sends_the_action_once_with_the_epoch_and_returns_its_outcome():
    journal = ScriptedJournal(DONE)
    outcome = journal.execute("a1", RunCommand(command="echo hi"), **LIMITS)
    assert (outcome.status, outcome.content, outcome.exit_code) == ("ok", "hi", 0)
    [body] = journal.sent
    assert (body["action_id"], body["epoch"], body["action"]["command"]) == ("a1", 3, "echo hi")
    assert (body["timeout_s"], body["no_output_timeout_s"], body["wait_s"]) == (30.0, 10.0, 20.0)
    assert journal.polls == []


def test_a_running_action_is_long_polled_in_bounded_turns_until_it_finishes():
    journal = ScriptedJournal(RUNNING, RUNNING, RUNNING, DONE)
    assert journal.execute("a1", RunCommand(command="sleep 50"), **LIMITS).status == "ok"
    assert len(journal.sent) == 1  # polled, never sent again
    assert journal.polls == [(20.0, 30.0)] * 3  # each poll: its wait plus the request limit


def test_no_outcome_within_the_timeout_plus_the_margin_is_timed_out():
    journal = ScriptedJournal(*[RUNNING] * 10)
    with pytest.raises(SandboxUnavailable, match=r"no outcome .* within 61 s") as caught:
        journal.execute("a1", RunCommand(command="sleep 999", timeout_s=1), **LIMITS)
    assert caught.value.cause == RuntimeFailure.TIMED_OUT
    # the action's own timeout (1 s) wins over the default; the last poll only waits what is left
    assert [wait for wait, _ in journal.polls] == [20.0, 20.0, 1.0]
    assert journal.now - 1000.0 == 1 + STOP_MARGIN_S


def test_an_unknown_action_is_lost_and_not_run_again():
    journal = ScriptedJournal({"action_id": "a1", "state": "unknown", "epoch": 2})
    outcome = journal.execute("a1", RunCommand(command="make"), **LIMITS)
    assert outcome.status == "lost" and "not run again" in outcome.content
    assert len(journal.sent) == 1 and journal.polls == []


def test_an_action_over_the_body_limit_is_rejected_without_being_sent():
    journal = ScriptedJournal()
    journal.max_body_bytes = 500
    outcome = journal.execute("a1", WriteFile(path="big", content="x" * 600), **LIMITS)
    assert outcome.status == "rejected" and "limit 500" in outcome.content
    assert journal.sent == []


def test_resolve_answers_each_journal_state_without_running_anything():
    for answer in ({"action_id": "a1", "state": "absent"}, DONE,
                   {"action_id": "a1", "state": "unknown", "epoch": 2}):
        journal = ScriptedJournal(answer)
        record = journal.resolve("a1")
        assert (record.action_id, record.state) == ("a1", answer["state"])
        assert (record.outcome is not None) == (answer is DONE)
        assert journal.sent == [] and journal.polls == [(0.0, 10.0)]
    assert ScriptedJournal(DONE).resolve("a1").epoch == 3


def test_resolve_waits_for_a_running_action_up_to_wait_s_then_says_running():
    journal = ScriptedJournal(RUNNING, RUNNING, RUNNING)
    assert journal.resolve("a1", wait_s=30.0).state == "running"
    assert [wait for wait, _ in journal.polls] == [20.0, 10.0]
    journal = ScriptedJournal(RUNNING, DONE)
    assert journal.resolve("a1", wait_s=30.0).outcome is not None


@pytest.mark.parametrize("answer", [{"state": "finished"}, {"action_id": "a1", "state": "odd"},
                                    {"action_id": "a1", "state": "finished", "outcome": 5}])
def test_a_bad_record_is_a_failed_request(answer):
    with pytest.raises(SandboxUnavailable, match="bad record") as caught:
        ScriptedJournal(answer).resolve("a1")
    assert caught.value.cause == RuntimeFailure.FAILED


def test_an_execute_answered_absent_is_a_failed_request():
    with pytest.raises(SandboxUnavailable, match="'absent'") as caught:
        ScriptedJournal({"action_id": "a1", "state": "absent"}).execute(
            "a1", RunCommand(command="ls"), **LIMITS)
    assert caught.value.cause == RuntimeFailure.FAILED


def _body(error: str, message: str = "m", **more: str) -> bytes:
    return json.dumps({"error": error, "message": message, **more}).encode()


@pytest.mark.parametrize(("status", "payload", "raised", "cause"), [
    (409, _body("StaleEpoch"), StaleEpoch, None),
    (400, _body("BadRequest"), InvalidRequest, None),
    (411, b"", InvalidRequest, None),
    (413, _body("PayloadTooLarge"), InvalidRequest, None),
    (422, _body("InvalidRequest"), InvalidRequest, None),
    (507, _body("StorageUnavailable", "disk full"), StoreUnavailable, None),
    (401, _body("Unauthorized"), SandboxUnavailable, RuntimeFailure.UNAUTHORIZED),
    (404, _body("SandboxNotRunning"), SandboxUnavailable, RuntimeFailure.EXITED),
    (404, _body("NotFound"), SandboxUnavailable, RuntimeFailure.FAILED),
    (500, _body("ValueError", traceback="Traceback..."), SandboxUnavailable,
     RuntimeFailure.FAILED),
    (502, b"<html>bad gateway</html>", SandboxUnavailable, RuntimeFailure.FAILED),
])
def test_the_failure_table(status, payload, raised, cause):
    error = refusal("the sandbox at h:1", "resolve a1", status, payload)
    assert type(error) is raised
    assert str(error).startswith("resolve a1: the sandbox at h:1 answered") or raised is \
        StoreUnavailable
    assert getattr(error, "cause", None) == cause or raised is StoreUnavailable
    with pytest.raises(raised):
        answer_json("the sandbox at h:1", "resolve a1", status, payload)
    if status == 500:
        assert error.remote_traceback == "Traceback..."
    if status == 502:
        assert "bad gateway" in str(error)


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b"\xff"])
def test_an_ok_answer_that_is_no_json_object_is_a_failed_request(payload):
    with pytest.raises(SandboxUnavailable) as caught:
        answer_json("the sandbox at h:1", "alive", 200, payload)
    assert caught.value.cause == RuntimeFailure.FAILED
    assert answer_json("the sandbox at h:1", "alive", 200, b'{"pid": 1}') == {"pid": 1}


def test_no_answer_is_unreachable_or_timed_out_and_the_cause_survives_pickling():
    refused = unreachable("the sandbox at h:1", "alive", ConnectionRefusedError(111, "no"),
                          timed_out=False)
    slow = unreachable("the sandbox at h:1", "alive", TimeoutError("timed out"), timed_out=True)
    assert (refused.cause, slow.cause) == (RuntimeFailure.UNREACHABLE, RuntimeFailure.TIMED_OUT)
    assert "cannot reach the sandbox at h:1: ConnectionRefusedError" in str(refused)
    back = pickle.loads(pickle.dumps(SandboxUnavailable("x", RuntimeFailure.EXITED, "tb")))
    assert (str(back), back.cause, back.remote_traceback) == ("x", RuntimeFailure.EXITED, "tb")


def test_httpx_errors_are_classified_for_the_same_table():
    import httpx

    from trouper.runtimes.remote_errors import unreachable as remote_unreachable

    for error, cause in ((httpx.ReadTimeout("t"), RuntimeFailure.TIMED_OUT),
                         (httpx.ConnectTimeout("t"), RuntimeFailure.UNREACHABLE),
                         (httpx.ConnectError("refused"), RuntimeFailure.UNREACHABLE)):
        assert remote_unreachable("the runtime server at u", "start", error).cause == cause


def test_cause_of_reads_a_failure_back():
    assert cause_of(SandboxUnavailable("x", RuntimeFailure.UNAUTHORIZED)) == (
        RuntimeFailure.UNAUTHORIZED)
    assert cause_of(StaleEpoch("newer")) == RuntimeFailure.SUPERSEDED
    assert cause_of(RemoteUnavailable("x")) == RuntimeFailure.UNREACHABLE
    assert cause_of(ValueError("x")) == RuntimeFailure.FAILED
    assert cause_of(None) == RuntimeFailure.FAILED


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's ``answer`` (status, JSON body)."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        status, body = self.server.answer  # type: ignore[attr-defined]
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def scripted_server() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("status", "body", "raised", "cause"), [
    (200, DONE, None, None),
    (409, {"error": "StaleEpoch", "message": "epoch 4 holds it"}, StaleEpoch, None),
    (401, {"error": "Unauthorized", "message": "no"}, SandboxUnavailable,
     RuntimeFailure.UNAUTHORIZED),
    (404, {"error": "SandboxNotRunning", "message": "gone"}, SandboxUnavailable,
     RuntimeFailure.EXITED),
    (500, {"error": "OSError", "message": "boom", "traceback": "tb"}, SandboxUnavailable,
     RuntimeFailure.FAILED),
])
def test_both_clients_answer_a_server_alike(scripted_server, status, body, raised, cause):
    port = scripted_server.server_address[1]
    local = SandboxClient("127.0.0.1", port, "t" * 40, epoch=3)
    remote = RemoteSandbox("s1", config=RemoteRuntime(url=f"http://127.0.0.1:{port}",
                                                      token="t" * 40))
    scripted_server.answer = (status, body)  # type: ignore[attr-defined]
    try:
        for client in (local, remote):
            assert isinstance(client, ActionCalls)
            if raised is None:
                assert client.resolve("a1").outcome.content == "hi"
                continue
            with pytest.raises(raised) as caught:
                client.resolve("a1")
            assert getattr(caught.value, "cause", None) == cause
            assert str(caught.value).startswith(f"resolve a1: {client.where} answered {status}")
    finally:
        local.close()
        remote.close()
