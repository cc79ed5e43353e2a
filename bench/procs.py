"""Processes from ``/proc``: a trouper's actor tree, its sandboxes, their PSS and CPU time.

The actors of a ``Trouper`` on ``multiprocTCPBase`` are the Thespian admin process (found
by its admin port) and everything forked below it; each actor forks the actors it
creates, so a RuntimeProxy is the parent of its sandbox server (until the proxy is
restarted: the server then outlives it) and a SessionSupervisor the parent of its
RuntimeProxy and Controller. Sandbox servers are also found by their ``--state-dir``,
which lies under the trouper's home.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from trouper.processes import listening_sockets, socket_inodes

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state is [0])."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children_map() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every live process."""
    children: dict[int, list[int]] = defaultdict(list)
    for pid in pids():
        fields = _stat(pid)
        if fields is not None and fields[0] != "Z":
            children[int(fields[1])].append(pid)
    return children


def descendants(root: int, children: dict[int, list[int]]) -> list[int]:
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields is not None else None


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def listening_pid(port: int) -> int | None:
    """The process that listens on TCP ``port`` (the first holder of the socket)."""
    inodes = {inode for inode, (_ip, p) in listening_sockets().items() if p == port}
    holders = {pid for pid in pids() if socket_inodes(pid) & inodes} if inodes else set()
    roots = [pid for pid in holders if parent(pid) not in holders]  # not an inherited copy
    return min(roots or holders, default=None)


def sandbox_servers(home: Path) -> list[int]:
    """Sandbox server processes whose state folder lies under ``home``."""
    marker = str(Path(home).resolve())
    found = []
    for pid in pids():
        argv = cmdline(pid)
        if "--state-dir" in argv:
            state_dir = argv[argv.index("--state-dir") + 1]
            if state_dir.startswith(marker) and alive(pid):
                found.append(pid)
    return found


def sandbox_server_of(home: Path, session_id: str) -> int | None:
    for pid in sandbox_servers(home):
        argv = cmdline(pid)
        if session_id in argv[argv.index("--state-dir") + 1]:
            return pid
    return None


def pss_kb(pid: int) -> int:
    """Proportional set size from ``smaps_rollup`` (0 if the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class Tree:
    """A trouper's processes, by kind."""

    actors: list[int] = field(default_factory=list)
    """The Thespian admin and every actor process below it (not sandboxes)."""
    sandboxes: list[int] = field(default_factory=list)
    """Sandbox server processes."""
    shells: list[int] = field(default_factory=list)
    """Everything below the sandbox servers (bash and what it runs)."""

    @property
    def all(self) -> list[int]:
        return self.actors + self.sandboxes + self.shells


def trouper_tree(admin_port: int, home: Path) -> Tree:
    children = children_map()
    admin = listening_pid(admin_port)
    servers = set(sandbox_servers(home))
    below_servers = {p for s in servers for p in descendants(s, children)} - servers
    tree = Tree(sandboxes=sorted(servers), shells=sorted(below_servers))
    if admin is not None:
        tree.actors = sorted(set(descendants(admin, children)) - servers - below_servers)
    return tree


def pss_mb(pids_: list[int]) -> float:
    return sum(pss_kb(p) for p in pids_) / 1024.0


def tree_memory(tree: Tree) -> dict[str, float]:
    """PSS in MB of each kind of process, and in all."""
    memory = {
        "actors_mb": pss_mb(tree.actors),
        "sandboxes_mb": pss_mb(tree.sandboxes),
        "shells_mb": pss_mb(tree.shells),
    }
    memory["total_mb"] = sum(memory.values())
    memory["processes"] = float(len(tree.all))
    return memory
