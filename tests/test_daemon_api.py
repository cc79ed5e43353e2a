"""The daemon's HTTP API, driven with a real HTTP client against a real daemon process on
127.0.0.1: a session's whole life, confirmation, idempotent creates, pages, errors, and
secrets that never come back."""

from __future__ import annotations

import json

import httpx
import pytest

from trouper import AgentState
from trouper.store import open_store
from trouper.testing import check_log, wait_until
from trouper.testing.daemon import running_daemon

pytestmark = pytest.mark.slow  # starts a daemon process

FINISH = {"tool": "finish", "args": {"message": "done"}}
SECRET = "s3cret-value-never-shown"
KEY = "sk-test-key-never-shown"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with running_daemon(tmp_path_factory.mktemp("dhome"),
                        env={"TROUPER_DAEMON_MAX_STREAMS": "3"}) as d:
        yield d


def sse_events(http: httpx.Client, session_id: str, after: int = 0, until_settled=True,
               headers=None, stop_after: int | None = None) -> tuple[list[dict], dict | None]:
    """Read an SSE stream: the events, and the end message (None if cut by stop_after)."""
    from trouper.client.daemon import parse_sse

    got, end = [], None
    with http.stream("GET", f"/v1/sessions/{session_id}/events/stream",
                     params={"after": after, "until_settled": until_settled},
                     headers=headers or {}) as answer:
        assert answer.status_code == 200, answer.read()
        assert answer.headers["content-type"].startswith("text/event-stream")
        for kind, data in parse_sse(answer.iter_lines()):
            if kind == "end":
                end = data
                break
            if kind == "comment":
                continue
            got.append(data)
            if stop_after is not None and len(got) >= stop_after:
                break
    return got, end


def test_a_session_lives_its_whole_life_over_http(daemon, scripted, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo $MY_SECRET > out.txt"}},
        {"say": "Done. Anything else?"},
        {"tool": "run", "args": {"command": "echo more >> out.txt"}},
        FINISH,
    ])
    http = daemon.http()
    made = http.post("/v1/sessions", json={
        "task": f"write the secret {SECRET}", "llm": {**llm, "api_key": KEY},
        "workspace": str(tmp_path), "secrets": {"MY_SECRET": SECRET}, "max_iterations": 20})
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    events, end = sse_events(http, sid)
    assert end == {"type": "end", "reason": "settled", "after": events[-1]["seq"]}
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    info = http.get(f"/v1/sessions/{sid}").json()
    assert info["state"] == "awaiting_user_input" and info["settled"]
    assert (tmp_path / "out.txt").read_text() == f"{SECRET}\n"  # the shell had it

    sent = http.post(f"/v1/sessions/{sid}/messages", json={"text": "append more"})
    assert sent.status_code == 200 and sent.json()["seq"] > events[-1]["seq"]
    more, end = sse_events(http, sid, after=events[-1]["seq"])
    assert more[0]["seq"] == events[-1]["seq"] + 1 and end["reason"] == "settled"
    info = http.get(f"/v1/sessions/{sid}").json()
    assert info["state"] == "finished" and info["actions"] == 3 and info["iterations"] == 4
    assert (tmp_path / "out.txt").read_text() == f"{SECRET}\nmore\n"

    page = http.get(f"/v1/sessions/{sid}/events", params={"after": 2, "limit": 3}).json()
    assert [e["seq"] for e in page["events"]] == [3, 4, 5]
    assert page["next_after"] == 5 and page["head_seq"] == info["last_seq"]
    store = open_store(daemon.home)
    try:
        assert check_log(store.read(sid)) == []
    finally:
        store.close()

    # write-only secrets: no answer carries the values, wherever they could come back
    everything = [http.get(f"/v1/sessions/{sid}").text, http.get("/v1/sessions").text,
                  http.get(f"/v1/sessions/{sid}/events").text,
                  json.dumps(sse_events(http, sid)[0])]
    for text in everything:
        assert SECRET not in text and KEY not in text
    assert "<secret:MY_SECRET>" in everything[0]  # the task shows the placeholder
    assert info["config"]["secret_names"] == ["MY_SECRET"]


