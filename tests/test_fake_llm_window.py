"""The fake LLM server's rpm window: configurable, counted on its clock (a fake one here)."""

from __future__ import annotations

import json

import pytest

from trouper.testing import FakeLLMServer

BODY = json.dumps({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}).encode()


def post_at(server: FakeLLMServer, now: list[float], at: float) -> tuple[int, dict[str, str]]:
    """Answer one chat request arriving at ``at`` on the server's clock (no socket needed)."""
    now[0] = at
    reply = server.answer_post("/v1/chat/completions", {}, BODY)
    return reply.status, reply.headers


def test_rpm_counts_over_the_window_it_is_given():
    now = [0.0]
    server = FakeLLMServer([{"say": "ok"}], rpm=2, rpm_window_s=6.0, clock=lambda: now[0])
    assert post_at(server, now, 0.0)[0] == 200
    assert post_at(server, now, 0.5)[0] == 200
    status, headers = post_at(server, now, 5.9)
    assert (status, headers) == (429, {"Retry-After": "1"})
    assert post_at(server, now, 6.0)[0] == 200  # the first admission left the window
    assert post_at(server, now, 6.1)[0] == 429
    assert [r.time_s for r in server.requests] == [0.0, 0.5, 5.9, 6.0, 6.1]


def test_the_window_is_a_minute_unless_told_and_must_be_positive():
    assert FakeLLMServer([{"say": "ok"}], rpm=1).rpm_window_s == 60.0
    with pytest.raises(ValueError, match="rpm_window_s"):
        FakeLLMServer([{"say": "ok"}], rpm=1, rpm_window_s=0)
