"""The sandbox's state folder is owner-only whatever the umask; the agent's files are not.

Everything under the state folder (journal records, ``.out`` files, server.json, lock,
log, epoch) is 0600 in 0700 folders, and so are the full-output files in the workspace's
``.trouper``; what the agent creates (with ``run`` or ``write_file``) gets the modes the
umask of the program that started the sandbox gives.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from trouper.messages.actions import ReadFile, RunCommand, WriteFile
from trouper.runtimes.local import LocalSandbox

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

LIMITS = {"timeout_s": 10.0, "no_output_timeout_s": 5.0}


@pytest.fixture(params=[0o022, 0o000], ids=["umask-022", "umask-000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    """Workspace-relative path -> permission bits, for everything under ``root``."""
    found = {".": stat.S_IMODE(root.lstat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def _used_sandbox(tmp_path: Path) -> LocalSandbox:
    sandbox = LocalSandbox(
        "private", tmp_path / "ws", tmp_path / "rt", env={"TOKEN": "t0k3n"}, max_output_chars=200
    )
    sandbox.start(1)
    runtime = sandbox.runtime
    runtime.execute("run", RunCommand(command="touch made; mkdir made-dir; seq 1 500"), **LIMITS)
    runtime.execute("write", WriteFile(path="sub/new.txt", content="x\n" * 300), **LIMITS)
    runtime.execute("read", ReadFile(path="sub/new.txt"), **LIMITS)
    return sandbox


def test_state_is_owner_only_and_the_agents_files_keep_the_umask(
    tmp_path: Path, umask: int
) -> None:

    sandbox = _used_sandbox(tmp_path)
    try:
        state = _modes(sandbox.state_dir)
        assert {"server.json", "server.lock", "server.log", "epoch.json"} <= set(state)
        assert any(name.endswith(".out") for name in state)
        workspace = _modes(sandbox.workspace)
    finally:
        sandbox.stop()
    state.update({f"after stop: {k}": v for k, v in _modes(sandbox.state_dir).items()})
    for name, mode in state.items():
        is_dir = (sandbox.state_dir / name.removeprefix("after stop: ")).is_dir()
        assert mode == (0o700 if is_dir else 0o600), f"{name} is {mode:04o}"
    assert {k: v for k, v in workspace.items() if k.startswith(".trouper")} == {
        ".trouper": 0o700,
        ".trouper/outputs": 0o700,
        ".trouper/outputs/run.log": 0o600,  # the cut output of the run
        ".trouper/outputs/read.log": 0o600,  # the cut content of the read
    }
    assert workspace["made"] == 0o666 & ~umask
    assert workspace["made-dir"] == workspace["sub"] == workspace["."] == 0o777 & ~umask
    assert workspace["sub/new.txt"] == 0o666 & ~umask


def test_a_loose_state_folder_is_tightened(tmp_path: Path) -> None:
    state_dir = tmp_path / "rt"
    (state_dir / "journal").mkdir(parents=True)
    for path in (state_dir, state_dir / "journal"):
        path.chmod(0o755)
    (state_dir / "server.log").write_text("from before\n")
    (state_dir / "server.log").chmod(0o644)
    sandbox = LocalSandbox("private", tmp_path / "ws", state_dir)
    try:
        sandbox.start(1)
        modes = _modes(state_dir)
    finally:
        sandbox.stop()
    assert modes["."] == modes["journal"] == 0o700
    assert modes["server.log"] == 0o600
    assert (state_dir / "server.log").read_text().startswith("from before\n")
