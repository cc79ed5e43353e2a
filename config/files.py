"""The config files: the user's ``<home>/config.toml`` and a project's ``.trouper.toml``.

Both hold the same keys (``KEYS``: the defaults of ``trouper run``), a ``[settings]``
table (the fields of ``Settings``) and ``[mcp.NAME]`` tables (MCP servers:
``config/mcp_files.py``). ``load_config_files`` finds, reads and checks them;
any problem is one ``ConfigError`` naming the file, the line and the fix. A project file
comes with a repository its user may not have written, so the keys that decide where a
key, a token or the agent's commands go, or that loosen the sandbox, are refused there
(``PROJECT_REFUSED``); the user's own file may set them. No file ever holds a secret:
``api_key`` is refused everywhere, ``api_key_env`` names the variable that holds it.

Example:
    >>> parse_text('model = "openai/gpt-4o"', Path("config.toml"), "user").keys
    {'model': 'openai/gpt-4o'}
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from ..exceptions import ConfigError
from ..home.paths import default_home
from .mcp_files import MCP_TABLE, mcp_problems, server_entries
from .settings import Settings, use_file_settings

logger = logging.getLogger(__name__)

USER_FILE = "config.toml"
"""The user's file, in the trouper home."""
PROJECT_FILE = ".trouper.toml"
"""A project's file, in the folder trouper is run from or a parent of it."""
SETTINGS_TABLE = "settings"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
FileKind = Literal["user", "project"]


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "must be a non-empty string"


def _http_url(value: Any) -> str | None:
    if not isinstance(value, str) or not re.match(r"https?://\S+\Z", value):
        return "must be an http:// or https:// URL in quotes"
    return None


def _env_name(value: Any) -> str | None:
    if isinstance(value, str) and ENV_NAME.match(value):
        return None  # the value is not quoted back: it may be a key pasted by mistake
    return ("must be the NAME of an environment variable that holds the key (letters, "
            "digits and _), e.g. api_key_env = \"OPENAI_API_KEY\", never the key itself")


def _runtime(value: Any) -> str | None:
    return None if value in ("local", "docker", "remote") else \
        "must be \"local\", \"docker\" or \"remote\""


