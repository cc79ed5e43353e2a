"""storable(): every lone surrogate becomes U+FFFD (I6 in docs/promises.md), whatever
holds it, and clean
values come back as the very same object (the fast path checks a container whole)."""

from __future__ import annotations

from datetime import UTC, datetime

from trouper.messages.protocol import Complete
from trouper.messages.text import storable

BAD = "a\ud800b"


def test_clean_values_are_returned_as_they_are():
    history = {"messages": [{"role": "user", "content": "héllo ✓"}] * 50, "n": 3.5,
               "when": datetime.now(UTC), "nested": ({"k": [1, None, True]},)}
    assert storable(history) is history


def test_a_lone_surrogate_is_replaced_wherever_it_is():
    assert storable(BAD) == "a\ufffdb"
    value = {"messages": [{"role": "user", "content": "fine"},
                          {"role": "tool", "content": BAD}],
             BAD: ("ok", BAD), "when": datetime(2026, 1, 1, tzinfo=UTC)}
    fixed = storable(value)
    assert fixed["messages"][0] is value["messages"][0]  # untouched parts are shared
    assert fixed["messages"][1]["content"] == "a\ufffdb"
    assert fixed["a\ufffdb"] == ("ok", "a\ufffdb")
    assert fixed["when"] is value["when"]


def test_keys_json_cannot_encode_are_walked_too():
    value = {(1, BAD): BAD, 2: "x"}
    assert storable(value) == {(1, "a\ufffdb"): "a\ufffdb", 2: "x"}


def test_a_message_built_from_a_poisoned_history_stores():
    request = Complete(request_id="r", session_id="s", llm={"model": "m"},
                       messages=[{"role": "tool", "content": BAD}])
    assert request.messages[0]["content"] == "a\ufffdb"
    request.model_dump_json().encode("utf-8")
