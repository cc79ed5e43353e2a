"""``CheckedHistories``: litellm's check of each message of a history, done once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litellm.utils import validate_and_fix_openai_messages

from trouper.llm.checked import STALE_S, CheckedHistories

Check = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def _counting() -> tuple[list[int], Check]:
    """litellm's check, counting the messages of each call it gets."""
    calls: list[int] = []

    def counted(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        calls.append(len(messages))
        return validate_and_fix_openai_messages(messages)

    return calls, counted


def test_each_history_is_checked_once_per_message_and_a_change_is_checked_again():
    calls, counted = _counting()
    real = validate_and_fix_openai_messages
    kept = CheckedHistories(check=counted)
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "do it"}]
    assert kept(history) == real(history) and calls == [1, 1]
    history = [*history, {"role": "assistant", "content": "done"}]
    calls.clear()
    assert kept(history) == real(history) and calls == [1]  # only the new one
    changed = [history[0], {"role": "user", "content": "do it better"}, history[2]]
    calls.clear()
    assert kept(changed) == real(changed) and calls == [1, 1]  # from the change on
    assert len(kept) == 1
    with_parts = [*changed, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    calls.clear()
    assert kept(with_parts) == real(with_parts) and calls == [4]  # not plain: whole


def test_the_kept_histories_stay_within_their_bounds():
    """At most ``capacity`` histories and ``max_chars`` of their text; a new history finds
    room only where a kept one went stale, else it is checked whole and not kept."""
    now = [0.0]
    kept = CheckedHistories(capacity=2, max_chars=10, clock=lambda: now[0])
    one = [{"role": "user", "content": "12345"}]
    two = [{"role": "user", "content": "678"}]
    three = [{"role": "user", "content": "9"}]
    assert kept(one) == one and kept(two) == two
    assert kept(three) == three and len(kept) == 2  # both in use: ``three`` not kept
    assert not kept.known_clean(kept(three))
    big = [{"role": "user", "content": "x" * 11}]
    assert kept(big) == big and len(kept) == 2  # more text than all the bound
    now[0] += STALE_S + 1
    assert kept(three) == three and len(kept) == 2  # ``one`` went stale: room for it
    copies = kept(three)
    assert kept.known_clean(copies)
    kept.forget(three)
    assert len(kept) == 1 and not kept.known_clean(copies)


def test_histories_beyond_the_bounds_are_checked_whole_not_one_message_at_a_time():
    """More histories than the bound, asked in turn (a large fleet): kept per message,
    each call evicted what the next one needed, and every call re-checked its history
    one message at a time (1.25 ms a call at 300 sessions of 300 messages, against 0.24
    for litellm's check of the whole list). The histories kept stay kept; the others
    are checked whole."""
    calls, counted = _counting()
    real = validate_and_fix_openai_messages
    kept = CheckedHistories(capacity=3, check=counted)
    histories = [[{"role": "user", "content": f"{h}-{i}"} for i in range(60)]
                 for h in range(5)]
    for history in histories:
        assert kept(history) == real(history)
    calls.clear()
    for _ in range(2):
        for history in histories:
            history.append({"role": "assistant", "content": "more"})
            assert kept(history) == real(history)
    one_by_one = [n for n in calls if n == 1]
    assert len(one_by_one) == 2 * 3, calls  # each kept history's new message, each round
    assert sorted(n for n in calls if n > 1) == [61, 61, 62, 62]  # the two not kept
    assert len(kept) == 3


def test_a_history_forgotten_is_checked_afresh():
    calls, counted = _counting()
    real = validate_and_fix_openai_messages
    kept = CheckedHistories(check=counted)
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    copies = kept(history)
    assert kept.known_clean(copies) and len(kept) == 1
    kept.forget([{"role": "system", "content": "s"}])  # another dict: not this history
    assert len(kept) == 1
    kept.forget(history)
    assert len(kept) == 0 and not kept.known_clean(copies)
    calls.clear()
    assert kept(history) == real(history) and calls == [1, 1]
