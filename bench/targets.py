"""The goals of issue 14 (and the older OpenHands ratios), checked against a run's figures.

Each target comes out as ``{"target": "<= 1.5", "value": <number or None>, "met": <bool or
None>}``: ``value`` is None when the run did not measure the figure (a workload left out,
another K or N, or a failed run) and ``met`` is then None. bench/README.md says what each
row means and how it is measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common import fmt

Workloads = dict[str, Any]

TARGETS: dict[str, tuple[str, float]] = {
    "trouper / bare loop per step, K=200": ("<=", 1.5),
    "trouper / bare loop per step, K=20": ("<=", 1.5),
    "CPU per step, one session (all processes), ms": ("<=", 6.0),
    "CPU per step at N=100, ms": ("<=", 8.0),
    "steps/s at N=100, 50 ms model latency": (">=", 250.0),
    "step p50 at N=100, ms": ("<=", 150.0),
    "start of 100 sessions, s": ("<=", 3.0),
    "PSS per session at N=100, MB": ("<=", 20.0),
    "sessions that finish on this machine": (">=", 1000.0),
    "CPU of an idle session, ms per s": ("<=", 0.05),
    "RuntimeProxy kill -> RUNNING, median ms": ("<=", 50.0),
    "README's first command on a fresh machine, s": ("<=", 45.0),
    "openhands / trouper per step, K=200": (">=", 3.0),
    "openhands (subprocess terminal) / trouper per step, K=200": (">=", 3.0),
}
"""Name -> (comparison, limit). The first twelve are issue 14's table, in its order."""
INSTALL = "README's first command on a fresh machine, s"
"""Timed outside the bench (a fresh machine): given to ``run.py --install-s``."""


def _step(w: Workloads, k: int) -> dict[str, Any]:
    return w.get("step_overhead", {}).get("by_k", {}).get(str(k), {})


def _ratio(name: str, k: int) -> Callable[[Workloads], float | None]:
    return lambda w: _step(w, k).get("ratios", {}).get(name)


def _one_session_cpu(w: Workloads) -> float | None:
    by_k = w.get("step_overhead", {}).get("by_k", {})
    if not by_k:
        return None
    k = "200" if "200" in by_k else max(by_k, key=int)
    return by_k[k].get("trouper", {}).get("cpu_ms_per_step_contender")


def _at_n(key: str, n: int = 100, latency_ms: float | None = None) -> Callable[..., Any]:
    def value(w: Workloads) -> float | None:
        conc = w.get("concurrency", {})
        if latency_ms is not None and conc.get("latency_ms") != latency_ms:
            return None
        row = next((r for r in conc.get("by_n", []) if r.get("n") == n), None)
        return None if row is None or "error" in row else row.get(key)

    return value


def sessions_that_finish(w: Workloads) -> float | None:
    """The largest N of the concurrency run whose every session FINISHED with the right
    ``out.txt`` (0 when none did; None without a concurrency run)."""
    by_n = w.get("concurrency", {}).get("by_n")
    if by_n is None:
        return None
    ok = [r["n"] for r in by_n
          if "error" not in r and r.get("finished") == r["n"] and r.get("out_ok") == r["n"]]
    return max(ok, default=0)


VALUES: dict[str, Callable[[Workloads], float | None]] = {
    "trouper / bare loop per step, K=200": _ratio("trouper/bare", 200),
    "trouper / bare loop per step, K=20": _ratio("trouper/bare", 20),
    "CPU per step, one session (all processes), ms": _one_session_cpu,
    "CPU per step at N=100, ms": _at_n("cpu_ms_per_step_total"),
    "steps/s at N=100, 50 ms model latency": _at_n("steps_per_s", latency_ms=50.0),
    "step p50 at N=100, ms": _at_n("step_p50_ms"),
    "start of 100 sessions, s": _at_n("first_request_all_s"),
    "PSS per session at N=100, MB": _at_n("pss_per_session_mb"),
    "sessions that finish on this machine": sessions_that_finish,
    "CPU of an idle session, ms per s": lambda w: w.get("idle", {}).get(
        "ms_per_s_per_session"),
    "RuntimeProxy kill -> RUNNING, median ms": lambda w: w.get("recovery", {})
    .get("by_role", {}).get("runtime", {}).get("median_running_ms"),
    "openhands / trouper per step, K=200": _ratio("openhands/trouper", 200),
    "openhands (subprocess terminal) / trouper per step, K=200": _ratio(
        "openhands-subprocess/trouper", 200),
}


def targets(workloads: Workloads, install_s: float | None = None) -> dict[str, dict[str, Any]]:
    """Each target with the measured value (None when not measured) and whether it is met.

    ``install_s``: the README's first command timed on a fresh machine (outside the bench).
    """
    out = {}
    for name, (op, limit) in TARGETS.items():
        value = install_s if name == INSTALL else VALUES[name](workloads)
        met = None if value is None else (value <= limit if op == "<=" else value >= limit)
        out[name] = {"target": f"{op} {limit:g}", "value": value, "met": met}
    return out


def target_lines(t: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["Targets (issue 14)"]
    width = max((len(name) for name in t), default=0)
    for name, row in t.items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[row["met"]]
        value = row["value"]
        digits = 3 if value is not None and abs(value) < 1 else 2
        lines.append(
            f"  {name.ljust(width)}  {fmt(value, digits).rjust(9)}  "
            f"(target {row['target']}): {verdict}"
        )
    return lines
