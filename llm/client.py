"""One blocking model call through litellm, turned into a ``Completed`` message.

Runs on a broker worker thread, never on an actor's thread.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import time
from collections.abc import Iterator
from typing import Any

import litellm
from litellm.exceptions import ModelNotMappedError

from ..config.models import LLMConfig
from ..messages.protocol import Complete, Completed, ToolCall
from . import direct, http_pool
from .credentials import require_key

http_pool.install()  # the broker's threads share one pool (encode/httpcore#1110)

logger = logging.getLogger(__name__)
litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banner before an error


def _can_skip_mcp() -> bool:
    """Whether this litellm's ``completion`` takes ``_skip_mcp_handler`` (1.106 does)."""
    completion = inspect.unwrap(litellm.completion)  # under litellm's @client wrapper
    code = getattr(completion, "__code__", None)
    return code is not None and "_skip_mcp_handler" in code.co_consts


SKIP_MCP = _can_skip_mcp()
"""trouper's tools are plain functions, never MCP gateway tools: litellm is told so, and
then neither imports its MCP handlers (the ``mcp`` package, starlette...: ~0.4 s of CPU and
tens of MB in the broker) nor checks every tool for a gateway URL. Another litellm
without the switch imports them on its first call with tools, as before."""


_warmed = False


