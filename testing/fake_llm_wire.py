"""The OpenAI ``chat.completions`` wire format as the fake LLM server speaks it.

Pure functions: a request body parsed and checked, the script step and conversation it
asks for, and the replies (a completion, a scripted failure, an OpenAI-style error).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .script import Failure, ToolCallSpec

SESSION_HEADER = "x-trouper-session"
"""Request header whose value keys the fail counters, when present."""
TURN_HEADER = "x-trouper-turn"
"""Request header holding the session's model turns so far: the step to play."""

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


@dataclass(frozen=True)
class Reply:
    """What the server sends back: status, JSON body, headers, after ``delay_s``."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


class BadRequest(Exception):
    """The request body is not a chat completion request; the message says why (a 400)."""


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON body of a chat completion request; raises BadRequest saying what is wrong."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of message objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string 'role'")
    if body.get("stream"):
        raise BadRequest("'stream': true is not supported by the fake LLM server")
    return body


def step_of(headers: dict[str, str], messages: list[dict[str, Any]]) -> int:
    """The ``X-Trouper-Turn`` header (the turns of the whole session, which a condensed
    prompt no longer shows), else the assistant messages in the request."""
    turn = headers.get(TURN_HEADER, "")
    if turn.isdigit():
        return int(turn)
    return sum(1 for m in messages if m.get("role") == "assistant")


def conversation_key(messages: list[dict[str, Any]]) -> str:
    """Whose fail counters a request without ``X-Trouper-Session`` uses: its first user
    message, hashed (the same in every turn of one conversation)."""
    first = next((m for m in messages if m.get("role") == "user"), messages[0])
    text = json.dumps(first.get("content"), sort_keys=True)
    return "user:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def completion_body(
    model: str, text: str | None, calls: tuple[ToolCallSpec, ...], request_chars: int, k: int
) -> dict[str, Any]:
    """A real ``chat.completion`` object with the given content and tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    response_chars = len(text or "")
    if calls:
        tag = uuid.uuid4().hex[:12]
        message["tool_calls"] = [
            {
                "id": f"call_{tag}_{k}_{i}",
                "type": "function",
                "function": {"name": c.tool, "arguments": c.arguments},
            }
            for i, c in enumerate(calls)
        ]
        response_chars += sum(len(c.tool) + len(c.arguments) for c in calls)
    prompt_tokens = max(1, request_chars // 4)
    completion_tokens = max(1, response_chars // 4)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def failure_reply(failure: Failure, k: int, attempt: int) -> Reply:
    """The scripted failure ``attempt`` of step ``k``, with its retry headers."""
    headers = dict(failure.headers)
    if failure.retry_after is not None:
        value = failure.retry_after
        headers["Retry-After"] = str(int(value)) if value == int(value) else str(value)
    if failure.retry_after_ms is not None:
        headers["retry-after-ms"] = str(failure.retry_after_ms)
    msg = failure.message or f"scripted error {failure.status} for step {k} (attempt {attempt})"
    return error_reply(failure.status, msg, headers)


def error_reply(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    """An OpenAI-style error response."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "api_error")
    body = {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}
    return Reply(status, body, headers or {})
