"""Checking what ``start_session`` is given: every problem found, named by its field.

``session_config`` builds the ``SessionConfig`` or raises one ``ConfigError`` that names
each problem (``field: reason``), without echoing a value that may be a secret.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ..exceptions import ConfigError
from ..messages.text import LONE_SURROGATE
from ..runtimes import BACKENDS
from .models import _RUNTIME_ADAPTER, LLMConfig, LocalRuntime, SessionConfig, _runtime_by_name

ARGUMENTS = frozenset({"task", "llm", "runtime", "workspace", "secret_names"})
"""Fields of SessionConfig set from start_session's own arguments, never as options."""
OPTIONS = tuple(sorted(set(SessionConfig.model_fields) - ARGUMENTS))
"""The names ``start_session(**options)`` accepts."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Problem = tuple[str, str]
"""``(field, reason)``."""


def session_config(
    task: str, llm: Any, runtime: Any, workspace: Path, secrets: Any,
    options: Mapping[str, Any], *, named_workspace: bool = True,
) -> SessionConfig:
    """The validated config; raises ConfigError naming every problem found.

    Reads the file system (the workspace, when the user ``named`` it: the default one
    under the home is trouper's own) but writes nothing.
    """
    problems = [*secret_problems(secrets), *runtime_problems(runtime)]
    if named_workspace:
        problems += workspace_problems(workspace)
    # the only argument **options can carry: the others bind to start_session's parameters
    problems += [(name, "set from start_session's secrets=, not an option")
                 for name in options if name in ARGUMENTS]
    data = {k: v for k, v in options.items() if k not in ARGUMENTS}
    names = tuple(sorted(map(str, secrets))) if isinstance(secrets, Mapping) else ()
    try:
        config = SessionConfig(
            task=task, llm=llm, workspace=str(workspace), secret_names=names,
            runtime=runtime if not runtime_problems(runtime) else LocalRuntime(),  # reported
            **data)
    except ValidationError as exc:
        problems += pydantic_problems(exc)
    if problems:
        raise config_error(problems)
    return config


def config_error(problems: list[Problem]) -> ConfigError:
    """One error naming every problem; its ``field`` is the first one's."""
    text = "; ".join(f"{field}: {reason}" if field else reason for field, reason in problems)
    return ConfigError(text, field=problems[0][0] or None)


def pydantic_problems(error: ValidationError) -> list[Problem]:
    """Each of pydantic's errors as ``(dotted.path, reason)``, without the input."""
    return [(".".join(str(part) for part in item["loc"]), _reason(item))
            for item in error.errors()]


def _reason(item: ErrorDetails) -> str:
    loc = item["loc"]
    if item["type"] == "missing":
        return "is required"
    if item["type"] == "extra_forbidden":
        known = LLMConfig.model_fields if loc[:1] == ("llm",) else OPTIONS
        return "unknown " + ("field" if loc[:1] == ("llm",) else "option") + _suggest(
            str(loc[-1]), list(known))
    msg = item["msg"].removeprefix("Value error, ")
    if msg.startswith("Input should be"):
        msg = "must be" + msg[len("Input should be"):]
    if item["type"].endswith(("_type", "_parsing")):  # what was given helps then
        msg += f" (got {_shown(item['input'])})"
    return msg


def _shown(value: Any) -> str:
    """A refused input as the message shows it: a short scalar whole (the caller masks
    it: cutting it here could leave half a secret unmasked), anything else by its type."""
    if isinstance(value, str | int | float | bool) and len(repr(value)) <= 80:
        return repr(value)
    return f"a {type(value).__name__}"


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]}?" if close else f"; known: {', '.join(sorted(known))}"


def runtime_problems(runtime: Any) -> list[Problem]:
    """A runtime is a name, a mapping with a ``kind`` or a runtime config, of a backend
    that is built."""
    known = ", ".join(sorted(BACKENDS))
    try:
        config = _RUNTIME_ADAPTER.validate_python(_runtime_by_name(runtime))
    except ValidationError as exc:
        kind = runtime.get("kind") if isinstance(runtime, Mapping) else runtime
        if isinstance(kind, str) and kind in ("local", "docker", "remote"):
            return [(f"runtime.{field}", reason) for field, reason in pydantic_problems(exc)]
        return [("runtime", f"unknown runtime {_shown(runtime)}; known runtimes: {known}")]
    if config.kind not in BACKENDS:
        return [("runtime", f"the {config.kind} runtime is not available yet; "
                            f"known runtimes: {known}")]
    return runtime_needs(config)


def runtime_needs(config: Any) -> list[Problem]:
    """What a runtime needs that this machine can be seen to lack, before anything starts
    (no network, no engine asked): the docker CLI and SDK; a remote runtime's token."""
    if config.kind == "docker":
        if shutil.which("docker") is None:
            return [("runtime", "the docker runtime needs the docker CLI on PATH (the "
                                "shell runs through docker exec): install Docker, or use "
                                "the local runtime")]
        if importlib.util.find_spec("docker") is None:
            return [("runtime", "the docker runtime needs the docker Python package "
                                "(pip install docker)")]
    if config.kind == "remote" and config.token is None and not (
            config.token_env and os.environ.get(config.token_env)):
        where = f"${config.token_env}" if config.token_env else "token_env"
        return [("runtime.remote.token", f"no token for the runtime server: set {where} "
                 "to the token in its --token-file, or give RemoteRuntime(token=)")]
    return []


def secret_problems(secrets: Any) -> list[Problem]:
    """Secrets become the sandbox shell's environment: names must be variable names, and
    values strings without NUL. A reason never quotes a value."""
    if not isinstance(secrets, Mapping):
        return [("secrets", "must be a mapping of variable name to value")]
    problems: list[Problem] = []
    for name, value in secrets.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            problems.append((f"secrets[{name!r}]", "not a valid environment variable name "
                             "(letters, digits and _, not starting with a digit)"))
        elif not isinstance(value, str):
            problems.append((f"secrets.{name}", "the value must be a string"))
        elif "\0" in value:
            problems.append((f"secrets.{name}", "the value holds a NUL character, which "
                             "an environment variable cannot"))
    return problems


def workspace_problems(path: Path) -> list[Problem]:
    """Why the agent could not work in ``path`` (absolute), which trouper creates only if
    its parent exists: a folder the user named is never made with parents."""
    if LONE_SURROGATE.search(str(path)):
        return [("workspace", "the path holds bytes that are not UTF-8; rename it")]
    if path.exists() and not path.is_dir():
        return [("workspace", f"{path} exists and is not a folder: choose a folder (or a "
                              "path to make one at)")]
    target = path if path.exists() else path.parent
    if not target.is_dir():
        return [("workspace", f"{target} does not exist (it would hold {path}); "
                              "create it first")]
    if not os.access(target, os.W_OK | os.X_OK):
        verb = "is not writable" if target == path else "is not writable, so " \
            f"{path.name} cannot be created in it"
        return [("workspace", f"{target} {verb}: choose another workspace, or fix its "
                              "permissions")]
    return []