def _flag(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false (no quotes)"


def _confirm(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return None
    return ("must be \"never\", \"always\", \"risky\", or tool names: \"run,write_file\" "
            "or [\"run\", \"write_file\"]")


def _iterations(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return None if ok else "must be a whole number of at least 1 (no quotes)"


def _seconds(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1e9
    return None if ok else "must be a number of seconds greater than 0 (no quotes)"


@dataclass(frozen=True)
class Key:
    """One key of the files: a default of ``trouper run``."""

    name: str
    check: Callable[[Any], str | None]
    """Why a value is refused, or None."""
    default: Any
    """``trouper run``'s default; None: not set."""
    flag: str
    """The command-line option that beats every other source."""

    @property
    def env(self) -> str:
        """The variable that beats the files: ``TROUPER_`` plus the name in capitals."""
        return "TROUPER_" + self.name.upper()


KEYS: dict[str, Key] = {k.name: k for k in (
    Key("model", _text, None, "--model"),
    Key("base_url", _http_url, None, "--base-url"),
    Key("api_key_env", _env_name, None, "--api-key-env"),
    Key("runtime", _runtime, "local", "--runtime"),
    Key("image", _text, None, "--image"),
    Key("url", _http_url, None, "--url"),
    Key("no_network", _flag, False, "--no-network"),
    Key("unconfined", _flag, False, "--unconfined"),
    Key("confirm", _confirm, "never", "--confirm"),
    Key("max_iterations", _iterations, 50, "--max-iterations"),
    Key("timeout", _seconds, 3600.0, "--timeout"),
)}
"""The top-level keys of a config file, in the order ``config show`` lists them."""

PROJECT_REFUSED: dict[str, Callable[[Any], str | None]] = {
    "base_url": lambda _: "a project file may not choose the server your API key is sent to",
    "api_key_env": lambda _: "a project file may not choose which of your environment "
                             "variables is sent as the API key",
    "url": lambda _: "a project file may not choose the runtime server that gets your "
                     "commands and your runtime token",
    "unconfined": lambda v: "a project file may not turn the sandbox's confinement off"
                            if v else None,
    "no_network": lambda v: None if v else "a project file may not open the sandbox's "
                                           "network",
    "settings.sandbox_uid": lambda _: "a project file may not choose the account a Docker "
                                      "sandbox runs as (the workspace is handed to it)",
}
"""Keys a project file may not set (or not to that value), with the reason."""


@dataclass(frozen=True)
class ConfigFile:
    """One file, read and checked."""

    path: Path
    kind: FileKind
    keys: dict[str, Any] = field(default_factory=dict)
    """The top-level keys it sets."""
    settings: dict[str, Any] = field(default_factory=dict)
    """Its ``[settings]`` table."""
    lines: dict[str, int] = field(default_factory=dict)
    """The line of each key (``"model"``, ``"settings.rate_window_s"``), for messages."""
    mcp: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Its ``[mcp.NAME]`` tables: MCP servers by name, as the session's ``mcp`` entries."""

    @property
    def label(self) -> str:
        """The file as ``config show`` names a value's source."""
        return shown_path(self.path)

    def where(self, key: str) -> str:
        """``~/.trouper/config.toml, line 3``: where ``key`` is set."""
        line = self.lines.get(key)
        return f"{self.label}, line {line}" if line else self.label


@dataclass(frozen=True)
class ConfigFiles:
    """The files one command reads: the user's and, if one is found, a project's."""

    user_path: Path
    """Where the user's file is looked for (it may not exist)."""
    user: ConfigFile | None = None
    project_path: Path | None = None
    """The project file found (None: none in the folder or its parents)."""
    project: ConfigFile | None = None
    ignored: tuple[tuple[Path, str], ...] = ()
    """Project files passed over, and why (another user owns them)."""

    def layers(self) -> list[ConfigFile]:
        """The files read, lowest precedence first (the user's, then the project's)."""
        return [f for f in (self.user, self.project) if f is not None]


def shown_path(path: Path) -> str:
    """``path`` with the user's home as ``~``."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def user_file_path(home: Path | None) -> Path:
    """``<home>/config.toml``: ``home`` is ``--home``, else ``TROUPER_HOME`` or ~/.trouper."""
    return (home or default_home()).expanduser().resolve() / USER_FILE


def find_project_file(start: Path) -> Path | None:
    """The nearest ``.trouper.toml`` in ``start`` or a parent, up to but not including the
    user's home folder (whose defaults belong in the user's file), else up to ``/``."""
    here = start.expanduser().absolute()
    while not here.exists() and here != here.parent:  # a workspace not made yet
        here = here.parent
    here = here.resolve()
    stop = Path.home().resolve()
    for folder in (here, *here.parents):
        if folder == stop:
            return None
        candidate = folder / PROJECT_FILE
        if candidate.is_file():
            return candidate
    return None


def locate_config_files(home: Path | None, project_from: Path | None) -> ConfigFiles:
    """Where the files are, unread: the user's file of ``home`` and the project file found
    from ``project_from`` (None: none is looked for)."""
    found = find_project_file(project_from) if project_from is not None else None
    ignored: tuple[tuple[Path, str], ...] = ()
    if found is not None and (why := _foreign_owner(found)):
        found, ignored = None, ((found, why),)
    return ConfigFiles(user_file_path(home), project_path=found, ignored=ignored)


def load_config_files(home: Path | None, project_from: Path | None) -> ConfigFiles:
    """Read the user's file of ``home`` and the project file found from ``project_from``
    (None: no project file). Raises ConfigError naming the file and line at fault."""
    where = locate_config_files(home, project_from)
    for path, why in where.ignored:
        logger.warning("ignored %s: %s", path, why)
    user = read_file(where.user_path, "user") if where.user_path.is_file() else None
    project = read_file(where.project_path, "project") if where.project_path else None
    return ConfigFiles(where.user_path, user, where.project_path, project, where.ignored)


def use_config_files(home: Path | None, project_from: Path | None) -> ConfigFiles:
    """``load_config_files``, whose ``[settings]`` then become this process's (and those
    of the processes it forks after this call: its actors)."""
    files = load_config_files(home, project_from)
    use_file_settings([layer.settings for layer in files.layers()])
    return files


def _foreign_owner(path: Path) -> str | None:
    """Why a project file is passed over: owned by neither this user nor root (anyone may
    write ``/tmp/.trouper.toml``; git passes over such repositories too)."""
    owner = path.stat().st_uid
    if owner in (os.geteuid(), 0):
        return None
    return (f"it belongs to another user (uid {owner}); to use it, take it: "
            f"chown {os.geteuid()} {path}")


def read_file(path: Path, kind: FileKind) -> ConfigFile:
    """Read and check one file; raises ConfigError naming it."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{shown_path(path)}: not UTF-8 text; save it as UTF-8",
                          field=str(path)) from None
    except OSError as e:
        raise ConfigError(f"{shown_path(path)}: cannot read it ({e.strerror}); fix its "
                          "permissions or remove it", field=str(path)) from None
    return parse_text(text, path, kind)


def parse_text(text: str, path: Path, kind: FileKind) -> ConfigFile:
    """Check a file's text (see the module docstring); raises ConfigError naming it."""
    label = shown_path(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(_syntax_error(label, str(e)), field=str(path)) from None
    lines = _key_lines(text)
    table = data.pop(SETTINGS_TABLE, {})
    servers = data.pop(MCP_TABLE, {})
    problems = [_problem(key, value, kind) for key, value in data.items()]
    problems += mcp_problems(servers, kind)
    if not isinstance(table, dict):
        problems.append((SETTINGS_TABLE, "must be a table: a [settings] line, then "
                                         "name = value lines"))
        table = {}
    problems += _settings_problems(table, kind)
    found = [(key, why) for key, why in problems if why]
    if found:
        key, why = found[0]
        # a key inside an inline table (env = { A = "..." }) has its table's line
        line = next((lines[k] for k in _prefixes(key) if k in lines), None)
        where = f"{label}, line {line}" if line else label
        more = f" (and {len(found) - 1} more problem(s) in the file)" if len(found) > 1 else ""
        raise ConfigError(f"{where}: {key}: {why}{more}", field=key)
    return ConfigFile(path, kind, data, table, lines, server_entries(servers))


def _prefixes(key: str) -> list[str]:
    """``mcp.t.env.A``, ``mcp.t.env``, ``mcp.t``, ``mcp``."""
    parts = key.split(".")
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _problem(key: str, value: Any, kind: FileKind) -> tuple[str, str | None]:
    if key != "api_key_env" and _SECRET_NAME.search(key):
        return key, ("trouper never reads a key or a secret from a file; keep it in an "
                     "environment variable and name that variable: api_key_env = "
                     "\"OPENAI_API_KEY\"")
    if key not in KEYS:
        if key in Settings.model_fields:
            return key, f"a setting: put it under a [{SETTINGS_TABLE}] line"
        return key, "unknown key" + _suggest(key, [*KEYS, SETTINGS_TABLE, MCP_TABLE])
    if why := KEYS[key].check(value):
        return key, why
    if kind == "project" and key in PROJECT_REFUSED and (why := PROJECT_REFUSED[key](value)):
        return key, f"{why}; set it in your own file ({shown_path(user_file_path(None))}), " \
                    f"{KEYS[key].env} or {KEYS[key].flag}"
    return key, None


def _settings_problems(table: dict[str, Any], kind: FileKind) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for name in table:
        key = f"{SETTINGS_TABLE}.{name}"
        if name in KEYS:
            problems.append((key, f"not a setting: put {name} above the [{SETTINGS_TABLE}] "
                                  "line"))
        elif name not in Settings.model_fields:
            problems.append((key, "unknown setting" + _suggest(name, list(Settings.model_fields))))
        elif kind == "project" and name.startswith("daemon_"):
            problems.append((key, "the daemon reads its limits from your own file only; "
                                  f"set it in {shown_path(user_file_path(None))}"))
        elif kind == "project" and key in PROJECT_REFUSED:
            problems.append((key, f"{PROJECT_REFUSED[key](table[name])}; set it in your own "
                                  f"file or as TROUPER_{name.upper()}"))
    known = {k: v for k, v in table.items() if k in Settings.model_fields}
    try:
        Settings.model_validate(known, strict=False)
    except ValidationError as e:
        for item in e.errors():
            name = str(item["loc"][0]) if item["loc"] else ""
            reason = item["msg"].removeprefix("Value error, ").replace("Input should be",
                                                                       "must be")
            problems.append((f"{SETTINGS_TABLE}.{name}", f"{reason} (got {table.get(name)!r})"))
    return problems


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]}?" if close else f"; known keys: {', '.join(known)}"


