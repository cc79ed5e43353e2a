"""Workload 3: N concurrent sessions of ``steps`` steps, the model answering in 50 ms.

All N sessions are started at once in one ``Trouper``. Throughput is the steps done
divided by the wall time from the first ``start_session()`` to the last session
settled; step latency is the time between two model requests of one session (the 50
ms model latency included). The start of N sessions is the time from the first
``start_session()`` call until every one of them has made its first model request (the
LLM server records each request's time and ``x-trouper-session`` header);
``start_all_s`` is only the time the ``start_session()`` calls take to return.

CPU is utime + stime (and reaped children's) from ``/proc`` of every process of the
trouper (the Thespian admin and all below it, the sandbox servers and their shells),
from before the first session starts (once the system is ready: its broker has booted,
which imports litellm) to after the last one settled, so starting the sessions is in
it; per step = that / steps done. Memory is PSS and private memory
(Private_Clean + Private_Dirty) from ``/proc/<pid>/smaps_rollup``, summed over the same
processes: once with no session (the fixed part) and once after the run, with every
session's processes still up. Taken after the run, the sample does not slow the run.
CPU and memory are also given per role (the process name, see ``procs.ROLES``), per
session: the role's sum over its processes divided by N.

Each N runs in a child process of its own (``python concurrency.py <json>``), watched
by the bench: a run that takes too long, or leaves less than ``mem_floor_mb`` of
``MemAvailable``, is ended (the child and every process of its trouper are killed) and
recorded as an error for that N; so is one that fails to start processes. The bench and
the other Ns go on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import (
    chat_requests,
    echo_script,
    exit_now,
    expected_lines,
    percentile,
    read_lines,
    spawn,
)
from procs import (
    cpu_delta,
    kill_tree,
    machine_cpu_s,
    mem_available_mb,
    others_load,
    role_cpu_s,
    role_memory,
    roles,
    sandbox_servers,
    trouper_tree,
)

MEM_FLOOR_MB = 1536.0
"""End a run when ``MemAvailable`` falls below this (the machine is shared)."""
BARE_MAX_N = 100
"""The largest N the bare loop is also run at (``bare_fleet.py``): each of its loops holds
litellm's whole client privately once it calls, so 1,000 of them would not fit here."""


def _kind(role: str) -> str:
    return {"trouper-sandbox": "sandbox servers", "shells": "shells"}.get(role, "actors")


