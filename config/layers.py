"""Which value wins, and where it came from: flag > environment > project file > user
file > default, for every key of the config files and every setting.

``resolve_keys`` takes what a command line gave (its flags and, as click read them, its
variables) and fills the rest from the files; ``keys_from_env`` reads the variables for a
command that has no such options (``trouper config show``). ``resolve_settings`` does the
same for ``Settings``; ``resolve_mcp`` gathers the files' MCP servers by name. Each value
comes back as a ``Resolved`` naming its source as ``config show`` prints it: ``flag``,
``env TROUPER_MODEL``, the file, or ``default``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigError
from .files import KEYS, ConfigFile, ConfigFiles
from .settings import Settings, env_name

DEFAULT = "default"
FLAG = "flag"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Resolved:
    """A value and where it came from."""

    value: Any
    source: str
    """``flag``, ``env NAME``, a file's path (``~`` for the user's home) or ``default``."""


def resolve_keys(files: ConfigFiles, given: Mapping[str, Resolved] | None = None,
                 names: tuple[str, ...] | None = None) -> dict[str, Resolved]:
    """Every key of ``names`` (default: all): from ``given`` (flags, variables), else the
    project file, else the user's, else the default. Raises ConfigError when a project
    file's ``confirm`` would ask less than the user's own choice."""
    given = given or {}
    chosen: dict[str, Resolved] = {}
    for name in names or tuple(KEYS):
        if name in given:
            chosen[name] = given[name]
            continue
        chosen[name] = Resolved(KEYS[name].default, DEFAULT)
        for layer in files.layers():
            if name in layer.keys:
                chosen[name] = Resolved(layer.keys[name], layer.label)
    if files.project is not None:
        if "confirm" in chosen and chosen["confirm"].source == files.project.label:
            _check_project_confirm(files.project, files.user)
        if "runtime" in chosen and chosen["runtime"].source == files.project.label:
            _check_project_runtime(files.project, files.user)
        _check_project_model(chosen, files.project, files.user)
    return chosen


def resolve_mcp(files: ConfigFiles) -> dict[str, Resolved]:
    """The MCP servers of the files by name, each with the file it came from: the user's,
    then the project's (a project's server of the same name replaces the user's)."""
    servers: dict[str, Resolved] = {}
    for layer in files.layers():
        for name, entry in layer.mcp.items():
            servers[name] = Resolved(entry, layer.label)
    return servers


def _check_project_model(chosen: dict[str, Resolved], project: ConfigFile,
                         user: ConfigFile | None) -> None:
    """A project's model may not send the key you named (``api_key_env``) to another
    provider than your own model's: the key would leave for a server you did not pick."""
    model, key_env = chosen.get("model"), chosen.get("api_key_env")
    if model is None or key_env is None or key_env.value is None \
            or model.source != project.label:
        return
    mine = user.keys.get("model") if user is not None else None
    if mine is not None and _provider(mine) == _provider(model.value):
        return
    yours = f"your model's ({mine})" if mine else "one you chose (you set no model)"
    raise ConfigError(
        f"{project.where('model')}: model = {model.value!r} would send the key in "
        f"{key_env.value} ({key_env.source}) to another provider than {yours}; give "
        "--model or TROUPER_MODEL, or set model in your own file", field="model")


def _provider(model: str) -> str:
    return model.split("/", 1)[0] if "/" in model else "openai"


def _check_project_runtime(project: ConfigFile, user: ConfigFile | None) -> None:
    """A project may not bring the agent's commands out of the sandbox you chose: your
    ``docker`` or ``remote`` runtime replaced by ``local`` (a shell on this machine)."""
    mine = user.keys.get("runtime", "local") if user is not None else "local"
    if project.keys["runtime"] != "local" or mine == "local":
        return
    raise ConfigError(
        f"{project.where('runtime')}: runtime = 'local' would run the agent's commands on "
        f"this machine instead of your own choice ({mine!r}, {user.label if user else ''});"
        " a project file may not weaken the sandbox: remove it there, or give --runtime",
        field="runtime")


def _check_project_confirm(project: ConfigFile, user: ConfigFile | None) -> None:
    """A project may ask for approval of more actions than the user's own choice, never
    fewer: ``never`` < a list of tools or ``risky`` < ``always``, and two different middle
    choices are not comparable."""
    mine = user.keys.get("confirm", "never") if user is not None else "never"
    theirs = project.keys["confirm"]
    if mine == "never" or theirs == "always" or _policy(mine) == _policy(theirs):
        return
    whose = user.label if user is not None and "confirm" in user.keys else "the default"
    raise ConfigError(
        f"{project.where('confirm')}: confirm = {theirs!r} would ask for your approval less "
        f"than your own choice ({mine!r}, {whose}); a project file may only ask for more: "
        "remove it there, or give --confirm", field="confirm")


def _policy(value: Any) -> Any:
    if isinstance(value, str) and value in ("never", "always", "risky"):
        return value
    names = value.split(",") if isinstance(value, str) else value
    return frozenset(n.strip() for n in names if n.strip())


def keys_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Resolved]:
    """The keys set by their ``TROUPER_*`` variables (an empty one counts as unset).
    Raises ConfigError naming a variable whose value is refused."""
    env = os.environ if environ is None else environ
    found: dict[str, Resolved] = {}
    for key in KEYS.values():
        text = env.get(key.env, "").strip()
        if not text:
            continue
        value = _typed(text, key.default)
        if (why := key.check(value)) is not None:
            shown = "" if key.name == "api_key_env" else f" (got {text!r})"
            raise ConfigError(f"{key.env}: {why}{shown}", field=key.env)
        found[key.name] = Resolved(value, f"env {key.env}")
    return found


def _typed(text: str, default: Any) -> Any:
    """A variable's text as the type of the key's default (a flag, a number)."""
    if isinstance(default, bool):
        lowered = text.lower()
        return True if lowered in _TRUE else False if lowered in _FALSE else text
    if isinstance(default, int | float):
        try:
            return type(default)(text)
        except ValueError:
            return text
    return text


def resolve_settings(files: ConfigFiles, environ: Mapping[str, str] | None = None
                     ) -> dict[str, Resolved]:
    """Every setting's value and source: its variable, the project file, the user's, the
    default. Raises ConfigError naming a variable whose value is refused."""
    env = os.environ if environ is None else environ
    layers = [layer.settings for layer in files.layers()]
    values = Settings.layered(layers, env)
    sources: dict[str, Resolved] = {}
    for name in Settings.model_fields:
        source = DEFAULT
        for layer in files.layers():
            if name in layer.settings:
                source = layer.label
        if env.get(env_name(name), "").strip():
            source = f"env {env_name(name)}"
        sources[name] = Resolved(getattr(values, name), source)
    return sources