def preload_first_call() -> None:
    """Import now what litellm loads on its first call: the tokenizer it hands every
    provider (tiktoken's cl100k, ~0.14 s of CPU), the HTTP transport (httpcore, h11, h2),
    and what its first completion imports (provider configs, the proxy's types: ~80 ms),
    loaded by one completion litellm answers itself (``mock_response``: nothing is sent).
    Called where an actor system is opened, so every broker forked from there shares them
    instead of paying for them on its first request. The completion is skipped when the
    program set litellm callbacks: they would hear of it."""
    global _warmed
    for name in ("httpcore", "h11", "h2.connection"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    with contextlib.suppress(Exception):  # another litellm may keep it elsewhere, or not
        litellm.main.encoding  # noqa: B018 - the module's lazy attribute loads it
    if _warmed or direct.litellm_listening() or _internal_call is None:
        return
    _warmed = True
    tool = {"type": "function", "function": {"name": "warm_up", "parameters": {
        "type": "object", "properties": {}}}}
    with contextlib.suppress(Exception), _no_litellm_logging():  # only a warm-up: if this
        litellm.completion(model="openai/trouper-warm-up", api_key="unused",  # litellm fails,
                           messages=[{"role": "user", "content": "-"}],  # the first call pays
                           tools=[tool], mock_response="-", num_retries=0,
                           **({"_skip_mcp_handler": True} if SKIP_MCP else {}))


try:  # litellm's own switch for calls made inside litellm (no success logging)
    from litellm._internal_context import is_internal_call as _internal_call
except ImportError:  # pragma: no cover - another litellm: it logs as before
    _internal_call = None


@contextlib.contextmanager
def _no_litellm_logging() -> Iterator[None]:
    """Skip litellm's success logging when nobody listens to it: with no callback set, it
    still builds a logging payload and prices the call again on a background thread for
    every call (a walk of the whole history: a fifth to a third of a call's CPU at 200
    messages, measured). A program that sets litellm callbacks before ``Trouper()``
    keeps them."""
    if direct.litellm_listening() or _internal_call is None:
        yield
        return
    token = _internal_call.set(True)
    try:
        yield
    finally:
        _internal_call.reset(token)


SESSION_HEADER = "X-Trouper-Session"
TURN_HEADER = "X-Trouper-Turn"


def call_headers(request: Complete) -> dict[str, str]:
    """The headers trouper adds to a call: whose it is, for a provider's logs."""
    return {SESSION_HEADER: request.session_id, TURN_HEADER: str(request.turn)}


def openai_params(request: Complete) -> dict[str, Any]:
    """The call's OpenAI parameters that trouper sets (tools, temperature, max_tokens)."""
    cfg = request.llm
    params: dict[str, Any] = {}
    if request.tools:
        params["tools"] = request.tools
    if cfg.temperature is not None:
        params["temperature"] = cfg.temperature
    if cfg.max_output_tokens is not None:
        params["max_tokens"] = cfg.max_output_tokens
    return params


def completion_kwargs(request: Complete, model: str | None = None) -> dict[str, Any]:
    """The keyword arguments for ``litellm.completion`` (no retries: the broker owns them)."""
    cfg = request.llm
    kwargs: dict[str, Any] = {
        "model": model or cfg.model,
        "messages": request.messages,
        "timeout": cfg.timeout_s,
        "num_retries": 0,
        "max_retries": 0,
        "extra_headers": call_headers(request),
        **openai_params(request),
    }
    if request.tools and SKIP_MCP:
        kwargs["_skip_mcp_handler"] = True
    if cfg.base_url:
        kwargs["api_base"] = cfg.base_url
    if cfg.api_key is not None:
        kwargs["api_key"] = cfg.api_key.get_secret_value()
    return kwargs


def complete(
    request: Complete, model: str | None = None, attempts: int = 1
) -> tuple[Completed, dict[str, str]]:
    """Call the model once; return the answer and the provider's response headers
    (lower-cased, for the rate-limit gate). Raises litellm's exception on failure, and
    MissingCredentials, sending nothing, when no key is to be had (this process's
    environment is the one the actor system started with)."""
    require_key(request.llm, model)
    started = time.monotonic()
    model = model or request.llm.model
    if direct.takes(request.llm, model):
        response = direct.complete(request.llm, model, request.messages,
                                   openai_params(request), call_headers(request))
    else:
        with _no_litellm_logging():
            response = litellm.completion(**completion_kwargs(request, model))
    latency_s = time.monotonic() - started
    headers = getattr(response, "_response_headers", None) or {}
    lowered = {str(k).lower(): str(v) for k, v in dict(headers).items()}
    return to_completed(request, response, latency_s, attempts), lowered


def to_completed(
    request: Complete, response: Any, latency_s: float, attempts: int = 1
) -> Completed:
    """Convert a litellm ``ModelResponse``."""
    message = response.choices[0].message
    calls = [
        ToolCall(
            id=call.id or "",
            name=call.function.name or "",
            arguments=call.function.arguments or "",
        )
        for call in (getattr(message, "tool_calls", None) or [])
    ]
    usage = getattr(response, "usage", None)
    prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    return Completed(
        request_id=request.request_id,
        session_id=request.session_id,
        content=message.content or "",
        tool_calls=calls,
        model=str(getattr(response, "model", "") or request.llm.model),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost_usd=cost_of(request.llm, response, prompt_tokens, completion_tokens),
        latency_s=latency_s,
        attempts=attempts,
    )


def cost_of(cfg: LLMConfig, response: Any, prompt_tokens: int, completion_tokens: int) -> float:
    """Configured prices when given, else litellm's price list, else 0 (unknown model)."""
    if cfg.input_cost_per_token is not None or cfg.output_cost_per_token is not None:
        return prompt_tokens * (cfg.input_cost_per_token or 0.0) + completion_tokens * (
            cfg.output_cost_per_token or 0.0
        )
    hidden = getattr(response, "_hidden_params", None) or {}
    known = hidden.get("response_cost")
    if isinstance(known, int | float):  # litellm priced it while building the response
        return float(known)
    unpriced = (str(getattr(response, "model", "")), str(hidden.get("custom_llm_provider")))
    if _UNPRICED.get(unpriced) == len(litellm.model_cost):
        return 0.0
    try:
        return float(litellm.completion_cost(completion_response=response) or 0.0)
    except ModelNotMappedError:
        _UNPRICED[unpriced] = len(litellm.model_cost)
        return 0.0
    except Exception:  # noqa: BLE001 - litellm raises for models it cannot price
        return 0.0


_UNPRICED: dict[tuple[str, str], int] = {}
"""(model, provider) litellm has no price for -> the size of its price list then. Finding
that out looks the model up four ways on every call (0.05 ms of a 1 ms call at 20 steps);
a price the program registers later (``litellm.register_model``) grows the list, and is
asked for."""
