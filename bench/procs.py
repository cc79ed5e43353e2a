"""Processes from ``/proc``: a trouper's actor tree, its sandboxes, their PSS and CPU time.

The actors of a ``Trouper`` on ``multiprocTCPBase`` are the Thespian admin process (found
by its admin port) and everything forked below it; each actor forks the actors it
creates, so a SessionSupervisor is the parent of its RuntimeProxy and Controller.
Sandbox servers are forked by the program's sandbox zygote (``trouper-zygote``, a child
of the program; started afresh, by the proxy), so they are found by their state folder
under the trouper's home: the pid its ``server.json`` names, or the argv of one started
afresh; a session's actors by the pid files they publish (``<home>/sessions/<id>/actors``).

Every trouper process names itself for its role (``/proc/<pid>/comm``: ``trouper-admin``,
``-root``, ``-llm``, ``-session``, ``-proxy``, ``-ctl``, ``-sandbox``), so CPU time and
memory are attributed to roles by name (``roles``, ``role_cpu_s``, ``role_memory``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from trouper.host.processes import children_map, descendants, listening_sockets, socket_inodes

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


def _servers_by_folder(home: Path) -> dict[int, str]:
    """Sandbox server pid -> its state folder, for every folder under ``home``."""
    marker = str(Path(home).resolve())
    found: dict[int, str] = {}
    for info in Path(marker).glob("sessions/*/runtime/server.json"):
        try:
            pid = int(json.loads(info.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if alive(pid) and comm(pid) == "trouper-sandbox":
            found[pid] = str(info.parent)
    for pid in pids():
        if pid in found:
            continue
        argv = cmdline(pid)
        if "--state-dir" in argv:  # one started afresh, before its server.json
            state_dir = argv[argv.index("--state-dir") + 1]
            if state_dir.startswith(marker) and alive(pid):
                found[pid] = state_dir
        elif comm(pid) == "trouper-sandbox" and alive(pid):
            # one forked by the zygote, whose argv is the zygote's: it works in its state
            # folder, which may lie under a home below ``home`` (the concurrency runs'), or
            # be gone with its home (" (deleted)"), the server living on
            state_dir = _cwd(pid).removesuffix(" (deleted)")
            if state_dir == marker or state_dir.startswith(marker + os.sep):
                found[pid] = state_dir
    return found


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def sandbox_servers(home: Path) -> list[int]:
    """Sandbox server processes whose state folder lies under ``home``."""
    return sorted(_servers_by_folder(home))


def sandbox_server_of(home: Path, session_id: str) -> int | None:
    for pid, state_dir in _servers_by_folder(home).items():
        if Path(state_dir).parent.name == session_id:
            return pid
    return None


def sandbox_zygotes(servers: list[int]) -> list[int]:
    """The zygotes that forked these servers (their parents named ``trouper-zygote``)."""
    parents = {parent(pid) for pid in servers}
    return sorted(p for p in parents if p is not None and comm(p) == "trouper-zygote")


def session_actor(home: Path, session_id: str, role: str) -> int | None:
    """The live pid a session's actor published (``session``, ``controller``,
    ``runtime``), or None."""
    path = Path(home) / "sessions" / session_id / "actors" / f"{role}.pid"
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive(pid) else None


def pss_kb(pid: int) -> int:
    """Proportional set size from ``smaps_rollup`` (0 if the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_clock_s(pid: int) -> float | None:
    """The process's CPU-time clock (user + system of all its threads, ns precision):
    ``clock_gettime`` on the clock id Linux gives every pid (``-(pid + 1) * 8 + 2``, i.e.
    ``CPUCLOCK_SCHED`` of the process). None if it is gone or the clock is refused."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except (OSError, OverflowError):
        return None


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used (0 if it is gone).

    Read from its CPU-time clock: ``/proc/<pid>/stat`` counts whole clock ticks (10 ms),
    too coarse for a process that is nearly idle; stat is the fallback."""
    precise = _cpu_clock_s(pid)
    if precise is not None:
        return precise
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
    below_servers = {p for s in servers for p in descendants([s], children)} - servers
    tree = Tree(sandboxes=sorted(servers), shells=sorted(below_servers))
    actors = set(sandbox_zygotes(sorted(servers)))  # the program's: a fixed cost, as the admin
    if admin is not None:
        actors |= set(descendants([admin], children)) - servers - below_servers
    tree.actors = sorted(actors)
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


# Roles: every trouper process names itself for its role (``/proc/<pid>/comm``).

ROLES = (
    "trouper-admin",
    "trouper-root",
    "trouper-llm",
    "trouper-session",
    "trouper-proxy",
    "trouper-ctl",
    "trouper-sandbox",
    "trouper-zygote",
    "shells",
)
"""The roles in the order reports list them. ``trouper-admin`` holds Thespian's admin and
its logger process; ``shells`` is everything below the sandbox servers (bash and what it
runs), which keep their own names. A process of the tree with another name is counted
as ``other (<name>)``."""
SHARED_ROLES = frozenset({"trouper-admin", "trouper-root", "trouper-llm", "trouper-zygote"})
"""Roles with one process (or two: admin and logger) per ``Trouper``, not per session."""


def comm(pid: int) -> str:
    """The process's name (``/proc/<pid>/comm``; "" if it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def roles(tree: Tree) -> dict[int, str]:
    """pid -> role of every process of the tree (see ``ROLES``)."""
    out = {}
    for pid in tree.actors + tree.sandboxes:
        name = comm(pid)
        out[pid] = name if name.startswith("trouper-") else f"other ({name or '?'})"
    for pid in tree.shells:
        out[pid] = "shells"
    return out


def role_order(names: object) -> list[str]:
    """Role names in ``ROLES`` order, unknown ones after."""
    rank = {role: i for i, role in enumerate(ROLES)}
    return sorted(names, key=lambda r: (rank.get(r, len(rank)), r))  # type: ignore[arg-type]


def cpu_with_children_s(pid: int) -> float:
    """User + system CPU seconds of the process and of its children it has waited for
    (so a command a shell ran and reaped counts); 0 if it is gone."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    reaped = (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
    precise = _cpu_clock_s(pid)
    if precise is None:
        return reaped + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return reaped + precise


def role_cpu_s(pids_: dict[int, str]) -> dict[str, float]:
    """CPU seconds used so far by each role (processes and their reaped children).

    Take two of these and subtract (``cpu_delta``): a process that started in between
    counts whole, and one that ended and was reaped by a parent in the tree moves to the
    parent's role, so the sum over roles stays right."""
    used: dict[str, float] = defaultdict(float)
    for pid, role in pids_.items():
        used[role] += cpu_with_children_s(pid)
    return dict(used)


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {
        role: after.get(role, 0.0) - before.get(role, 0.0)
        for role in role_order(set(before) | set(after))
    }


def memory_kb(pid: int) -> tuple[int, int]:
    """(PSS, private) kB from ``smaps_rollup``; private is Private_Clean + Private_Dirty."""
    rollup = smaps_rollup_kb(pid)
    return rollup.get("Pss", 0), rollup.get("Private_Clean", 0) + rollup.get("Private_Dirty", 0)


def smaps_rollup_kb(pid: int) -> dict[str, int]:
    """Every kB field of ``/proc/<pid>/smaps_rollup`` (Rss, Pss, Shared_Clean,
    Private_Dirty, Anonymous...); empty if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            out[parts[0].rstrip(":")] = int(parts[1])
    return out


def role_memory(pids_: dict[int, str]) -> dict[str, dict[str, float]]:
    """Per role: processes, PSS MB, private MB (Private_Clean + Private_Dirty) and shared
    MB (Shared_Clean + Shared_Dirty: pages another process maps too), summed over its
    processes."""
    out: dict[str, dict[str, float]] = {}
    for pid, role in pids_.items():
        rollup = smaps_rollup_kb(pid)
        row = out.setdefault(role, {"processes": 0, "pss_mb": 0.0, "private_mb": 0.0,
                                    "shared_mb": 0.0})
        row["processes"] += 1
        row["pss_mb"] += rollup.get("Pss", 0) / 1024.0
        row["private_mb"] += (rollup.get("Private_Clean", 0)
                              + rollup.get("Private_Dirty", 0)) / 1024.0
        row["shared_mb"] += (rollup.get("Shared_Clean", 0)
                             + rollup.get("Shared_Dirty", 0)) / 1024.0
    return {role: out[role] for role in role_order(out)}


def machine_cpu_s() -> dict[str, float]:
    """The whole machine's CPU seconds so far (``/proc/stat``, every core): ``busy``
    (user, nice, system, irq, softirq) and ``steal`` (time the hypervisor gave this
    machine's vCPUs to other guests). Two readings subtracted, less what the run's own
    processes used, say how busy the machine was with other work meanwhile."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return {"busy": 0.0, "steal": 0.0}
    ticks = [int(x) for x in first[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (ticks + [0] * 8)[:8]
    return {"busy": (user + nice + system + irq + softirq) / CLOCK_TICKS,
            "steal": steal / CLOCK_TICKS}


def others_load(before: dict[str, float], after: dict[str, float], ours_s: float,
                wall_s: float) -> dict[str, float]:
    """Cores busy with work that was not the run's own (other engineers' tests, the
    daemons), and cores stolen by the hypervisor, on average over ``wall_s``."""
    wall = max(1e-9, wall_s)
    return {"others_cores": max(0.0, after["busy"] - before["busy"] - ours_s) / wall,
            "steal_cores": (after["steal"] - before["steal"]) / wall}


def session_processes(tree: Tree, home: Path, session_id: str) -> dict[int, str] | None:
    """pid -> role of one session's own processes (its SessionSupervisor and all below
    it, its sandbox server and all below it) and of the shared ones (admin, root, LLM
    broker); None when its SessionSupervisor cannot be found."""
    every = roles(tree)
    server = sandbox_server_of(home, session_id)
    supervisor = session_actor(home, session_id, "session")
    if server is None or supervisor is None:
        return None
    children = children_map()
    own = set(descendants([supervisor, server], children))
    return {pid: role for pid, role in every.items() if pid in own or role in SHARED_ROLES}


def mem_available_mb() -> float:
    """``MemAvailable`` from ``/proc/meminfo`` in MB (inf when unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("inf")


def kill_tree(admin_port: int, home: Path) -> list[int]:
    """SIGKILL a trouper's processes (actors, sandbox servers, shells); the pids killed.

    For a run that must be ended (out of time or memory): the admin's whole process
    group goes (actors a dead parent left included), then every sandbox server under
    ``home`` and what runs below it. A few passes catch processes forked meanwhile."""
    killed: set[int] = set()
    for _ in range(5):
        tree = trouper_tree(admin_port, home)
        admin = listening_pid(admin_port)
        try:
            group = os.getpgid(admin) if admin is not None else None
            if group is not None and group != os.getpgrp():  # never the bench's own group
                os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
        targets = [p for p in tree.all if alive(p)]
        if not targets and admin is None:
            break
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(0.2)
    return sorted(killed)
