"""What `trouper` prints into a pipe, a file or a CI log: lines as long as they are (a
printed command pastes whole), no ANSI code, and nothing a library printed on its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel import forkserver

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it


def piped_env() -> dict[str, str]:
    """A CI job's: no terminal size to go by, no home but the one named."""
    env = dict(os.environ)
    for name in ("COLUMNS", "LINES", "TROUPER_HOME", "TROUPER_MODEL", "NO_COLOR"):
        env.pop(name, None)
    return env


def test_piped_output_keeps_long_lines_whole_and_has_no_ansi_codes(tmp_path):
    deep = tmp_path / ("a-folder-with-a-long-name-" * 5)
    deep.mkdir()
    long_command = "rm -rf " + " ".join(f"build/output-{i}" for i in range(12))
    script = deep / "script.json"
    script.write_text(json.dumps([{"tool": "run", "args": {"command": long_command}},
                                  {"tool": "finish", "args": {"message": "done"}}]))
    home = deep / "home"
    result = forkserver.run(
        [sys.executable, "-m", "trouper", "run", "tidy", "--script", str(script),
         "--confirm", "risky", "--home", str(home)],
        env=piped_env(), text=True, capture_output=True, timeout=120,
        stdin=subprocess.DEVNULL)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    session_id = next(line.split()[1] for line in lines if line.startswith("session "))
    approve = f"trouper approve {session_id} --script {script} --home {home}"
    assert len(approve) > 200
    assert f"approve    {approve}" in lines
    assert any(line.endswith(f"state → awaiting_user_confirmation  (waiting for approval "
                             f"of run: {long_command} (the command deletes recursively or "
                             "by force))") for line in lines), result.stdout
    for output in (result.stdout, result.stderr):
        assert "\x1b[" not in output and "\r" not in output  # no colour, no spinner


def test_an_unknown_model_is_one_line_of_trouper_and_nothing_from_litellm(tmp_path):
    # started afresh, as a user's shell does: litellm imported and configured by this run
    result = subprocess.run(
        [sys.executable, "-m", "trouper", "run", "x", "--model", "no-such-provider/foo",
         "--home", str(tmp_path / "home")],
        env=piped_env(), text=True, capture_output=True, timeout=120,
        stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "trouper: error: llm.model: litellm knows no provider for 'no-such-provider/foo'; "
        "write it as provider/model, e.g. openai/gpt-4o or hosted_vllm/NAME"]


def test_the_console_writes_no_ansi_and_does_not_wrap_into_a_file(tmp_path, monkeypatch):
    from rich.text import Text

    from trouper.cli.console import make_console

    monkeypatch.delenv("COLUMNS", raising=False)
    out = Path(tmp_path / "out.txt")
    with out.open("w") as file:
        monkeypatch.setattr(sys, "stdout", file)
        console = make_console()
        console.print(Text("x" * 300, style="bold red"))
    assert out.read_text() == "x" * 300 + "\n"


def test_a_task_in_brackets_is_listed_as_typed(tmp_path):
    from trouper.config.models import LLMConfig, SessionConfig
    from trouper.home.paths import Home
    from trouper.store import open_store

    task = "fix [bug] in list[int] [/x]"
    store = open_store(Home.at(tmp_path / "home"))
    try:
        store.create_session("s-brackets", SessionConfig(
            task=task, workspace=str(tmp_path / "ws"), llm=LLMConfig(model="hosted_vllm/x")))
    finally:
        store.close()
    result = forkserver.run(
        [sys.executable, "-m", "trouper", "sessions", "--home", str(tmp_path / "home")],
        env=piped_env(), text=True, capture_output=True, timeout=120,
        stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith(task)