def run_n(
    n: int, steps: int, latency_s: float, workdir: Path, port: int, timeout_s: float,
) -> dict[str, Any]:
    from contenders import TASK, llm_config, wait_until

    from trouper import AgentState, Trouper
    from trouper.testing import FakeLLMServer

    home = workdir / f"conc-home-{n}"
    result: dict[str, Any] = {"n": n, "steps": steps, "latency_ms": latency_s * 1000}
    with (
        # bodies not kept: 20 steps of 1,000 sessions would hold about a GB of them here
        FakeLLMServer(echo_script(steps), latency_s=latency_s, keep_bodies=False) as server,
        Trouper(home=home, admin_port=port) as t,
    ):
        # the system is ready once its broker has booted (imported litellm, warmed it up):
        # a cost of opening, once, not of the sessions measured here
        if not wait_until(lambda: t.home.actor_pid_path("broker").exists(), 120.0):
            raise TimeoutError("the LLM broker did not boot within 120 s")
        idle_roles = roles(trouper_tree(port, home))
        idle_cpu = role_cpu_s(idle_roles)
        idle = role_memory(idle_roles)
        bench_cpu = time.process_time()
        machine_before = machine_cpu_s()
        began = time.time()
        sessions = [
            t.start_session(
                TASK,
                llm=llm_config(server),
                workspace=workdir / f"conc-{n}-{i}",
                max_iterations=steps + 5,
            )
            for i in range(n)
        ]
        started = time.time()
        deadline = began + timeout_s
        states = [s.wait(timeout=max(0.1, deadline - time.time())) for s in sessions]
        ended = time.time()
        machine_after = machine_cpu_s()
        bench_cpu = time.process_time() - bench_cpu
        loaded_roles = roles(trouper_tree(port, home))
        cpu = cpu_delta(idle_cpu, role_cpu_s(loaded_roles))
        # every process of the trouper, each one's own figures (per_process)
        processes = _per_process(loaded_roles)
        loaded = role_memory(loaded_roles)
        ids = [s.id for s in sessions]
        latencies = _step_latencies_ms(server, ids)
        after_start = _steps_between(server, started, ended)
        first = _first_requests(server, ids)
    finished = sum(1 for s in states if s == AgentState.FINISHED)
    good = sum(
        1
        for i in range(n)
        if read_lines(workdir / f"conc-{n}-{i}" / "out.txt")
        == expected_lines(steps)
    )
    per_step = 1000 / max(1, len(latencies))
    by_kind: dict[str, float] = defaultdict(float)
    for role, seconds in cpu.items():
        by_kind[_kind(role)] += seconds * per_step
    pss_idle = sum(r["pss_mb"] for r in idle.values())
    pss_total = sum(r["pss_mb"] for r in loaded.values())
    pss_kinds: dict[str, float] = defaultdict(float)
    for role, row in loaded.items():
        pss_kinds[_kind(role).replace(" ", "_") + "_mb"] += row["pss_mb"]
    firsts = [at - began for at in first.values()]
    result.update(
        {
            "finished": finished,
            "out_ok": good,
            "start_all_s": started - began,
            "sessions_with_request": len(first),
            "first_request_all_s": max(firsts) if len(first) == n else None,
            "first_request_p50_s": percentile(firsts, 50),
            "wall_s": ended - began,
            "steps_per_s": len(latencies) / (ended - began),
            "steps_per_s_after_start": after_start / max(1e-9, ended - started),
            "cpu_ms_per_step": dict(by_kind),
            "cpu_ms_per_step_total": sum(by_kind.values()),
            "cpu_ms_per_step_bench": bench_cpu * per_step,
            "step_p50_ms": percentile(latencies, 50),
            "step_p99_ms": percentile(latencies, 99),
            "pss_idle_mb": pss_idle,
            "pss_total_mb": pss_total,
            "pss_per_session_mb": pss_total / n,
            "pss_marginal_per_session_mb": (pss_total - pss_idle) / n,
            "pss_breakdown_mb": dict(pss_kinds),
            "private_per_session_mb": sum(r["private_mb"] for r in loaded.values()) / n,
            "by_role": _by_role(loaded, cpu, n, per_step),
            "processes": sum(int(r["processes"]) for r in loaded.values()),
            "per_process": processes,
            **others_load(machine_before, machine_after,
                          sum(cpu.values()) + bench_cpu, ended - began),
        }
    )
    # Trouper.close() stops every sandbox: any server still up is a finding, and is ended
    # here so that it does not weigh on the next N
    result["leftover_sandboxes"] = len(sandbox_servers(home))
    if result["leftover_sandboxes"]:
        kill_tree(port, home)
    result["restarts"] = _restarts(home)
    return result


def _per_process(pids: dict[int, str]) -> dict[str, dict[str, float]]:
    """Per role, the median process's private, shared and PSS MB (``smaps_rollup``):
    what one SessionSupervisor, Controller... holds, beside the role's sums."""
    from common import median
    from procs import smaps_rollup_kb

    found: dict[str, list[dict[str, int]]] = defaultdict(list)
    for pid, role in pids.items():
        rollup = smaps_rollup_kb(pid)
        if rollup:
            found[role].append(rollup)
    out = {}
    for role, rollups in found.items():
        def mb(*keys: str, rollups: list[dict[str, int]] = rollups) -> float | None:
            value = median(sum(r.get(k, 0) for k in keys) for r in rollups)
            return None if value is None else value / 1024

        out[role] = {"processes": len(rollups), "rss_mb": mb("Rss"), "pss_mb": mb("Pss"),
                     "private_mb": mb("Private_Clean", "Private_Dirty"),
                     "private_dirty_mb": mb("Private_Dirty"),
                     "shared_mb": mb("Shared_Clean", "Shared_Dirty"),
                     "anonymous_mb": mb("Anonymous")}
    return out


