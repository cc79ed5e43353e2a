"""A session's secrets file: the one file that holds secret values (I7, docs/promises.md).

``<home>/sessions/<id>/secrets.json``, 0600 in a 0700 folder, written by the API when a
session starts and read back by whatever shows a stored session (so what it shows is
masked). Light on purpose: no actor system, no litellm, so ``trouper events`` stays quick.
"""

from __future__ import annotations

import json

from pydantic import SecretStr

from ..config.models import LLMConfig, RemoteRuntime, SessionConfig
from ..home.paths import Home, write_private
from .masking import LLM_KEY_NAME, RUNTIME_TOKEN_NAME, remember_secrets


def write_session_secrets(home: Home, session_id: str, secrets: dict[str, str],
                          llm: LLMConfig, runtime_token: str | None = None) -> None:
    """Write the file, owner-only whatever the umask, whole and durably
    (``paths.write_private``): the session can only be restored with it (its secrets, its
    key), so a host crash just after the start must leave it whole or absent."""
    path = home.secrets_path(session_id)
    data = {"secrets": secrets,
            "llm_api_key": llm.api_key.get_secret_value() if llm.api_key else None,
            "runtime_token": runtime_token}
    write_private(path, json.dumps(data), durable=True)


def read_secrets(home: Home, session_id: str) -> tuple[dict[str, str], str | None]:
    """A session's sandbox secrets and LLM API key from its secrets file (empty, None
    when it has none)."""
    path = home.secrets_path(session_id)
    if not path.exists():
        return {}, None
    data = json.loads(path.read_text())
    return dict(data.get("secrets") or {}), data.get("llm_api_key")


def remember_session_secrets(home: Home, session_id: str) -> None:
    """Teach this process a stored session's values, so what it shows of the session is
    masked (e.g. the CLI's ``show``; the log itself was stored masked)."""
    secrets, api_key = read_secrets(home, session_id)
    token = read_runtime_token(home, session_id)
    remember_secrets([*sorted(secrets.items()), *([(LLM_KEY_NAME, api_key)] if api_key else []),
                      *([(RUNTIME_TOKEN_NAME, token)] if token else [])])


# -- a remote runtime's token: in the secrets file, never in the store -------------------


def read_runtime_token(home: Home, session_id: str) -> str | None:
    """The remote runtime token kept in a session's secrets file, if any."""
    path = home.secrets_path(session_id)
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("runtime_token")


def runtime_token(config: SessionConfig) -> str | None:
    """The token a session's remote runtime was given (None: none, or read from env)."""
    runtime = config.runtime
    if isinstance(runtime, RemoteRuntime) and runtime.token is not None:
        return runtime.token.get_secret_value()
    return None


def without_runtime_token(config: SessionConfig) -> SessionConfig:
    """``config`` as the store may hold it: a remote runtime's token left out (None)."""
    if runtime_token(config) is None:
        return config
    return config.model_copy(update={"runtime": config.runtime.model_copy(
        update={"token": None})})


def with_runtime_token(config: SessionConfig, token: str | None) -> SessionConfig:
    """A stored ``config`` with its remote runtime's token put back from the secrets file."""
    if token is None or not isinstance(config.runtime, RemoteRuntime):
        return config
    return config.model_copy(update={"runtime": config.runtime.model_copy(
        update={"token": SecretStr(token)})})
