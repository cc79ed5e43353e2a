"""The CLI refuses bad input and broken environments with one line and a documented code.

Each case runs ``python -m trouper`` for real (exit codes are what a shell sees), except
the mapping table and the unexpected-exception case, which need no process.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from trouper.cli.main import main
from trouper.cli.support import classify
from trouper.exceptions import (
    ConfigError,
    InvalidRequest,
    RequestTimeout,
    StoreUnavailable,
    UnknownSession,
)
from trouper.security.masking import remember_secrets
from trouper.testing import ScriptError

from accel import forkserver

USAGE, ENVIRONMENT, UNEXPECTED = 2, 3, 4


pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

def trouper_cmd(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TROUPER_HOME": str(home), "COLUMNS": "200", **env}
    for name in ("TROUPER_MODEL", "TROUPER_DEBUG", "TROUPER_TRANSPORT_KEY_FILE"):
        if name not in env:
            full_env.pop(name, None)
    return forkserver.run([sys.executable, "-m", "trouper", *args], env=full_env, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def one_error_line(result: subprocess.CompletedProcess, code: int) -> str:
    """The single stderr line of a failed command, checked for its form and code."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    line, = result.stderr.splitlines()
    assert line.startswith("trouper: error: "), line
    return line


@pytest.fixture
def script_files(tmp_path: Path) -> dict[str, Path]:
    files = {"not_json": "[{", "not_a_list": '{"say": "hi"}',
             "bad_step": json.dumps([{"say": "ok"}, {"tool": "run", "fail": [{"status": 99}]}])}
    for name, text in files.items():
        (tmp_path / f"{name}.json").write_text(text)
    return {name: tmp_path / f"{name}.json" for name in files}


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A read-only tmpfs: as root, mode bits alone do not stop a write."""
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs",
                           str(mount_point)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


# ---- usage and configuration: exit 2 ----


def test_a_task_without_a_model_says_how_to_give_one(tmp_path):
    line = one_error_line(trouper_cmd("run", "fix the failing test", home=tmp_path), USAGE)
    assert "--model" in line and "TROUPER_MODEL" in line and "trouper demo" in line


@pytest.mark.parametrize("args, words", [
    (["run", "--runtime", "nope"], "'nope' is not one of 'local', 'docker'"),
    (["run", "t", "--modle", "x"], "'--model'?"),
    (["run", "t", "--model", "m", "--max-iterations", "0"], "--max-iterations"),
    (["nosuchcommand"], "No such command"),
    (["run", "t", "--model", "m", "--runtime", "docker", "--image", "i", "--no-network"],
     "--no-network and --unconfined go with --runtime local"),
    (["run", "t", "--model", "m", "--no-network", "--unconfined"],
     "--no-network needs the confinement"),
])
def test_click_usage_errors_are_one_line_with_the_help_hint(tmp_path, args, words):
    line = one_error_line(trouper_cmd(*args, home=tmp_path), USAGE)
    assert words in line and "--help" in line


@pytest.mark.parametrize("command", ["resume", "events"])
def test_an_unknown_session_is_a_usage_error(tmp_path, command):
    line = one_error_line(trouper_cmd(command, "s-missing", home=tmp_path), USAGE)
    assert line == "trouper: error: no session has the id 's-missing'"
    if command == "resume":  # it opened its log first: the log keeps the traceback
        log = (tmp_path / "logs" / "trouper.log").read_text()
        assert "ERROR trouper.cli.support: exit 2: no session has the id 's-missing'" in log
        assert "Traceback" in log


@pytest.mark.parametrize("name, words", [
    ("not_json", "is not valid JSON"),
    ("not_a_list", "must be a JSON list of steps"),
    ("bad_step", "step 1, field 'fail[0].status'"),
])
@pytest.mark.parametrize("command", ["run", "fake-llm"])
def test_a_bad_script_file_is_a_usage_error(tmp_path, script_files, name, words, command):
    args = ["run", "task", "--script"] if command == "run" else ["fake-llm", "--script"]
    line = one_error_line(trouper_cmd(*args, str(script_files[name]), home=tmp_path), USAGE)
    assert words in line and str(script_files[name]) in line
    assert not (tmp_path / "sessions").exists()


# ---- environment: exit 3 ----


@pytest.mark.parametrize("args", [["sessions"], ["run", "t", "--script", "{script}"],
                                  ["demo"]])
@pytest.mark.parametrize("inside", [False, True], ids=["home-is-ro", "home-under-ro"])
def test_a_read_only_home_is_an_environment_error(tmp_path, read_only_dir, args, inside):
    script = tmp_path / "ok.json"
    script.write_text('[{"say": "hi"}]')
    home = read_only_dir / "home" if inside else read_only_dir
    result = trouper_cmd(*[a.format(script=script) for a in args], home=home)
    line = one_error_line(result, ENVIRONMENT)
    assert str(read_only_dir) in line and "Read-only file system" in line


def test_a_port_in_use_is_an_environment_error(tmp_path):
    script = tmp_path / "ok.json"
    script.write_text('[{"say": "hi"}]')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = trouper_cmd("fake-llm", "--script", str(script), "--port", str(port),
                             home=tmp_path)
    assert one_error_line(result, ENVIRONMENT) == (
        f"trouper: error: port {port} on 127.0.0.1 is in use")


def test_a_store_that_is_not_a_database_is_an_environment_error(tmp_path):
    fd = os.open(tmp_path / "trouper.db", os.O_WRONLY | os.O_CREAT, 0o600)  # no warning
    os.write(fd, b"not a database, " * 512)
    os.close(fd)
    line = one_error_line(trouper_cmd("sessions", home=tmp_path), ENVIRONMENT)
    assert "event store" in line and "not a database" in line


def test_an_actor_system_that_cannot_start_is_an_environment_error(tmp_path):
    script = tmp_path / "ok.json"
    script.write_text('[{"say": "hi"}]')
    missing = tmp_path / "no-such-key"
    result = trouper_cmd("run", "t", "--script", str(script), home=tmp_path / "home",
                         TROUPER_TRANSPORT_KEY_FILE=str(missing))
    assert "transport key file" in one_error_line(result, ENVIRONMENT)


# ---- --debug ----


@pytest.mark.parametrize("how", ["option", "env"])
def test_debug_adds_the_traceback_to_the_same_line(tmp_path, how):
    args = ["--debug", "events", "s-missing"] if how == "option" else ["events", "s-missing"]
    env = {"TROUPER_DEBUG": "1"} if how == "env" else {}
    result = trouper_cmd(*args, home=tmp_path, **env)
    assert result.returncode == USAGE
    assert "Traceback (most recent call last)" in result.stderr
    assert "trouper.exceptions.UnknownSession" in result.stderr
    assert result.stderr.splitlines()[-1] == "trouper: error: no session has the id 's-missing'"


# ---- the mapping, and what nobody expected ----


@pytest.mark.parametrize("exc, code", [
    (ConfigError("invalid session configuration: task\n  empty"), USAGE),
    (UnknownSession("no session has the id 's-x'"), USAGE),
    (InvalidRequest("cannot pause a session that is finished"), USAGE),
    (ScriptError("invalid script:\n  step 0: bad\n  step 1: worse"), USAGE),
    (StoreUnavailable("the disk holding the home is full", "full"), ENVIRONMENT),
    (RequestTimeout("no answer to boot within 30 s"), ENVIRONMENT),
    (PermissionError(errno.EACCES, "Permission denied", "/home/x"), ENVIRONMENT),
    (OSError(errno.EADDRINUSE, "Address already in use"), ENVIRONMENT),
    (RuntimeError("boom"), UNEXPECTED),
])
def test_every_error_maps_to_a_code_and_one_line(exc, code):
    got, message = classify(exc)
    assert got == code
    assert "\n" not in message and message.strip() == message and message


def test_error_lines_are_masked():
    # a name of its own: the registry is the process's, and another test in this worker
    # may have remembered API_TOKEN with another value (that one would read API_TOKEN_2)
    remember_secrets([("CLI_ERRORS_TOKEN", "tok-0123456789abcdef")])
    _, message = classify(ConfigError("bad key tok-0123456789abcdef\nin llm"))
    assert message == "bad key <secret:CLI_ERRORS_TOKEN>; in llm"


def test_an_unexpected_exception_names_its_type_and_asks_for_debug(monkeypatch, tmp_path):
    def broken(home: object) -> None:
        raise RuntimeError("the store exploded")

    monkeypatch.setattr("trouper.store.open_store", broken)
    runner = CliRunner()
    result = runner.invoke(main, ["sessions", "--home", str(tmp_path)])
    assert result.exit_code == UNEXPECTED
    line, = result.stderr.splitlines()
    assert line == ("trouper: error: unexpected RuntimeError: the store exploded "
                    "(run with --debug for the traceback)")
    debug = runner.invoke(main, ["--debug", "sessions", "--home", str(tmp_path)])
    assert debug.exit_code == UNEXPECTED
    assert "Traceback (most recent call last)" in debug.stderr
    assert "RuntimeError: the store exploded" in debug.stderr


def test_the_console_reads_the_terminal_settings_when_it_first_prints(monkeypatch):
    """Not on import: a process forked after the import (or a program that sets COLUMNS
    later) prints at the width it has then."""
    from trouper.cli import console as cli_console

    monkeypatch.setattr(cli_console.FirstUseConsole, "_console", None)
    monkeypatch.setenv("COLUMNS", "123")
    assert cli_console.console.width == 123