def _restarts(home: Path) -> dict[str, int]:
    """Children a supervisor restarted during the run, by why (none is expected: a hung
    process killed after a probe, a crash), from the home's log."""
    found: dict[str, int] = defaultdict(int)
    try:
        lines = (home / "logs" / "trouper.log").read_text(errors="replace").splitlines()
    except OSError:
        return {}
    for line in lines:
        if ": child " in line and " died: " in line:
            found["hung" if " died: hung" in line else "died"] += 1
    return dict(found)


def _by_role(
    memory: dict[str, dict[str, float]], cpu: dict[str, float], n: int, per_step: float
) -> dict[str, dict[str, float]]:
    """Per role: processes, CPU ms per step, and PSS / private MB per session and per
    process (shared roles, one per trouper, divided by N too)."""
    out = {}
    for role in list(memory) + [r for r in cpu if r not in memory]:
        mem = memory.get(role, {"processes": 0, "pss_mb": 0.0, "private_mb": 0.0,
                                "shared_mb": 0.0})
        count = int(mem["processes"])
        out[role] = {
            "processes": count,
            "cpu_ms_per_step": cpu.get(role, 0.0) * per_step,
            "pss_mb_per_session": mem["pss_mb"] / n,
            "private_mb_per_session": mem["private_mb"] / n,
            "shared_mb_per_session": mem.get("shared_mb", 0.0) / n,
            "private_mb_per_process": mem["private_mb"] / count if count else None,
        }
    return out


def _request_times(server: Any) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    for r in chat_requests(server):
        times[r.headers.get("x-trouper-session", "")].append(r.time_s)
    return times


def _first_requests(server: Any, session_ids: list[str]) -> dict[str, float]:
    """Each session's first model request (time), for those that made one."""
    times = _request_times(server)
    return {sid: times[sid][0] for sid in session_ids if times.get(sid)}


def _steps_between(server: Any, began: float, ended: float) -> int:
    """Steps that ended (a session's next model request) between two times."""
    times = _request_times(server)
    return sum(1 for ts in times.values() for t in ts[1:] if began <= t <= ended)


def _step_latencies_ms(server: Any, session_ids: list[str]) -> list[float]:
    """Time between consecutive model requests of each session, pooled."""
    times = _request_times(server)
    wanted = set(session_ids)
    return [
        (b - a) * 1000
        for sid, ts in times.items()
        if sid in wanted
        for a, b in zip(ts, ts[1:], strict=False)
    ]


