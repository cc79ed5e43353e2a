"""What ``Trouper`` checks of its arguments before anything is made: the home, a chosen
session id, a request id, a workspace, a session's config (its errors masked).

Every refusal is a ``ConfigError`` naming its field (``InvalidRequest`` for an id the
store holds already), raised before any folder, store row or secrets file exists.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from ..config.checks import session_config
from ..config.models import LLMConfig, SessionConfig
from ..exceptions import ConfigError, InvalidRequest, MissingCredentials, UnknownSession
from ..home.paths import default_home
from ..security.masking import LLM_KEY_NAME, SecretMasker
from ..store import EventStore

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def checked_request_id(request_id: object) -> str:
    """A command's id as a caller gave it: a safe name of 64 characters at most."""
    if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
        raise ConfigError("request_id: letters, digits, '.', '_', ':' and '-', at most "
                          "64, starting with a letter or digit", field="request_id")
    return request_id


def free_id(store: EventStore, session_id: str) -> str:
    """A session id a caller chose: a safe folder name the store does not hold yet."""
    if not isinstance(session_id, str) or not SESSION_ID.fullmatch(session_id):
        raise ConfigError("session_id: letters, digits, '.', '_' and '-', at most 64, "
                          "starting with a letter or digit", field="session_id")
    try:
        store.session(session_id)
    except UnknownSession:
        return session_id
    raise InvalidRequest(f"session {session_id!r} already exists")


def check_trouper_args(home: str | os.PathLike[str] | None, ask_timeout_s: float) -> None:
    """``Trouper(...)``'s arguments, before anything is opened."""
    if not ask_timeout_s > 0:
        raise ConfigError("ask_timeout_s: must be greater than 0", field="ask_timeout_s")
    path = Path(home).expanduser() if home is not None else default_home()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"home: {path} exists and is not a folder", field="home")


def checked_config(
    task: str,
    llm: Mapping[str, Any] | LLMConfig,
    runtime: Any,
    workspace: Path,
    secrets: Mapping[str, str] | None,
    options: dict[str, Any],
    named_workspace: bool,
) -> SessionConfig:
    """The checked config (see ``config_check.session_config``, then the model's provider and
    key); every ConfigError leaves masked with the values it was given."""
    from ..llm.credentials import check_llm  # litellm, here: after the actors' fork

    try:
        config = session_config(task, llm, runtime, workspace, secrets or {}, options,
                                named_workspace=named_workspace)
        check_llm(config.llm)
    except ConfigError as exc:
        # not chained, so a printed traceback cannot show a refused input unmasked
        raise _masked_error(exc, llm, secrets) from None
    return config


def workspace_path(workspace: Any, home: Path) -> Path:
    """The absolute path of a workspace the user named; ConfigError if it is no path, or
    if it holds the trouper ``home`` (the agent's file tools and shell would reach every
    session's secrets)."""
    try:
        folder = Path(workspace).expanduser().resolve()
    except (TypeError, ValueError, OSError, RuntimeError) as exc:  # a NUL, a symlink loop
        raise ConfigError(f"workspace: not a usable path ({type(exc).__name__})",
                          field="workspace") from None
    home = home.resolve()
    if home == folder or folder in home.parents:
        raise ConfigError(f"workspace: {folder} holds the trouper home {home}, where every "
                          "session's secrets are: give the agent a folder inside it that "
                          "does not, or use another home (TROUPER_HOME)", field="workspace")
    return folder


def _masked_error(exc: ConfigError, llm: Any, secrets: Any) -> ConfigError:
    key = llm.get("api_key") if isinstance(llm, Mapping) else getattr(llm, "api_key", None)
    if isinstance(key, SecretStr):
        key = key.get_secret_value()
    values = {str(k): v for k, v in secrets.items() if isinstance(v, str)} if isinstance(
        secrets, Mapping) else {}
    masker = SecretMasker({**values, **({LLM_KEY_NAME: key} if isinstance(key, str) else {})})
    if isinstance(exc, MissingCredentials):
        return MissingCredentials(masker.mask_text(str(exc)), exc.names)
    field = masker.mask_text(exc.field) if exc.field else None
    return ConfigError(masker.mask_text(str(exc)), field=field)
