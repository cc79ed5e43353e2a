"""Which API key a model needs, and what to tell the user when it is missing or refused.

litellm knows which environment variables each provider reads
(``litellm.validate_environment``); trouper asks it, and refuses a session at once when
none of a provider's key variables is set and the config has no ``api_key``, instead of
finding out on the first call. Only *key* variables count (``*_API_KEY``, ``*_API_TOKEN``):
an API base, a version or a project has defaults or comes from elsewhere, and AWS
credentials also come from files and instance roles, so those are left to the provider.

The same check runs in the broker before each call (its environment is the one the actor
system started with, which may lack a variable set later in the caller's process), and a
provider's refusal (401/403) becomes a message that says what to set.
"""

from __future__ import annotations

import os
import re

import litellm

from ..config.checks import Problem, config_error
from ..config.models import LLMConfig
from ..exceptions import MissingCredentials
from .errors import sdk_refused_to_start

litellm.suppress_debug_info = True  # no "Provider List" banner: trouper says it in one line

API_KEY_FLAG = "api_key (CLI: --api-key)"
"""How a user passes a key explicitly, named in every credentials message."""
_KEY_VAR = re.compile(r"[A-Z0-9_]+_API_(KEY|TOKEN)\Z|[A-Z0-9_]+_AUTH_TOKEN\Z")


def provider_of(model: str) -> str | None:
    """litellm's provider for ``model`` (``openai`` for ``openai/gpt-4o``), or None when
    it knows none."""
    try:
        return litellm.get_llm_provider(model=model)[1]
    except Exception:  # noqa: BLE001 - litellm raises several types for an unknown model
        return None


def missing_key_vars(model: str, base_url: str | None = None) -> tuple[str, ...]:
    """The key variables the provider of ``model`` reads that are all unset (any one of
    them would do); empty when a key is set or the provider needs none."""
    found = litellm.validate_environment(model=model, api_base=base_url)
    return tuple(name for name in found.get("missing_keys", ())
                 if _KEY_VAR.match(name) and name not in os.environ)


def key_vars_in_use(model: str) -> dict[str, str]:
    """The set key variables the provider of ``model`` probably read (name -> value).

    litellm cannot say which variable it read without it being unset, so this is a
    convention: a key variable whose letters begin with the provider's
    (``OPENAI_API_KEY`` for ``openai``, ``TOGETHERAI_API_KEY`` for ``together_ai``).
    Used to name the variable in a message and to mask its value, never to decide.
    """
    provider = provider_of(model)
    if not provider:
        return {}
    prefix = _letters(provider)
    return {name: value for name, value in os.environ.items()
            if _KEY_VAR.match(name) and _letters(name).startswith(prefix) and value}


def check_llm(llm: LLMConfig) -> None:
    """Refuse, before anything is created, a model litellm cannot route or whose key is
    nowhere: raises ConfigError (MissingCredentials for the key)."""
    models = [("llm.model", llm.model)] + [
        (f"llm.fallbacks.{i}", model) for i, model in enumerate(llm.fallbacks)]
    unknown: list[Problem] = [
        (field, f"litellm knows no provider for {model!r}; write it as provider/model, "
                "e.g. openai/gpt-4o or hosted_vllm/NAME")
        for field, model in models if provider_of(model) is None]
    if unknown:
        raise config_error(unknown)
    for _, model in models:
        require_key(llm, model)


def require_key(llm: LLMConfig, model: str | None = None) -> None:
    """Raise MissingCredentials when ``model`` (default: the config's) needs a key that is
    neither in the config nor in this process's environment."""
    model = model or llm.model
    if llm.api_key is not None:
        return
    names = missing_key_vars(model, llm.base_url)
    if names:
        raise MissingCredentials(
            f"llm.api_key: {model} needs an API key: set {' or '.join(names)} or pass "
            f"{API_KEY_FLAG}", names)


def auth_hint(llm: LLMConfig, model: str) -> str:
    """What the user should set after the provider refused the call's credentials."""
    if llm.api_key is not None:
        return f"check the {API_KEY_FLAG} given"
    names = missing_key_vars(model, llm.base_url) or tuple(key_vars_in_use(model))
    if not names:
        return f"set the provider's API key variable or pass {API_KEY_FLAG}"
    return f"set {' or '.join(names)} or pass {API_KEY_FLAG}"


def auth_message(error: BaseException, llm: LLMConfig, model: str) -> str:
    """The reason an ``auth`` failure ends the session with: what happened, what to set,
    then the provider's own words (masked by the caller)."""
    hint = auth_hint(llm, model)
    if isinstance(error, MissingCredentials) or sdk_refused_to_start(error):
        return f"no API key reached the model provider for {model}: {hint}"
    status = getattr(error, "status_code", None)
    said = f"{type(error).__name__}: {error}"
    return f"the model provider refused the credentials ({status}): {hint} ({said})"


def _letters(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())
