"""I7 (docs/promises.md): everything trouper writes outside the workspace is owner-only,
whatever the umask."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from trouper import AgentState, Trouper
from trouper.home.paths import creator_umask

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

LONG_OUTPUT = "seq 1 5000"


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _readable_by_others(home: Path) -> list[str]:
    """Paths under ``home`` (default workspaces excepted) with any group/other bit."""
    loose = []
    for folder, dirs, files in os.walk(home):
        here = Path(folder)
        if here.parent == home / "sessions":
            dirs[:] = [d for d in dirs if d != "workspace"]
        for name in [*dirs, *files]:
            path = here / name
            mode = stat.S_IMODE(path.lstat().st_mode)
            if mode & (stat.S_IRWXG | stat.S_IRWXO) and not path.is_symlink():
                loose.append(f"{path.relative_to(home)} {mode:04o}")
    return loose


def test_a_used_home_is_owner_only_under_an_open_umask(scripted, tmp_path, loose_umask):
    _, llm = scripted([
        {"tool": "run", "args": {"command": LONG_OUTPUT}},
        {"tool": "write_file", "args": {"path": "notes.txt", "content": "hi\n"}},
        {"tool": "run", "args": {"command": "touch made-by-the-agent"}},
        {"tool": "finish", "args": {"message": "done"}},
    ])
    home = tmp_path / "home"
    with Trouper(home=home) as t:
        default_ws = t.start_session("in the default workspace", llm=llm)
        assert default_ws.wait(timeout=60) == AgentState.FINISHED
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert _readable_by_others(home) == []
    workspace = home / "sessions" / default_ws.id / "workspace"
    made = stat.S_IMODE((workspace / "made-by-the-agent").stat().st_mode)
    assert made == 0o666, "the agent's own files keep the program's umask"


def test_opening_a_loose_home_tightens_it_and_says_so(tmp_path, caplog):
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "trouper.log").write_text("old\n")
    (home / "sessions" / "s-1" / "workspace").mkdir(parents=True)
    (home / "sessions" / "s-1" / "workspace" / "user-file").write_text("mine\n")
    for path in (home, home / "logs", home / "sessions", home / "sessions" / "s-1"):
        path.chmod(0o755)
    (home / "logs" / "trouper.log").chmod(0o644)
    (home / "sessions" / "s-1" / "workspace" / "user-file").chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="trouper.home.paths"):
        Trouper(home=home).close()
    assert _readable_by_others(home) == []
    assert "tightened" in caplog.text and "to owner-only" in caplog.text
    user_file = home / "sessions" / "s-1" / "workspace" / "user-file"
    assert stat.S_IMODE(user_file.stat().st_mode) == 0o644, "a workspace is not trouper's"


def test_creator_umask_is_the_programs(loose_umask):
    assert creator_umask() == 0
