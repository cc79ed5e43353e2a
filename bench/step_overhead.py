"""Workload 1: step overhead. K-step sessions, bare loop vs trouper vs OpenHands.

Rounds alternate the contenders (rotating who goes first) so that a noisy machine
hits all of them alike. Per contender and K: the median step time over every step of
every round, the median of the first and last tenth of the steps (how a step's cost
grows with the session's length), the worst step, and CPU milliseconds per step by
process role.

This workload gives the table's "CPU per step, one session (all processes)":
``cpu_ms_per_step_contender`` of trouper at the largest K. It counts every process that
serves the session, by role (``procs.ROLES``): the Thespian admin and its logger, the root,
the LLM broker, the SessionSupervisor, RuntimeProxy and Controller, the sandbox server and
its shell (with what they ran and reaped), from the session's second model request to its
last, so session start is left out (the concurrency workload's N=1 row has it in). The
bench process (the fake LLM server) is reported apart and not in that figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common import median, percentile, ratio, step_intervals_ms
from contenders import Run, run_bare, run_openhands, run_trouper

from trouper import Trouper
from trouper.client.actor_system import free_port


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Pooled figures of one contender's runs at one K."""
    ok = [r for r in runs if r.ok]
    steps = [step_intervals_ms(r.request_times_s)[: r.k] for r in ok]
    pooled = [ms for s in steps for ms in s]
    tenth = max(1, (ok[0].k if ok else 1) // 10)
    cpu: dict[str, float] = {}
    for r in ok:
        for role, seconds in r.cpu_s.items():
            cpu[role] = cpu.get(role, 0.0) + seconds * 1000 / r.cpu_steps / len(ok)
    return {
        "runs": len(runs),
        "ok_runs": len(ok),
        "notes": [r.note.strip() for r in runs if r.note.strip()],
        "median_ms": median(pooled),
        "p90_ms": percentile(pooled, 90),
        "max_ms": max(pooled, default=None),
        "first_tenth_median_ms": median(ms for s in steps for ms in s[:tenth]),
        "last_tenth_median_ms": median(ms for s in steps for ms in s[-tenth:]),
        "round_medians_ms": [median(s) for s in steps],
        "cpu_ms_per_step": {role: round(ms, 2) for role, ms in cpu.items()},
        "cpu_ms_per_step_total": round(sum(cpu.values()), 2) if cpu else None,
        "cpu_ms_per_step_contender": round(
            sum(ms for role, ms in cpu.items() if not role.startswith("bench")), 2
        )
        if cpu
        else None,
        "segments_ms": _segments(ok),
        # cores busy with others' work (and stolen) while trouper's steps ran: the noise
        "others_cores": median(r.extra["others_cores"] for r in ok if "others_cores" in r.extra),
        "steal_cores": median(r.extra["steal_cores"] for r in ok if "steal_cores" in r.extra),
        "extra": {k: v for k, v in ok[0].extra.items() if k != "segments"} if ok else {},
    }


def _segments(runs: list[Run]) -> dict[str, dict[str, float | None]]:
    """Median, first-tenth and last-tenth ms of each part of a step (trouper only)."""
    pooled: dict[str, list[list[float]]] = {}
    for r in runs:
        for name, values in r.extra.get("segments", {}).items():
            pooled.setdefault(name, []).append(values)
    out = {}
    for name, per_run in pooled.items():
        tenth = max(1, len(per_run[0]) // 10)
        out[name] = {
            "median_ms": median(v for vs in per_run for v in vs),
            "first_tenth_ms": median(v for vs in per_run for v in vs[:tenth]),
            "last_tenth_ms": median(v for vs in per_run for v in vs[-tenth:]),
        }
    return out


def run(
    ks: list[int],
    rounds: int,
    workdir: Path,
    openhands_python: Path | None,
    latency_s: float = 0.0,
    openhands_subprocess: bool = True,
) -> dict[str, Any]:
    """Every contender at every K, ``rounds`` times; summaries and ratios by K. The
    trouper contender's sessions all run in one ``Trouper``, opened before the first."""
    results: dict[str, Any] = {"ks": ks, "rounds": rounds, "latency_s": latency_s, "by_k": {}}
    port = free_port()
    with Trouper(home=workdir / "step-home", admin_port=port) as t:
        contenders: dict[str, Any] = {
            "bare": lambda k: run_bare(k, workdir, latency_s),
            "bare-direct": lambda k: run_bare(k, workdir, latency_s, route="direct"),
            "trouper": lambda k: run_trouper(t, port, k, workdir, latency_s),
        }
        if openhands_python is not None:
            contenders["openhands"] = lambda k: run_openhands(
                openhands_python, k, workdir, latency_s
            )
        if openhands_python is not None and openhands_subprocess:
            contenders["openhands-subprocess"] = lambda k: run_openhands(
                openhands_python, k, workdir, latency_s, terminal="subprocess"
            )
        for k in ks:
            runs: dict[str, list[Run]] = {name: [] for name in contenders}
            names = list(contenders)
            for r in range(rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    print(f"  step overhead: K={k} round {r + 1}/{rounds} {name}", flush=True)
                    runs[name].append(contenders[name](k))
            summary = {name: summarize(rs) for name, rs in runs.items()}
            med = {name: s["median_ms"] for name, s in summary.items()}
            summary["ratios"] = {
                "trouper/bare": ratio(med.get("trouper"), med.get("bare")),
                "trouper/bare-direct": ratio(med.get("trouper"), med.get("bare-direct")),
                "openhands/trouper": ratio(med.get("openhands"), med.get("trouper")),
                "openhands-subprocess/trouper": ratio(
                    med.get("openhands-subprocess"), med.get("trouper")
                ),
            }
            results["by_k"][str(k)] = summary
    return results