def _syntax_error(label: str, message: str) -> str:
    """tomllib's ``Invalid value (at line 2, column 9)`` as ``FILE, line 2, column 9: ...``."""
    at = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    where = f"{label}, line {at[1]}, column {at[2]}" if at else label
    what = message[:at.start()] if at else message
    return (f"{where}: not valid TOML ({what[:1].lower()}{what[1:]}); a value needs "
            "quotes if it is text: model = \"openai/gpt-4o\"")


_SECRET_NAME = re.compile(r"(^|_)(api_?key|key|token|secret|password)($|_)", re.I)
"""A key named like a secret: its value is never read nor quoted back."""
_TABLE_LINE = re.compile(r"\s*\[\s*([A-Za-z0-9_.\"' -]+?)\s*\]\s*(#.*)?$")
_KEY_LINE = re.compile(r"\s*[\"']?([A-Za-z0-9_-]+)[\"']?\s*=")


def _key_lines(text: str) -> dict[str, int]:
    """The first line of each ``key`` and ``table.key`` (for messages; tomllib gives none)."""
    lines: dict[str, int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        if header := _TABLE_LINE.match(line):
            table = header[1].strip("\"'")
            lines.setdefault(table, number)
        elif assigned := _KEY_LINE.match(line):
            lines.setdefault(f"{table}.{assigned[1]}" if table else assigned[1], number)
    return lines
