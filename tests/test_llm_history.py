"""A session's history crosses to the broker once (``llm/history.py``): the sender sends
what is new, the store rebuilds the whole request, and whatever it cannot rebuild it asks
for whole. Pure objects: no broker, no process."""

from __future__ import annotations

from typing import Any

from trouper.config.models import LLMConfig
from trouper.llm.gate import estimate_tokens, tokens_of
from trouper.llm.history import HistorySender, HistoryStore
from trouper.messages.protocol import Complete

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {}}}]


def request(messages: list[dict[str, Any]], rid: str = "r", sid: str = "s-1",
            tools: list[dict[str, Any]] | None = None) -> Complete:
    return Complete.model_construct(request_id=rid, session_id=sid,
                                    llm=LLMConfig(model="hosted_vllm/x"), messages=messages,
                                    tools=TOOLS if tools is None else tools, turn=0,
                                    lift_cooldown=False, history_id="", history_len=0)


def grown(n: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "sys"}] + [
        {"role": "user" if i % 2 else "assistant", "content": f"m{i}"} for i in range(1, n)]


def test_each_request_after_the_first_carries_only_the_new_messages():
    sender, store = HistorySender("c1"), HistoryStore()
    history = grown(3)
    first = sender.prepare(request(history, "r1"))
    assert first.history_len == 0 and first.messages == history and first.tools == TOOLS
    assert store.take(first)[0] == first  # type: ignore[index]
    history = history + [{"role": "assistant", "content": "m3"}, {"role": "user", "content": "m4"}]
    second = sender.prepare(request(history, "r2"))
    assert second.history_len == 3 and len(second.messages) == 2 and second.tools == []
    taken = store.take(second)
    assert taken is not None
    whole, chars = taken
    assert whole.messages == history and whole.tools == TOOLS and whole.history_len == 0
    assert tokens_of(chars) == estimate_tokens(history, TOOLS)
    third = sender.prepare(request(history + [{"role": "assistant", "content": "m5"}], "r3"))
    assert third.history_len == 5 and [m["content"] for m in third.messages] == ["m5"]
    assert store.take(third)[0].messages[-1]["content"] == "m5"  # type: ignore[index]


def test_a_change_before_the_end_is_sent_whole():
    sender = HistorySender("c1")
    history = grown(4)
    sender.prepare(request(history))
    condensed = [history[0], {"role": "user", "content": "[context condensed]"}, history[3]]
    again = sender.prepare(request(condensed))
    assert again.history_len == 0 and again.messages == condensed
    new_system = [{"role": "system", "content": "sys and AGENTS.md"}, *condensed[1:], {
        "role": "user", "content": "x"}]
    assert sender.prepare(request(new_system)).history_len == 0
    other_tools = sender.prepare(request([*new_system, {"role": "user", "content": "y"}],
                                         tools=[*TOOLS, *TOOLS]))
    assert other_tools.history_len == 0 and len(other_tools.tools) == 2


def test_a_store_without_that_history_asks_for_it_whole_and_then_goes_on():
    sender, store = HistorySender("c1"), HistoryStore()
    store.take(sender.prepare(request(grown(3), "r1")))
    restarted = HistoryStore()  # a new broker: it has nothing
    delta = sender.prepare(request(grown(5), "r2"))
    assert restarted.take(delta) is None
    sender.forget()  # what the Controller does on ResendHistory
    whole = sender.prepare(request(grown(5), "r2"))
    assert restarted.take(whole)[0] == whole  # type: ignore[index]
    nxt = sender.prepare(request(grown(6), "r3"))
    assert restarted.take(nxt)[0].messages == grown(6)  # type: ignore[index]


def test_requests_that_crossed_are_refused_rather_than_mixed():
    """Thespian does not keep the order between two processes: a delta built on a later
    history than the store's, or on another history, is refused, never spliced."""
    sender, store = HistorySender("c1"), HistoryStore()
    store.take(sender.prepare(request(grown(3), "r1")))
    second = sender.prepare(request(grown(4), "r2"))
    third = sender.prepare(request(grown(6), "r3"))
    assert store.take(third) is None  # r2 not seen yet: 3 kept, 4 claimed
    assert store.take(second) is not None
    other = HistorySender("c2").prepare(request(grown(2), "r9"))
    assert store.take(other.model_copy(update={"history_len": 4})) is None  # another id


def test_the_store_keeps_the_most_recent_sessions():
    store = HistoryStore(capacity=2)
    senders = {sid: HistorySender(sid) for sid in ("a", "b", "c")}
    for sid, sender in senders.items():
        store.take(sender.prepare(request(grown(2), f"{sid}1", sid)))
    assert len(store) == 2
    assert store.take(senders["a"].prepare(request(grown(3), "a2", "a"))) is None  # evicted
    assert store.take(senders["c"].prepare(request(grown(3), "c2", "c"))) is not None


def test_the_token_estimate_is_kept_as_the_history_grows_and_equals_a_whole_count():
    """The broker's admission counts a request's tokens; the store adds only what is new,
    and its count is the one ``estimate_tokens`` makes of the whole request."""
    sender, store = HistorySender("c1"), HistoryStore()
    odd = {"role": "tool", "tool_call_id": "c", "content": "é\u00e9 \"quoted\" ✓ \n"}
    sizes = []
    for n, extra in ((1, []), (3, []), (3, [odd]), (6, [odd]), (9, [odd, odd])):
        history = grown(n) + extra
        taken = store.take(sender.prepare(request(history, f"r{n}-{len(extra)}")))
        assert taken is not None
        _, chars = taken
        sizes.append(chars)
        assert tokens_of(chars) == estimate_tokens(history, TOOLS)
    no_tools = HistorySender("c2").prepare(request(grown(2), "t", sid="s-2", tools=[]))
    assert tokens_of(store.take(no_tools)[1]) == estimate_tokens(grown(2), [])  # type: ignore[index]


def test_a_forgotten_session_is_asked_for_its_history_whole_again():
    """A session that stood down: the broker lets go of its history; the restored
    session's first request is whole, and one built on the old history is refused."""
    sender, store = HistorySender("c1"), HistoryStore()
    history = grown(3)
    assert store.take(sender.prepare(request(history, "r1"))) is not None
    assert store.forget("s-1") == history and len(store) == 0
    assert store.forget("s-1") == []
    stale = sender.prepare(request(history + [{"role": "user", "content": "m3"}], "r2"))
    assert stale.history_len == 3 and store.take(stale) is None  # -> ResendHistory
