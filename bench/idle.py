"""Workload: idle sessions. What sessions that wait for nobody cost in CPU.

One ``Trouper`` starts M sessions: every other one is told by the scripted model to say
something and call no tool (it then waits for the user: AWAITING_USER_INPUT, its
sandbox server and shell up), the rest to call ``finish`` at once (FINISHED). Once all
have settled (``Session.wait``), a further ``settle_s`` has passed and the trouper has
been quiet for 0.25 s (``_quiet``, at most ``QUIET_MAX_S``: what start-up left running
is not idling), the CPU of every process of the trouper (the Thespian admin and its
logger, root, LLM broker, each session's SessionSupervisor, RuntimeProxy and Controller,
the sandbox servers and their shells) is read twice, ``window_s`` apart. CPU is user +
system time from each process's CPU-time clock (ns precision: ``/proc/<pid>/stat``
counts 10 ms ticks) plus the reaped children's from ``/proc/<pid>/stat``.

Reported: ms of CPU per second per session (all processes, the shared ones included,
divided by M: the table's "CPU of an idle session"); the same less what the trouper
used in a window of the same length before any session started (``marginal``); per
role; per state (a session's own processes only); and the busiest processes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from common import echo_script, fmt
from contenders import TASK, llm_config
from procs import (
    SHARED_ROLES,
    cpu_with_children_s,
    role_order,
    roles,
    session_processes,
    trouper_tree,
)

from trouper import AgentState, Trouper
from trouper.client.actor_system import free_port
from trouper.testing import FakeLLMServer

QUIET_MAX_S = 5.0
SAY = [{"say": "Tell me what to do next."}]
"""A message and no tool call: the session waits for the user."""


def _window(port: int, home: Path, window_s: float) -> tuple[dict[int, tuple[str, float]], float]:
    """pid -> (role, CPU seconds used during a window of about ``window_s``); the window's
    measured length (from the first read of the first pass to that of the second)."""
    before_roles = roles(trouper_tree(port, home))
    began = time.monotonic()
    before = {pid: cpu_with_children_s(pid) for pid in before_roles}
    time.sleep(window_s)
    ended = time.monotonic()
    after = {pid: cpu_with_children_s(pid) for pid in before_roles}
    after_roles = roles(trouper_tree(port, home))
    after.update({pid: cpu_with_children_s(pid) for pid in after_roles if pid not in after})
    used = {
        pid: (after_roles.get(pid) or before_roles[pid], after[pid] - before.get(pid, 0.0))
        for pid in after
    }
    return used, ended - began


def _quiet(port: int, home: Path, settle_s: float, quiet_max_s: float = QUIET_MAX_S) -> float:
    """Wait ``settle_s``, then until the trouper's processes use under 1 ms of CPU in 0.25
    s (what start-up left running, such as the LLM broker's imports, is over), at most
    ``quiet_max_s`` more; the seconds waited in all."""
    began = time.monotonic()
    time.sleep(settle_s)
    while time.monotonic() - began < settle_s + quiet_max_s:
        used, _ = _window(port, home, 0.25)
        if sum(cpu for _role, cpu in used.values()) < 0.001:
            break
    return time.monotonic() - began


def run(sessions: int, window_s: float, settle_s: float, workdir: Path,
        quiet_max_s: float = QUIET_MAX_S) -> dict[str, Any]:
    port, home = free_port(), workdir / "idle-home"
    print(f"  idle: {sessions} sessions, {window_s:g} s window", flush=True)
    with (
        FakeLLMServer(SAY) as talk,
        FakeLLMServer(echo_script(0)) as done,
        Trouper(home=home, admin_port=port) as t,
    ):
        waited = {"no session": _quiet(port, home, settle_s, quiet_max_s)}
        # a rate, not a total: a shorter window will do (nothing periodic runs without sessions)
        empty, empty_s = _window(port, home, min(window_s, 20.0))
        started = [
            t.start_session(
                TASK,
                llm=llm_config(talk if i % 2 == 0 else done),
                workspace=workdir / f"idle-{i}",
                max_iterations=5,
            )
            for i in range(sessions)
        ]
        states = {s.id: s.wait(timeout=60 + sessions * 2.0) for s in started}
        waited["sessions"] = _quiet(port, home, settle_s, quiet_max_s)
        tree = trouper_tree(port, home)
        owner = {}
        for s in started:
            own = session_processes(tree, home, s.id) or {}
            owner.update({pid: s.id for pid, role in own.items() if role not in SHARED_ROLES})
        used, used_s = _window(port, home, window_s)
    result = summarize(sessions, used_s, used, owner, states)
    result["no_session_ms_per_s"] = sum(cpu for _r, cpu in empty.values()) * 1000 / empty_s
    result["marginal_ms_per_s_per_session"] = (
        result["ms_per_s_per_session"] - result["no_session_ms_per_s"] / max(1, sessions))
    result["settle_s"] = settle_s
    result["waited_s"] = waited
    return result


def summarize(
    sessions: int,
    window_s: float,
    used: dict[int, tuple[str, float]],
    owner: dict[int, str],
    states: dict[str, AgentState],
) -> dict[str, Any]:
    def rate(seconds: float, per: int = sessions) -> float:
        """CPU seconds over the window -> ms per second per session."""
        return seconds * 1000 / window_s / max(1, per)

    by_role: dict[str, float] = {}
    for role, seconds in used.values():
        by_role[role] = by_role.get(role, 0.0) + seconds
    total = sum(by_role.values())
    by_state: dict[str, dict[str, Any]] = {}
    for state in sorted({s.value for s in states.values()}):
        ids = {sid for sid, s in states.items() if s.value == state}
        seconds = sum(cpu for pid, (_r, cpu) in used.items() if owner.get(pid) in ids)
        by_state[state] = {"sessions": len(ids), "ms_per_s_per_session": rate(seconds, len(ids))}
    busiest = sorted(used.items(), key=lambda kv: -kv[1][1])[:5]
    return {
        "sessions": sessions,
        "window_s": window_s,
        "states": {state: sum(1 for s in states.values() if s.value == state)
                   for state in sorted({s.value for s in states.values()})},
        "processes": len(used),
        "ms_per_s_per_session": rate(total),
        "by_role_ms_per_s_per_session": {r: rate(by_role[r]) for r in role_order(by_role)},
        "by_state": by_state,
        "busiest": [{"pid": pid, "role": role, "ms_per_s": rate(cpu, 1)}
                    for pid, (role, cpu) in busiest],
    }


def lines(r: dict[str, Any]) -> list[str]:
    """The workload's section of the report."""
    states = ", ".join(f"{n} {state}" for state, n in r["states"].items())
    out = [
        f"6. Idle sessions: {r['sessions']} ({states}), {r['processes']} processes, CPU over "
        f"{r['window_s']:.1f} s once settled and quiet (waited "
        f"{r['waited_s']['sessions']:.1f} s)",
        f"  ms of CPU per s per session, all processes: {fmt(r['ms_per_s_per_session'], 3)} "
        f"(the trouper with no session: {fmt(r['no_session_ms_per_s'], 3)} ms per s; "
        f"marginal per session {fmt(r['marginal_ms_per_s_per_session'], 3)})",
        "  by role, ms per s per session: " + ", ".join(
            f"{role} {fmt(ms, 3)}" for role, ms in r["by_role_ms_per_s_per_session"].items()),
        "  by state, the session's own processes: " + ", ".join(
            f"{state} {fmt(x['ms_per_s_per_session'], 3)}" for state, x in r["by_state"].items()),
        "  busiest: " + ", ".join(
            f"{b['role']} {b['pid']} {fmt(b['ms_per_s'], 3)}" for b in r["busiest"]),
    ]
    return out
