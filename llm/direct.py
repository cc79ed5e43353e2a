"""The direct route: a model call to an OpenAI-compatible endpoint, built and read by
litellm's own provider config and sent by litellm's HTTP handler, without litellm's
dispatcher.

Why: ``litellm.completion`` wraps the one HTTP request in work trouper does not use. At
200 messages it cost 3.3 ms of CPU a call (its ``@client`` wrapper and logging object,
optional-parameter validation, two walks of the messages to check and strip them, the
price computed twice); the same request built by the same ``transform_request``, sent by
the same handler, read by the same ``transform_response`` and its errors mapped by the
same ``exception_type`` cost 1.6 ms (a micro-benchmark against the fake server in one
process; the broker's CPU a step in ``bench/profile_step.py`` went from 6.4 to 4.4 ms).
trouper still calls the model through litellm: only the dispatcher around the provider's
code is skipped.

The route is taken only where litellm itself makes the call as one JSON POST and nothing
would miss the dispatcher (``takes``):
- the provider is one of ``DIRECT_PROVIDERS``, and the config names the endpoint
  (``base_url``): a vLLM, an OpenAI-compatible gateway, the fake model;
- the key is given, or the provider needs none (``hosted_vllm``);
- no litellm callback is set (a program's callbacks hear of every call), nor the
  ``litellm.api_key`` or ``litellm.headers`` a program may set for every call;
- the ``llm_route`` setting is ``direct`` (the default; ``TROUPER_LLM_ROUTE=litellm``
  sends every call through ``litellm.completion``).

``tests/test_llm_direct.py`` checks the two routes send the same request and give the
same answer, and the same error class, status and retry hint for each failure.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import litellm
from litellm.litellm_core_utils.exception_mapping_utils import exception_type
from litellm.llms.custom_httpx.http_handler import HTTPHandler, get_httpx_client
from litellm.main import base_llm_http_handler
from litellm.types.utils import LlmProviders, ModelResponse
from litellm.utils import ProviderConfigManager

from ..config.models import LLMConfig
from ..config.settings import settings
from .checked import CheckedHistories, mentions_cache_control

DIRECT_PROVIDERS = frozenset({"hosted_vllm", "openai"})
"""Providers whose chat call litellm makes as one OpenAI-style JSON POST."""
_WIRE: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "openai": lambda data: json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode(),
}
"""A body written as the provider's own SDK writes it (litellm sends openai's through the
OpenAI SDK); any other provider's as litellm's HTTP handler writes it."""
_KEYLESS = frozenset({"hosted_vllm"})
"""Providers whose config finds the key itself (or sends a placeholder): no key needed."""


class _Unlogged:
    """Stands in for litellm's per-call logging object, which the provider config tells
    of the raw response (``post_call``, the one use in the code this route runs); with no
    callback set nobody reads it."""

    def post_call(self, *args: Any, **kwargs: Any) -> None:
        """Nothing listens."""


_UNLOGGED: Any = _Unlogged()


def _http_client() -> HTTPHandler:
    """litellm's kept-alive client, picked as litellm picks it for this provider."""
    return get_httpx_client(params={"ssl_verify": None})


@functools.cache
def _provider(model: str) -> tuple[str, str]:
    """(the model's name at its provider, the provider) as litellm reads ``model``."""
    name, provider, _, _ = litellm.get_llm_provider(model=model)
    return name, provider


@functools.cache
def _config(name: str, provider: str) -> Any:
    config = ProviderConfigManager.get_provider_chat_config(name, LlmProviders(provider))
    strip = getattr(config, "remove_cache_control_flag_from_messages_and_tools", None)
    if strip is not None:  # set once, before the config's first use (it is cached)
        config.remove_cache_control_flag_from_messages_and_tools = functools.partial(
            _strip_cache_control, strip)
    return config


_checked = CheckedHistories()
"""litellm's check of each message, done once per message of a history (``llm/checked``)."""


def forget_checks(messages: list[dict[str, Any]]) -> None:
    """Let go of the checks kept for a history the broker no longer holds."""
    _checked.forget(messages)