def test_pause_resume_and_stop_over_http(daemon, scripted):
    _, llm = scripted([{"tool": "run", "args": {"command": f"echo {i}"}, "delay_s": 0.2}
                       for i in range(30)] + [FINISH])
    http = daemon.http()
    sid = http.post("/v1/sessions", json={"task": "count", "llm": llm}).json()["id"]
    wait_until(lambda: http.get(f"/v1/sessions/{sid}").json()["actions"] >= 1, 60,
               "a first action")
    assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
    assert http.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
    head = http.get(f"/v1/sessions/{sid}").json()["last_seq"]
    assert http.post(f"/v1/sessions/{sid}/resume").json()["state"] == "running"
    wait_until(lambda: http.get(f"/v1/sessions/{sid}").json()["last_seq"] > head + 3, 60,
               "the session going on after resume")
    assert http.post(f"/v1/sessions/{sid}/stop").status_code == 200
    info = http.get(f"/v1/sessions/{sid}").json()
    assert info["state"] == "stopped" and info["settled"]
    stopped = http.get("/v1/sessions", params={"state": "stopped"}).json()["sessions"]
    assert sid in [s["id"] for s in stopped]
    assert all(s["state"] == "stopped" for s in stopped)


def test_confirmation_approve_and_reject_over_http(daemon, scripted, tmp_path):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "echo approved > a.txt"}},
        {"tool": "run", "args": {"command": "rm -f b.txt"}},
        FINISH,
    ])
    (tmp_path / "b.txt").write_text("keep me\n")
    http = daemon.http()
    sid = http.post("/v1/sessions", json={"task": "t", "llm": llm, "workspace": str(tmp_path),
                                          "confirm": "always"}).json()["id"]
    sse_events(http, sid)  # until settled: waiting for the first approval
    info = http.get(f"/v1/sessions/{sid}").json()
    assert info["state"] == "awaiting_user_confirmation"
    waiting = info["awaiting_confirmation"]
    assert waiting["action"]["command"] == "echo approved > a.txt"
    assert not (tmp_path / "a.txt").exists()
    wrong = http.post(f"/v1/sessions/{sid}/approve", json={"action_id": "not-this-one"})
    assert wrong.status_code == 409 and wrong.json()["error"]["code"] == "invalid_state"
    assert http.post(f"/v1/sessions/{sid}/approve",
                     json={"action_id": waiting["action_id"]}).status_code == 200
    sse_events(http, sid, after=info["last_seq"])
    info = http.get(f"/v1/sessions/{sid}").json()
    second = info["awaiting_confirmation"]
    assert second["action"]["command"] == "rm -f b.txt"
    assert (tmp_path / "a.txt").read_text() == "approved\n"
    assert http.post(f"/v1/sessions/{sid}/reject", json={"reason": "keep b.txt"}
                     ).status_code == 200
    sse_events(http, sid, after=info["last_seq"])
    assert http.get(f"/v1/sessions/{sid}").json()["state"] == "finished"
    assert (tmp_path / "b.txt").read_text() == "keep me\n"
    events = http.get(f"/v1/sessions/{sid}/events").json()["events"]
    answers = [(e["approved"], e["reason"]) for e in events if e["kind"] == "confirmation"]
    assert answers == [(True, ""), (False, "keep b.txt")]
    outcome = next(e["outcome"] for e in events
                   if e["kind"] == "observation" and e["action_id"] == second["action_id"])
    assert outcome["status"] == "rejected" and "keep b.txt" in outcome["content"]
    nothing = http.post(f"/v1/sessions/{sid}/approve")
    assert nothing.status_code == 409


