"""``trouper run``'s and ``resume``'s options, completed from the config files.

click reads each option's flag and ``TROUPER_*`` variable; what neither gave comes from
the project's ``.trouper.toml``, then the user's ``config.toml``, then the default
(``config/layers.py``). The files' ``[settings]`` are handed to ``settings()`` here too, so
the actors this command forks see them. A value from a file or a variable applies only
where it means something (an ``image`` only to a docker runtime); the same value given
as a flag to a runtime it does not fit is a usage error, as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from ..config.files import KEYS, ConfigFiles, use_config_files
from ..config.layers import FLAG, Resolved, resolve_keys
from .support import USAGE, CliError

PARAMS = {"url": "runtime_url", "timeout": "timeout_s"}
"""A key's click parameter, where its name differs from the key's."""


def read_files(home: Path | None, project_from: Path | None) -> ConfigFiles:
    """The user's file of ``home`` and the project file found from ``project_from``;
    their settings become this process's (and its actors')."""
    return use_config_files(home, project_from)


def chosen(ctx: click.Context, files: ConfigFiles, *names: str) -> dict[str, Resolved]:
    """The keys ``names`` of the running command: its flags and variables, else the files,
    else the defaults."""
    given: dict[str, Resolved] = {}
    for name in names:
        param = PARAMS.get(name, name)
        source = ctx.get_parameter_source(param)
        if source is ParameterSource.COMMANDLINE:
            given[name] = Resolved(ctx.params[param], FLAG)
        elif source is ParameterSource.ENVIRONMENT:
            given[name] = Resolved(ctx.params[param], f"env {KEYS[name].env}")
    return resolve_keys(files, given, names)


def runtime_config(keys: dict[str, Resolved]) -> dict[str, Any]:
    """The runtime of a session from the chosen keys; a usage error names each source."""
    runtime, image, url = keys["runtime"], keys["image"], keys["url"]
    kind = runtime.value
    if kind == "docker" and image.value is None:
        raise _usage(f"--runtime docker ({_from(runtime)}) needs an image: give --image "
                     "IMAGE (or image = \"IMAGE\" in a config file)")
    if kind == "remote" and url.value is None:
        raise _usage(f"--runtime remote ({_from(runtime)}) needs the server's URL: give "
                     "--url URL (or url = \"URL\" in your own config file)")
    if image.source == FLAG and kind != "docker":
        raise _usage("--image goes with --runtime docker, and --runtime docker needs --image")
    if url.source == FLAG and kind != "remote":
        raise _usage("--url goes with --runtime remote, and --runtime remote needs --url")
    loose = [keys[n] for n in ("no_network", "unconfined")]
    if kind != "local":
        if any(k.source == FLAG and k.value for k in loose):
            raise _usage("--no-network and --unconfined go with --runtime local")
        return ({"kind": "docker", "image": image.value} if kind == "docker"
                else {"kind": "remote", "url": url.value})
    no_network, unconfined = (bool(k.value) for k in loose)
    if no_network and unconfined:
        given = [f"{n} {_from(keys[n])}" for n in ("no_network", "unconfined")
                 if keys[n].source != FLAG]
        raise _usage("--no-network needs the confinement that --unconfined turns off"
                     + (f" ({', '.join(given)})" if given else ""))
    return {"kind": "local", "network": not no_network, "confine": not unconfined}


def api_key_from(keys: dict[str, Resolved]) -> str | None:
    """The key in the variable ``api_key_env`` names (None: the provider's usual one)."""
    name = keys["api_key_env"].value
    if name is None:
        return None
    value = os.environ.get(name, "")
    if not value.strip():
        raise CliError(f"api_key_env ({_from(keys['api_key_env'])}) names the variable "
                       f"{name}, which is not set here: export {name}=YOUR_KEY in this "
                       "shell, or name the variable that holds your key", USAGE)
    return value


def confirm_policy(value: str | list[str]) -> Any:
    """``never``, ``always``, ``risky``, or the tool names (``run,write_file``)."""
    if isinstance(value, list):
        return [name.strip() for name in value if name.strip()]
    return value if value in ("never", "always", "risky") else [
        name.strip() for name in value.split(",") if name.strip()]


def _from(resolved: Resolved) -> str:
    return {"flag": "given as a flag", "default": "the default"}.get(
        resolved.source, f"from {resolved.source}")


def _usage(message: str) -> click.UsageError:
    return click.UsageError(message)