def _strip_cache_control(strip: Callable[..., Any], model: str, messages: list[Any],
                         tools: list[Any] | None = None) -> tuple[list[Any], list[Any] | None]:
    """litellm's stripping of ``cache_control`` keys, only where there is one: it walks
    every dict of the history, 0.8 ms at 200 steps, and trouper's own messages and tools
    never carry the key. One C-speed encoding (0.3 ms there) finds it, of each message
    once (``llm/checked``); a value that is the bare word, or anything JSON cannot encode,
    goes the whole walk."""
    if _checked.known_clean(messages):  # checked once each, when first seen
        absent = not mentions_cache_control(tools)
    else:
        absent = not mentions_cache_control([messages, tools])
    if absent:
        return messages, tools
    return strip(model=model, messages=messages, tools=tools)


def takes(cfg: LLMConfig, model: str) -> bool:
    """Whether a call to ``model`` under ``cfg`` goes the direct route."""
    if settings().llm_route != "direct" or not cfg.base_url or litellm_listening():
        return False
    if litellm.api_key or litellm.headers:  # the program's globals litellm.completion adds
        return False
    try:
        name, provider = _provider(model)
    except Exception:  # noqa: BLE001 - litellm raises several types for an unknown model
        return False
    if provider not in DIRECT_PROVIDERS or (cfg.api_key is None and provider not in _KEYLESS):
        return False
    if provider == "openai" and litellm.route_all_chat_openai_to_responses:
        return False
    return _config(name, provider) is not None


def litellm_listening() -> bool:
    """Whether the program set litellm callbacks (they hear of every call)."""
    return bool(litellm.success_callback or litellm._async_success_callback
                or litellm.callbacks or litellm.failure_callback or litellm.input_callback)


def complete(cfg: LLMConfig, model: str, messages: list[dict[str, Any]],
             params: dict[str, Any], headers: dict[str, str]) -> ModelResponse:
    """One call as litellm's provider code makes it: ``params`` are OpenAI parameters
    (``tools``, ``temperature``, ``max_tokens``). Raises litellm's exception types, as
    ``litellm.completion`` does."""
    name, provider = _provider(model)
    try:
        return _call(cfg, name, provider, messages, params, headers)
    except Exception as error:  # noqa: BLE001 - mapped as litellm maps it, then raised
        raise exception_type(model=name, custom_llm_provider=provider,
                             original_exception=error) from error


def _call(cfg: LLMConfig, name: str, provider: str, messages: list[dict[str, Any]],
          params: dict[str, Any], headers: dict[str, str]) -> ModelResponse:
    config = _config(name, provider)
    messages = _checked(messages)  # as litellm.completion does first
    api_base: str | None = cfg.base_url
    api_key = cfg.api_key.get_secret_value() if cfg.api_key is not None else None
    if provider in _KEYLESS:
        api_base, api_key = config._get_openai_compatible_provider_info(api_base, api_key)
    litellm_params: dict[str, Any] = {"api_base": api_base, "custom_llm_provider": provider}
    optional = config.map_openai_params(non_default_params=params, optional_params={},
                                        model=name, drop_params=litellm.drop_params is True)
    sent = config.validate_environment(headers=dict(headers), model=name, messages=messages,
                                       optional_params=optional,
                                       litellm_params=litellm_params,
                                       api_key=api_key, api_base=api_base)
    url = config.get_complete_url(api_base=api_base, api_key=api_key, model=name,
                                  optional_params=optional, litellm_params=litellm_params,
                                  stream=False)
    data = config.transform_request(model=name, messages=messages, optional_params=optional,
                                    litellm_params=litellm_params, headers=sent)
    raw = base_llm_http_handler._make_common_sync_call(
        sync_httpx_client=_http_client(), provider_config=config, api_base=url,
        headers=sent, data=data, timeout=cfg.timeout_s, litellm_params=litellm_params,
        logging_obj=_UNLOGGED,
        signed_json_body=_WIRE[provider](data) if provider in _WIRE else None)
    response = config.transform_response(
        model=name, raw_response=raw, model_response=ModelResponse(), logging_obj=_UNLOGGED,
        request_data=data, messages=messages, optional_params=optional,
        litellm_params=litellm_params, encoding=None, api_key=api_key)
    response._hidden_params.setdefault("custom_llm_provider", provider)
    return response
