"""Each actor's accept queue holds a burst of session processes connecting at once.

Thespian listens with a queue of 100. Every session process connects to the root and to
the broker, so starting or ending 100 sessions overflowed the root's queue 14-21 times a
run (``nstat``'s ListenOverflows): each a dropped SYN, sent again a second later. The
sealed transport listens with ``LISTEN_DEPTH`` (the kernel caps it at ``somaxconn``).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trouper.actors.transport import LISTEN_DEPTH
from trouper.host.processes import listening_sockets, socket_inodes
from trouper.testing import wait_until


def _backlog(port: int) -> int:
    """The listen queue's length of the socket on ``port`` (``ss``' Send-Q)."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[2])


def test_the_root_and_the_broker_listen_with_a_deep_queue(trouper):
    if shutil.which("ss") is None:
        pytest.skip("no ss (iproute2) here to read a listen queue's length")
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    for role in ("root", "broker"):  # the broker boots after Trouper() returns
        ports = wait_until(lambda role=role: _ports(trouper.home.actor_pid_path(role)), 60,
                           f"the {role} to listen")
        assert all(_backlog(port) >= min(LISTEN_DEPTH, somaxconn) for port in ports), role


def _ports(pid_path: Path) -> list[int]:
    """The ports the actor whose pid ``pid_path`` holds listens on (none yet: [])."""
    try:
        pid = int(pid_path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    listeners = listening_sockets()
    return [listeners[inode][1] for inode in socket_inodes(pid) if inode in listeners]
