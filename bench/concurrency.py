"""Workload 3: N concurrent sessions of ``steps`` steps, the model answering in 50 ms.

All N sessions are started at once in one ``Trouper``. Throughput is the steps done
divided by the wall time from the first ``start_session()`` to the last session
settled; step latency is the time between two model requests of one session (the 50
ms model latency included). Memory is PSS from ``/proc/<pid>/smaps_rollup``, summed
over the actor processes (the Thespian admin and all below it), the sandbox servers and
their shells: once with no session (the fixed part) and once after the run, with every
session's processes still up. Taken after the run, the sample does not slow the run.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import chat_requests, echo_script, expected_lines, percentile, read_lines
from contenders import TASK, llm_config
from procs import Tree, cpu_s, sandbox_servers, tree_memory, trouper_tree

from trouper import AgentState, Trouper
from trouper.actor_system import free_port
from trouper.testing import FakeLLMServer


def run_n(n: int, steps: int, latency_s: float, workdir: Path, timeout_s: float) -> dict[str, Any]:
    port, home = free_port(), workdir / f"conc-home-{n}"
    result: dict[str, Any] = {"n": n, "steps": steps, "latency_ms": latency_s * 1000}
    with (
        FakeLLMServer(echo_script(steps), latency_s=latency_s) as server,
        Trouper(home=home, admin_port=port) as t,
    ):
        idle = tree_memory(trouper_tree(port, home))
        idle_cpu = _tree_cpu(trouper_tree(port, home))
        bench_cpu = time.process_time()
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
        bench_cpu = time.process_time() - bench_cpu
        tree = trouper_tree(port, home)
        loaded = tree_memory(tree)
        cpu = {kind: used - idle_cpu.get(kind, 0.0) for kind, used in _tree_cpu(tree).items()}
        cpu["bench process (LLM server, waits)"] = bench_cpu
        latencies = _step_latencies_ms(server, [s.id for s in sessions])
        after_start = _steps_between(server, started, ended)
    finished = sum(1 for s in states if s == AgentState.FINISHED)
    good = sum(
        1
        for i in range(n)
        if read_lines(workdir / f"conc-{n}-{i}" / "out.txt") == expected_lines(steps)
    )
    result.update(
        {
            "finished": finished,
            "out_ok": good,
            "start_all_s": started - began,
            "wall_s": ended - began,
            "steps_per_s": len(latencies) / (ended - began),
            "steps_per_s_after_start": after_start / max(1e-9, ended - started),
            "cpu_ms_per_step": {k: v * 1000 / max(1, len(latencies)) for k, v in cpu.items()},
            "step_p50_ms": percentile(latencies, 50),
            "step_p99_ms": percentile(latencies, 99),
            "pss_idle_mb": idle["total_mb"],
            "pss_total_mb": loaded["total_mb"],
            "pss_per_session_mb": loaded["total_mb"] / n,
            "pss_marginal_per_session_mb": (loaded["total_mb"] - idle["total_mb"]) / n,
            "pss_breakdown_mb": {k: v for k, v in loaded.items() if k.endswith("_mb")},
            "processes": int(loaded["processes"]),
            "leftover_sandboxes": len(sandbox_servers(home)),
        }
    )
    return result


def _tree_cpu(tree: Tree) -> dict[str, float]:
    """CPU seconds used so far by each kind of process of the tree."""
    return {
        "actors": sum(cpu_s(p) for p in tree.actors),
        "sandbox servers": sum(cpu_s(p) for p in tree.sandboxes),
        "shells": sum(cpu_s(p) for p in tree.shells),
    }


def _steps_between(server: FakeLLMServer, began: float, ended: float) -> int:
    """Steps that ended (a session's next model request) between two times."""
    times: dict[str, list[float]] = defaultdict(list)
    for r in chat_requests(server):
        times[r.headers.get("x-trouper-session", "")].append(r.time_s)
    return sum(1 for ts in times.values() for t in ts[1:] if began <= t <= ended)


def _step_latencies_ms(server: FakeLLMServer, session_ids: list[str]) -> list[float]:
    """Time between consecutive model requests of each session, pooled."""
    times: dict[str, list[float]] = defaultdict(list)
    for r in chat_requests(server):
        times[r.headers.get("x-trouper-session", "")].append(r.time_s)
    wanted = set(session_ids)
    return [
        (b - a) * 1000
        for sid, ts in times.items()
        if sid in wanted
        for a, b in zip(ts, ts[1:], strict=False)
    ]


def run(ns: list[int], steps: int, latency_s: float, workdir: Path) -> dict[str, Any]:
    results = []
    for n in ns:
        print(
            f"  concurrency: N={n} x {steps} steps, model latency {latency_s * 1000:g} ms",
            flush=True,
        )
        try:
            results.append(run_n(n, steps, latency_s, workdir, timeout_s=120 + n * steps * 0.2))
        except Exception as exc:  # noqa: BLE001 - one failed N must not hide the others
            results.append({"n": n, "steps": steps, "error": f"{type(exc).__name__}: {exc}"})
    return {"steps": steps, "latency_ms": latency_s * 1000, "by_n": results}
