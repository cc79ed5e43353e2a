"""``trouper config show|path``: the values ``trouper run`` would use, and where each came
from; the files it reads (docs/operations.md, "Config files").

The API key is never printed: only the name of the variable that holds it, and whether
that variable is set.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..config.files import KEYS, PROJECT_FILE, ConfigFiles, locate_config_files, shown_path
from ..config.layers import (
    FLAG,
    Resolved,
    keys_from_env,
    resolve_keys,
    resolve_mcp,
    resolve_settings,
)
from .run_defaults import read_files
from .support import home_option

workspace_option = click.option(
    "--workspace", type=click.Path(file_okay=False, path_type=Path),
    help="Find the project file from this folder, as 'trouper run --workspace' does "
         "(default: the current folder).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def run_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """``run``'s flags of the keys, unset unless given: 'config show --runtime docker'
    shows what 'trouper run --runtime docker' would take."""
    for key in reversed(list(KEYS.values())):
        if isinstance(key.default, bool):
            option = click.option(key.flag, key.name, is_flag=True, default=None,
                                  flag_value=True, help=f"As run's {key.flag}.")
        else:
            kind = type(key.default) if key.default is not None else str
            option = click.option(key.flag, key.name, type=kind, default=None,
                                  help=f"As run's {key.flag}.")
        command = option(command)
    return command


@click.group()
def config() -> None:
    """Show the defaults trouper takes from the config files and the environment."""


@config.command()
@home_option
@workspace_option
@json_option
@run_flags
def show(home: Path | None, workspace: Path | None, as_json: bool, **flags: Any) -> None:
    """Print each value 'trouper run' would use and where it came from: a flag given here
    (as to run), env TROUPER_*, the project's .trouper.toml, your config.toml, or the
    default."""
    files = read_files(home, workspace or Path.cwd())
    for name, value in flags.items():
        if value is not None and (why := KEYS[name].check(value)):
            raise click.BadParameter(why, param_hint=KEYS[name].flag)
    given = {**keys_from_env(), **{name: Resolved(value, FLAG)
                                   for name, value in flags.items() if value is not None}}
    keys = resolve_keys(files, given)
    settings = resolve_settings(files)
    servers = resolve_mcp(files)
    if as_json:
        click.echo(json.dumps({"files": _files_json(files),
                               "keys": {k: _key_json(k, r) for k, r in keys.items()},
                               "settings": {k: _json(r) for k, r in settings.items()},
                               "mcp": {k: _json(r) for k, r in servers.items()}},
                              indent=2))
        return
    _print_files(files)
    click.echo("\nkeys (flag > env > project file > your file > default)")
    _print_rows([(name, _shown_value(name, r), r.source) for name, r in keys.items()])
    click.echo("\nsettings ([settings] in a file; env TROUPER_<NAME>)")
    _print_rows([(name, _plain(r.value), r.source) for name, r in settings.items()])
    if servers:
        click.echo("\nmcp servers ([mcp.NAME] in a file; run --mcp adds or replaces one)")
        _print_rows([(name, _server_text(r.value), r.source) for name, r in servers.items()])


def _server_text(entry: dict[str, Any]) -> str:
    """``sh mcp_server.sh`` or the URL: what a server is (its env and headers hold
    placeholders only, and are left out)."""
    if "url" in entry:
        return str(entry["url"])
    return shlex.join(str(word) for word in entry["command"])


@config.command()
@home_option
@workspace_option
@json_option
def path(home: Path | None, workspace: Path | None, as_json: bool) -> None:
    """List the files trouper reads, and whether each exists."""
    start = workspace or Path.cwd()
    files = locate_config_files(home, start)
    if as_json:
        click.echo(json.dumps(_files_json(files, start), indent=2))
        return
    _print_files(files, start)


def _files_json(files: ConfigFiles, start: Path | None = None) -> dict[str, Any]:
    project = files.project_path
    return {"user": {"path": str(files.user_path), "exists": files.user_path.is_file()},
            "project": {"path": str(project) if project else None,
                        "exists": project is not None,
                        **({"searched_from": str(start)} if start is not None else {})},
            "ignored": [{"path": str(p), "why": why} for p, why in files.ignored]}


def _print_files(files: ConfigFiles, start: Path | None = None) -> None:
    user = files.user_path
    click.echo(f"user     {shown_path(user)}  "
               f"({'exists' if user.is_file() else 'not there: create it to set defaults'})")
    if files.project_path is not None:
        click.echo(f"project  {shown_path(files.project_path)}  (exists)")
    else:
        where = f" from {shown_path(start)}" if start is not None else ""
        click.echo(f"project  none: no {PROJECT_FILE} found{where} (looked in the folder "
                   "and its parents, up to your home folder)")
    for ignored, why in files.ignored:
        click.echo(f"ignored  {shown_path(ignored)}  ({why})")


def _print_rows(rows: list[tuple[str, str, str]]) -> None:
    name_width = max(len(r[0]) for r in rows) + 2
    value_width = max(len(r[1]) for r in rows) + 2
    for name, value, source in rows:
        click.echo(f"  {name:<{name_width}}{value:<{value_width}}{source}")


def _shown_value(name: str, resolved: Resolved) -> str:
    if name == "api_key_env":
        if resolved.value is None:
            return "- (the provider's usual variable)"
        state = "set" if os.environ.get(resolved.value, "").strip() else "NOT SET"
        return f"{resolved.value} ({state})"
    return _plain(resolved.value)


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _json(resolved: Resolved) -> dict[str, Any]:
    return {"value": resolved.value, "source": resolved.source}


def _key_json(name: str, resolved: Resolved) -> dict[str, Any]:
    shown = _json(resolved)
    if name == "api_key_env" and resolved.value is not None:
        shown["set"] = bool(os.environ.get(resolved.value, "").strip())
    return shown
