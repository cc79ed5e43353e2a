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
from trouper.processes import listening_sockets, socket_inodes


def _backlog(port: int) -> int:
    """The listen queue's length of the socket on ``port`` (``ss``' Send-Q)."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[2])


def test_the_root_and_the_broker_listen_with_a_deep_queue(trouper):
    if shutil.which("ss") is None:
        pytest.skip("no ss (iproute2) here to read a listen queue's length")
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    listeners = listening_sockets()
    for role in ("root", "broker"):
        pid = int(trouper.home.actor_pid_path(role).read_text().split()[0])
        ports = [listeners[inode][1] for inode in socket_inodes(pid) if inode in listeners]
        assert ports, f"the {role} ({pid}) listens on no port"
        assert all(_backlog(port) >= min(LISTEN_DEPTH, somaxconn) for port in ports), role
