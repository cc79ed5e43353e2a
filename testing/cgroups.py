"""A cgroup per test program: every process it starts stays in it (setsid, double fork),
so a test can list them all, however the program was started (``join_cgroup`` first
thing in the child: trouper's suite forks its programs with a ``cgroup=`` option). Needs
root and a cgroup file system; ``new_cgroup`` says None otherwise."""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"),
                Path("/sys/fs/cgroup"))
"""Where ``new_cgroup`` makes one: cgroup v1's pids hierarchy, else a v2 one."""


def new_cgroup(name: str) -> Path | None:
    """A new empty cgroup for the ``cgroup`` option, or None where this process may not
    make one (not root, no cgroup file system)."""
    for root in CGROUP_ROOTS:
        if (root / "cgroup.procs").exists():
            try:
                (root / name).mkdir()
            except OSError:
                continue
            return root / name
    return None


def remove_cgroup(group: Path, timeout_s: float = 10.0) -> None:
    """Remove ``group`` once its last member is reaped (EBUSY until then)."""
    from .faults import wait_until

    def removed() -> bool:
        try:
            group.rmdir()
        except OSError:
            return False
        return True

    wait_until(removed, timeout_s, f"{group} to empty")


def join_cgroup(group: str | os.PathLike[str]) -> None:
    """Move this process into ``group`` (what it starts from then on is in it too)."""
    with open(os.path.join(group, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))