def run_isolated(
    n: int, steps: int, latency_s: float, workdir: Path, mem_floor_mb: float,
) -> dict[str, Any]:
    """``run_n`` in a child process, ended if it overruns its time or the memory floor."""
    from trouper.client.actor_system import free_port

    port, home, out = free_port(), workdir / f"conc-home-{n}", workdir / f"conc-{n}.json"
    timeout_s = 120 + n * steps * 0.2
    cfg = {"n": n, "steps": steps, "latency_s": latency_s, "workdir": str(workdir),
           "port": port, "timeout_s": timeout_s, "out": str(out)}
    child = spawn("popen")([sys.executable, __file__, json.dumps(cfg)],
                             stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s + 120 + n * 0.5  # + opening, sampling, closing
    reason, lowest = None, mem_available_mb()
    while child.poll() is None:
        available = mem_available_mb()
        lowest = min(lowest, available)
        if available < mem_floor_mb:
            reason = f"out of memory: MemAvailable {available:.0f} MB < {mem_floor_mb:.0f} MB"
        elif time.monotonic() > deadline:
            reason = f"timeout: still running after {timeout_s + 120 + n * 0.5:.0f} s"
        if reason:
            child.kill()
            child.wait()
            kill_tree(port, home)
            break
        time.sleep(0.25)
    result: dict[str, Any] = {"n": n, "steps": steps}
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        reason = reason or f"the run's process exited {child.returncode} with no figures"
    if reason:
        result["error"] = reason
    result["mem_available_lowest_mb"] = lowest
    return result


def _too_big(n: int, done: list[dict[str, Any]], mem_floor_mb: float) -> str | None:
    """Why not to start N sessions, judged by the largest N >= 50 run so far (None: go)."""
    ok = [r for r in done if "error" not in r and r["n"] >= 50]
    if not ok:
        return None
    base = max(ok, key=lambda r: r["n"])
    need = base["pss_idle_mb"] + n * base["pss_marginal_per_session_mb"]
    available = mem_available_mb()
    if need <= available - mem_floor_mb:
        return None
    return (f"not run: ~{need / 1024:.1f} GB needed (PSS at N={base['n']}), "
            f"{available / 1024:.1f} GB available")


def run(
    ns: list[int], steps: int, latency_s: float, workdir: Path,
    mem_floor_mb: float = MEM_FLOOR_MB, bare_max_n: int = BARE_MAX_N,
) -> dict[str, Any]:
    """Each N, each followed at once by N bare loops at once (up to ``bare_max_n``), so
    that trouper's ratios to the bare fleet compare two runs a few seconds apart (the
    machine is shared: others' work comes and goes)."""
    results: list[dict[str, Any]] = []
    for n in ns:
        row = _one_n(n, steps, latency_s, workdir, mem_floor_mb, results)
        results.append(row)
        if n <= bare_max_n:
            print(f"  concurrency: the bare loop, N={n} at once", flush=True)
            bare = bare_fleet_isolated(n, steps, latency_s, workdir)
            row["bare_loop"] = bare
            row.update(against_bare(row, bare))
    return {"steps": steps, "latency_ms": latency_s * 1000, "mem_floor_mb": mem_floor_mb,
            "bare_max_n": bare_max_n, "by_n": results}


def _one_n(n: int, steps: int, latency_s: float, workdir: Path, mem_floor_mb: float,
           done: list[dict[str, Any]]) -> dict[str, Any]:
    print(f"  concurrency: N={n} x {steps} steps, model latency {latency_s * 1000:g} ms",
          flush=True)
    skip = _too_big(n, done, mem_floor_mb)
    if skip:
        return {"n": n, "steps": steps, "error": skip}
    try:
        return run_isolated(n, steps, latency_s, workdir, mem_floor_mb)
    except Exception as exc:  # noqa: BLE001 - one failed N must not hide the others
        return {"n": n, "steps": steps, "error": f"{type(exc).__name__}: {exc}"}


def against_bare(row: dict[str, Any], bare: dict[str, Any]) -> dict[str, float | None]:
    """trouper's figures over the bare fleet's of the same N, same run: steps/s (higher
    is better) and the time until all made their first model request (lower is)."""
    from common import ratio

    if "error" in row or "error" in bare:
        return {"steps_per_s_vs_bare": None, "first_request_all_vs_bare": None}
    return {
        "steps_per_s_vs_bare": ratio(row.get("steps_per_s"), bare.get("steps_per_s")),
        "first_request_all_vs_bare": ratio(row.get("first_request_all_s"),
                                           bare.get("first_request_all_s")),
    }


def bare_fleet_isolated(n: int, steps: int, latency_s: float, workdir: Path) -> dict[str, Any]:
    """``bare_fleet.run_fleet`` in a child process; its figures, or the error."""
    out = workdir / f"bare-fleet-{n}.json"
    cfg = {"n": n, "steps": steps, "latency_s": latency_s, "workdir": str(workdir / "bare"),
           "out": str(out)}
    script = Path(__file__).with_name("bare_fleet.py")
    child = spawn("popen")([sys.executable, str(script), json.dumps(cfg)],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        child.wait(timeout=120 + n * steps * 0.2)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the fleet, its loops and their shells
        child.wait()
        return {"n": n, "error": "timeout"}
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError) as exc:
        return {"n": n, "error": f"the fleet exited {child.returncode}: {exc}"}


def _child(cfg: dict[str, Any]) -> int:
    out = Path(cfg["out"])
    try:
        result = run_n(cfg["n"], cfg["steps"], cfg["latency_s"], Path(cfg["workdir"]),
                       cfg["port"], cfg["timeout_s"])
    except Exception as exc:  # noqa: BLE001 - reported as this N's error
        result = {"n": cfg["n"], "steps": cfg["steps"], "error": f"{type(exc).__name__}: {exc}"}
    out.write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    exit_now(_child(json.loads(sys.argv[1])))