def test_a_client_chosen_id_makes_create_idempotent(daemon, scripted):
    _, llm = scripted([FINISH])
    http = daemon.http()
    body = {"id": "my-task-1", "task": "once", "llm": llm, "secrets": {"TOK": SECRET}}
    first = http.post("/v1/sessions", json=body)
    again = http.post("/v1/sessions", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"] == "my-task-1"
    other = http.post("/v1/sessions", json={**body, "task": "another"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "conflict"
    other_secret = http.post("/v1/sessions", json={**body, "secrets": {"TOK": "another-one"}})
    assert other_secret.status_code == 409
    assert len([s for s in daemon.client().sessions() if s.id == "my-task-1"]) == 1
    bad = http.post("/v1/sessions", json={**body, "id": "../escape"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "session_id"


def test_pages_follow_the_cursor_and_the_offset(daemon, scripted):
    _, llm = scripted([FINISH])
    http = daemon.http()
    made = [http.post("/v1/sessions", json={"task": f"page {i}", "llm": llm}).json()["id"]
            for i in range(5)]
    seen, cursor = [], None
    while True:
        page = http.get("/v1/sessions", params={"limit": 2, **({"cursor": cursor}
                                                                if cursor else {})}).json()
        assert len(page["sessions"]) <= 2
        seen += [s["id"] for s in page["sessions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen))
    assert [sid for sid in seen if sid in made] == made[::-1]  # newest first
    by_offset = http.get("/v1/sessions", params={"limit": 2, "offset": 2}).json()
    assert [s["id"] for s in by_offset["sessions"]] == seen[2:4]
    assert by_offset["next_offset"] == 4


@pytest.mark.parametrize("method,path,body,status,field", [
    ("get", "/v1/sessions/s-nope", None, 404, None),
    ("post", "/v1/sessions/s-nope/pause", None, 404, None),
    ("get", "/v1/sessions/s-nope/events", None, 404, None),
    ("get", "/v1/sessions/s-nope/events/stream", None, 404, None),
    ("post", "/v1/sessions", {"llm": {"model": "x"}}, 422, "task"),
    ("post", "/v1/sessions", {"task": "t", "llm": {"model": "hosted_vllm/x", "api_key": "k"},
                              "max_iterations": 0}, 422, "max_iterations"),
    ("post", "/v1/sessions", {"task": "t", "llm": {"model": "hosted_vllm/x", "api_key": "k"},
                              "bogus_option": 1}, 422, "bogus_option"),
    ("get", "/v1/sessions?limit=0", None, 422, "limit"),
    ("get", "/v1/sessions?state=sleeping", None, 422, "state"),
    ("get", "/v1/sessions?cursor=garbage", None, 422, "cursor"),
    ("get", "/v1/nothing-here", None, 404, None),
    ("post", "/v1/sessions", {"task": "t", "llm": {"model": "hosted_vllm/x", "api_key": "k"},
                              "workspace": "relative/dir"}, 422, "workspace"),
    ("post", "/v1/sessions/s-nope/messages", {"text": ""}, 422, "text"),
])
def test_errors_are_json_with_a_code_and_the_field(daemon, method, path, body, status, field):
    answer = getattr(daemon.http(), method)(path, **({"json": body} if body else {}))
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] and error["message"]
    assert error.get("field") == field


def test_too_many_streams_is_a_visible_429(daemon, scripted):
    _, llm = scripted([FINISH])
    http = daemon.http()
    sid = http.post("/v1/sessions", json={"task": "t", "llm": llm}).json()["id"]
    url = f"/v1/sessions/{sid}/events/stream"
    with http.stream("GET", url) as one, http.stream("GET", url) as two, \
            http.stream("GET", url) as three:
        assert [s.status_code for s in (one, two, three)] == [200, 200, 200]
        wait_until(lambda: http.get("/v1/health").json()["streams"] == 3, 10, "3 streams")
        fourth = http.get(url)
        assert fourth.status_code == 429 and fourth.headers["retry-after"] == "1"
        assert fourth.json()["error"]["code"] == "too_many_streams"
    # a dropped client only ends its own stream: the session never notices
    wait_until(lambda: http.get("/v1/health").json()["streams"] == 0, 10, "streams closed")
    assert http.get(url, params={"until_settled": True}).status_code == 200


def test_trouper_connect_finds_the_homes_daemon_and_speaks_the_session_api(daemon, scripted,
                                                                          tmp_path):
    from trouper import ConfigError, Trouper, UnknownSession
    from trouper.client.daemon import DaemonUnavailable

    _, llm = scripted([{"tool": "run", "args": {"command": "echo hi > hi.txt"}},
                       {"say": "More?"}, FINISH])
    with Trouper.connect(home=daemon.home.root) as t:  # url and token read in the home
        s = t.start_session("hi", llm=llm, workspace=tmp_path, session_id="connect-1")
        same = t.start_session("hi", llm=llm, workspace=tmp_path, session_id="connect-1")
        assert s.id == same.id == "connect-1"
        kinds = [e.kind for e in s.events(follow=True)]
        assert kinds[0] == "message" and "observation" in kinds
        assert s.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        assert s.view().state == AgentState.AWAITING_USER_INPUT
        s.send("finish")
        assert s.wait(timeout=60) == AgentState.FINISHED and s.fault is None
        assert (tmp_path / "hi.txt").read_text() == "hi\n"
        assert "connect-1" in [x.id for x in t.sessions(state="finished")]
        with pytest.raises(UnknownSession):
            t.session("s-none")
        with pytest.raises(ConfigError) as refused:
            t.start_session("x", llm={**llm, "temperature": -1})
        assert refused.value.field == "llm.temperature"
    with pytest.raises(DaemonUnavailable, match="no daemon runs"):
        Trouper.connect(home=tmp_path / "elsewhere")
    with pytest.raises(DaemonUnavailable, match="refused"):
        Trouper.connect(daemon.url, token="wrong").sessions()


def _user_messages(http: httpx.Client, sid: str) -> list[str]:
    events = http.get(f"/v1/sessions/{sid}/events").json()["events"]
    return [e["text"] for e in events if e["kind"] == "message" and e["source"] == "user"]


def test_a_command_sent_again_under_its_idempotency_key_is_carried_out_once(daemon, scripted):
    _, llm = scripted([{"say": "What next?"}, {"say": "And?"}, {"say": "Done?"}])
    http = daemon.http()
    sid = http.post("/v1/sessions", json={"task": "t", "llm": llm}).json()["id"]
    wait_until(lambda: http.get(f"/v1/sessions/{sid}").json()["state"]
               == "awaiting_user_input", 60, "the first reply")
    url, key = f"/v1/sessions/{sid}/messages", {"Idempotency-Key": "client-retry-1"}
    first = http.post(url, json={"text": "go on"}, headers=key)
    again = http.post(url, json={"text": "go on"}, headers=key)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert _user_messages(http, sid) == ["t", "go on"]
    # answered again with the seq of the first event it appended (the message), which
    # the first answer's (the last it appended) follows
    events = http.get(f"/v1/sessions/{sid}/events").json()["events"]
    said = [e["seq"] for e in events if e["kind"] == "message" and e["text"] == "go on"]
    assert said == [again.json()["seq"]] and again.json()["seq"] <= first.json()["seq"]
    # the same key on another message is another command; no key, every send is one
    other = http.post(url, json={"text": "more"}, headers=key)
    assert other.status_code == 200 and other.json()["seq"] > first.json()["seq"]
    assert http.post(url, json={"text": "more"}).status_code == 200
    assert _user_messages(http, sid) == ["t", "go on", "more", "more"]
    # a pause taken once is answered again, where a second pause is refused
    pause, pause_key = f"/v1/sessions/{sid}/pause", {"Idempotency-Key": "p-1"}
    assert http.post(pause, headers=pause_key).status_code == 200
    assert http.post(pause, headers=pause_key).status_code == 200
    assert http.post(pause).status_code == 409
    bad = http.post(pause, headers={"Idempotency-Key": "k" * 256})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "Idempotency-Key"


class _AnswerLost(httpx.BaseTransport):
    """Sends the first POST to the daemon, then fails as a connection dropped before
    the answer came back; every other call goes through."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner, self.dropped = inner, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.inner.handle_request(request)
        if request.method == "POST" and not self.dropped:
            answer.read()  # the daemon carried it out
            self.dropped += 1
            raise httpx.RemoteProtocolError("connection dropped", request=request)
        return answer


@pytest.mark.parametrize("what", ["create", "send"])
def test_the_client_sends_again_what_a_dropped_connection_cut_and_it_is_done_once(
        daemon, scripted, tmp_path, what):
    from trouper import Trouper

    _, llm = scripted([{"say": "What next?"}, {"say": "And?"}])
    with Trouper.connect(home=daemon.home.root) as t:
        before = len(t.sessions())
        lossy = _AnswerLost(t._http._transport)  # noqa: SLF001 - the client's own pipe
        if what == "create":
            t._http._transport = lossy  # noqa: SLF001
        s = t.start_session("t", llm=llm, workspace=tmp_path / what)
        assert s.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        if what == "send":
            t._http._transport = lossy  # noqa: SLF001
            seq = s.send("go on")
            assert seq == [e.seq for e in s.events() if getattr(e, "text", "") == "go on"][0]
        assert lossy.dropped == 1
        said = [e.text for e in s.events() if e.kind == "message" and e.source == "user"]
        assert said == (["t"] if what == "create" else ["t", "go on"])
        assert len(t.sessions()) == before + 1


def test_the_list_gives_cost_and_steps_only_when_asked_for_usage(daemon, scripted):
    _, llm = scripted([{"tool": "run", "args": {"command": "true"}},
                       {"tool": "finish", "args": {"message": "done"}}])
    session = daemon.client().start_session("counted", llm=llm)
    assert session.wait(timeout=60) == AgentState.FINISHED
    http = daemon.http()
    plain = next(r for r in http.get("/v1/sessions").json()["sessions"]
                 if r["id"] == session.id)
    assert plain["runtime"] == "local" and "cost_usd" not in plain
    rows = http.get("/v1/sessions", params={"usage": "true"}).json()["sessions"]
    row = next(r for r in rows if r["id"] == session.id)
    info = session.info()
    assert (row["cost_usd"], row["iterations"]) == (info.cost_usd, info.iterations) \
        and info.iterations == 2


def test_a_daemon_on_its_own_store_says_it_is_in_no_cluster_and_refuses_labels(
        daemon, scripted):
    assert daemon.http().get("/v1/cluster").json() == {"cluster": False, "me": None,
                                                       "daemons": []}
    _, llm = scripted([FINISH])
    refused = daemon.http().post("/v1/sessions", json={"task": "t", "llm": llm,
                                                       "labels": ["gpu=a100"]})
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "labels"
    assert "only a daemon of a cluster" in refused.json()["error"]["message"]


def test_a_budget_that_asks_is_raised_through_the_api_and_the_cli(daemon, scripted,
                                                                   tmp_path):
    from click.testing import CliRunner

    from trouper.cli.main import main

    steps = [{"tool": "run", "args": {"command": f"echo {i}"}} for i in range(5)]
    _, llm = scripted([*steps, FINISH])
    http = daemon.http()
    sid = http.post("/v1/sessions", json={"task": "count", "llm": llm, "max_iterations": 2,
                                          "on_budget": "ask"}).json()["id"]
    session = daemon.client().session(sid)
    assert session.wait(timeout=60) == AgentState.PAUSED
    info = http.get(f"/v1/sessions/{sid}").json()
    assert info["cause"] == "budget_ask" and "max_iterations (2" in info["reason"]
    refused = http.post(f"/v1/sessions/{sid}/budget", json={"max_iterations": 1})
    assert refused.status_code == 409 and "still be spent" in refused.json()["error"]["message"]
    assert http.post(f"/v1/sessions/{sid}/budget", json={"max_iterations": 0}
                     ).status_code == 422
    assert http.post(f"/v1/sessions/{sid}/budget", json={"max_iterations": 4}
                     ).status_code == 200
    assert session.wait(timeout=60) == AgentState.PAUSED  # 4 spent: it asks again
    said = CliRunner().invoke(main, ["budget", sid, "--max-iterations", "20", "--home",
                                     str(daemon.home.root)])
    assert said.exit_code == 0, said.output
    assert session.wait(timeout=60) == AgentState.FINISHED
