"""A session whose process cannot be made: the tree stays up and says why, and the
session starts by itself once processes can be made again.

The root is put in a pids cgroup whose limit is the root's own tasks, so its next
``fork`` fails for real (EAGAIN), as it does on a machine or container at its process
limit. Needs root and a cgroup v1 pids hierarchy (or v2); skipped with the reason where
there is none.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from trouper import AgentState, Trouper
from trouper.config.models import RestartPolicy
from trouper.testing import actor_pid, wait_until
from trouper.testing.cgroups import new_cgroup

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

STEPS = [{"tools": [{"tool": "run", "args": {"command": "echo hi > out.txt"}}]},
         {"tools": [{"tool": "finish", "args": {"message": "done"}}]}]
QUICK = RestartPolicy(giveup_cooldown_s=1.0, giveup_cooldown_max_s=2.0)
"""Retry after a second, not thirty: the test waits for it."""


def _pids_cgroup_of(pid: int, hierarchy: Path) -> Path:
    """The pids cgroup ``pid`` is in (v1's ``pids`` line, or v2's ``0::`` one)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(",") or controllers == "":
            return hierarchy / path.lstrip("/")
    return hierarchy


@pytest.fixture
def pids_group() -> Iterator[Path]:
    """A pids cgroup; what was moved in goes back where this process is, at the end."""
    group = new_cgroup(f"trouper-fork-failure-{os.getpid()}")
    if group is None or not (group / "pids.max").exists():
        if group is not None:
            group.rmdir()
        pytest.skip("no pids cgroup can be made here (needs root and a pids controller)")
    home = _pids_cgroup_of(os.getpid(), group.parent)
    try:
        yield group
    finally:
        (group / "pids.max").write_text("max")
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (home / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # gone meanwhile
        wait_until(lambda: not (group / "cgroup.procs").read_text().split(), 10.0,
                   f"{group} to empty")
        group.rmdir()


@pytest.mark.parametrize("per_supervisor", ["1", "16"], ids=["new-supervisor", "in-a-group"])
def test_a_session_that_cannot_fork_is_an_error_with_its_cause_then_starts(
    tmp_path: Path, scripted, pids_group: Path, per_supervisor: str, monkeypatch
) -> None:
    """With one session a supervisor, the root cannot make the new session's
    SessionSupervisor; in a group, the first session's supervisor cannot make the new
    session's Controller and RuntimeProxy (nor a stand-in to write the downtime)."""
    monkeypatch.setenv("TROUPER_SESSIONS_PER_SUPERVISOR", per_supervisor)
    _, llm = scripted(STEPS * 2)
    with Trouper(home=tmp_path / "home", policy=QUICK) as t:
        first = t.start_session("warm up", llm=llm, workspace=tmp_path / "first")
        assert first.wait(timeout=60) == AgentState.FINISHED
        root = int(t.home.actor_pid_path("root").read_text().split()[0])
        supervisor = actor_pid(first, "session")
        assert supervisor is not None
        for pid in (root, supervisor):  # neither can make a process now
            (pids_group / "cgroup.procs").write_text(str(pid))
        tasks = len((pids_group / "tasks").read_text().split())
        (pids_group / "pids.max").write_text(str(tasks))  # no new process, no new thread

        stuck = t.start_session("make out.txt", llm=llm, workspace=tmp_path / "stuck")
        wait_until(lambda: stuck.fault is not None, 20.0, "the fork failure to be told")
        assert stuck.state == AgentState.ERROR
        assert "could not be started" in stuck.fault and "Errno 11" in stuck.fault
        assert first.state == AgentState.FINISHED  # the tree is up: it still answers

        (pids_group / "pids.max").write_text("max")  # processes can be made again
        assert stuck.wait(timeout=60) == AgentState.FINISHED
        assert stuck.fault is None
        assert (tmp_path / "stuck" / "out.txt").read_text() == "hi\n"
