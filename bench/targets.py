"""The bench's goals (and the older OpenHands ratios) and the session tree's goals
(``TREE_GOALS``), checked against a run's figures.

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
    "PostgreSQL append median, 1 event, loopback, ms": ("<=", 2.0),
    "cluster failover, default heartbeat, median s": ("<=", 5.0),
    "cluster failover, 0.5 s heartbeat, median s": ("<=", 2.0),
    "checkpoint per step, 20-file workspace, median ms": ("<=", 2.0),
    "checkpoint per step, 5,000-file 50 MB workspace, median ms": ("<=", 100.0),
    "session step, checkpoints on - off, ms": ("<=", 3.0),
    "session step, tracing on - off, ms": ("<=", 2.0),
    "openhands / trouper per step, K=200": (">=", 3.0),
    "openhands (subprocess terminal) / trouper per step, K=200": (">=", 3.0),
}
"""Name -> (comparison, limit). The first eighteen are bench/README.md's goal table, in order."""
INSTALL = "README's first command on a fresh machine, s"
"""Timed outside the bench (a fresh machine): given to ``run.py --install-s``."""


def _step(w: Workloads, k: int) -> dict[str, Any]:
    return w.get("step_overhead", {}).get("by_k", {}).get(str(k), {})


def _ratio(name: str, k: int) -> Callable[[Workloads], float | None]:
    def value(w: Workloads) -> float | None:
        return _step(w, k).get("ratios", {}).get(name)

    return value


def _one_session_cpu(w: Workloads) -> float | None:
    by_k = w.get("step_overhead", {}).get("by_k", {})
    if not by_k:
        return None
    k = "200" if "200" in by_k else max(by_k, key=int)
    return by_k[k].get("trouper", {}).get("cpu_ms_per_step_contender")


def _rows(w: Workloads) -> list[dict[str, Any]]:
    """The concurrency workload's rows, one per N."""
    rows: list[dict[str, Any]] = w.get("concurrency", {}).get("by_n", [])
    return rows


def _at_n(key: str, n: int = 100, latency_ms: float | None = None) -> Callable[..., Any]:
    def value(w: Workloads) -> float | None:
        conc = w.get("concurrency", {})
        if latency_ms is not None and conc.get("latency_ms") != latency_ms:
            return None
        row = next((r for r in _rows(w) if r.get("n") == n), None)
        return None if row is None or "error" in row else row.get(key)

    return value


def sessions_that_finish(w: Workloads, none_restarted: bool = False) -> float | None:
    """The largest N of the concurrency run whose every session FINISHED with the right
    ``out.txt`` (0 when none did; None without a concurrency run); ``none_restarted``:
    and no supervisor restarted a child during it."""
    if w.get("concurrency", {}).get("by_n") is None:
        return None
    ok = [r["n"] for r in _rows(w)
          if "error" not in r and r.get("finished") == r["n"] and r.get("out_ok") == r["n"]
          and not (none_restarted and r.get("restarts"))]
    return max(ok, default=0)


def _postgres_append_ms(w: Workloads) -> float | None:
    """The eventlog workload's median one-event append on PostgreSQL (None if skipped)."""
    pg = w.get("event_log", {}).get("backends", {}).get("postgresql", {})
    value: float | None = pg.get("append_1", {}).get("median_ms")
    return value


def _failover_s(heartbeat: str) -> Callable[[Workloads], float | None]:
    """The cluster workload's median failover at that heartbeat (None if skipped)."""
    def value(w: Workloads) -> float | None:
        by = w.get("cluster", {}).get("by_heartbeat", {}).get(heartbeat, {})
        median_s: float | None = by.get("median_s")
        return median_s

    return value


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
    "PostgreSQL append median, 1 event, loopback, ms": _postgres_append_ms,
    "cluster failover, default heartbeat, median s": _failover_s("1"),
    "cluster failover, 0.5 s heartbeat, median s": _failover_s("0.5"),
    "checkpoint per step, 20-file workspace, median ms": lambda w: w.get(
        "checkpoints", {}).get("store", {}).get("small", {}).get("median_ms"),
    "checkpoint per step, 5,000-file 50 MB workspace, median ms": lambda w: w.get(
        "checkpoints", {}).get("store", {}).get("large", {}).get("median_ms"),
    "session step, tracing on - off, ms": lambda w: w.get("tracing", {}).get("cost_ms"),
    "session step, checkpoints on - off, ms": lambda w: w.get("checkpoints", {}).get(
        "session", {}).get("cost_ms"),
    "openhands / trouper per step, K=200": _ratio("openhands/trouper", 200),
    "openhands (subprocess terminal) / trouper per step, K=200": _ratio(
        "openhands-subprocess/trouper", 200),
}


def _checked(limits: dict[str, tuple[str, float]], value_of: Callable[[str], float | None]
             ) -> dict[str, dict[str, Any]]:
    """Each row of ``limits`` as ``{"target", "value", "met"}`` (``met`` None unmeasured)."""
    out = {}
    for name, (op, limit) in limits.items():
        value = value_of(name)
        met = None if value is None else (value <= limit if op == "<=" else value >= limit)
        out[name] = {"target": f"{op} {limit:g}", "value": value, "met": met}
    return out


def targets(workloads: Workloads, install_s: float | None = None) -> dict[str, dict[str, Any]]:
    """Each target with the measured value (None when not measured) and whether it is met.

    ``install_s``: the README's first command timed on a fresh machine (outside the bench).
    """
    return _checked(TARGETS, lambda name: install_s if name == INSTALL
                    else VALUES[name](workloads))


TREE_GOALS: dict[str, tuple[str, float]] = {
    "PSS per session at N=100, MB": ("<=", 22.0),
    "CPU per step at N=100 (all processes), ms": ("<=", 10.0),
    "steps/s at N=100 / the bare fleet's": (">=", 0.8),
    "start of 100 sessions / the bare fleet's": ("<=", 1.1),
    "trouper / bare loop per step, K=20": ("<=", 1.5),
    "trouper / bare loop per step, K=200": ("<=", 1.5),
    "sessions that finish on this machine, none restarted": (">=", 800.0),
}
"""The goals of the session tree (per session a Controller and a RuntimeProxy, each a
process of its own, under a SessionSupervisor shared by a group) beside the bare loop:
name -> (comparison, limit). The two fleet ratios divide trouper's figure at N = 100 by
the bare fleet's of the same N in the same run (``concurrency.against_bare``)."""

TREE_VALUES: dict[str, Callable[[Workloads], float | None]] = {
    "PSS per session at N=100, MB": _at_n("pss_per_session_mb"),
    "CPU per step at N=100 (all processes), ms": _at_n("cpu_ms_per_step_total"),
    "steps/s at N=100 / the bare fleet's": _at_n("steps_per_s_vs_bare"),
    "start of 100 sessions / the bare fleet's": _at_n("first_request_all_vs_bare"),
    "trouper / bare loop per step, K=20": _ratio("trouper/bare", 20),
    "trouper / bare loop per step, K=200": _ratio("trouper/bare", 200),
    "sessions that finish on this machine, none restarted": lambda w: sessions_that_finish(
        w, none_restarted=True),
}


def tree_goals(workloads: Workloads) -> dict[str, dict[str, Any]]:
    """The session tree's goals (``TREE_GOALS``), each row in the targets' format
    (``target``, ``value``, ``met``)."""
    return _checked(TREE_GOALS, lambda name: TREE_VALUES[name](workloads))


def tree_goal_lines(goals: dict[str, dict[str, Any]]) -> list[str]:
    """The session tree's goals, printed as the targets are."""
    if not goals:
        return []
    return _lines("Goals of the session tree, against the bare loop and the bare fleet", goals)


def target_lines(t: dict[str, dict[str, Any]]) -> list[str]:
    return _lines("Targets", t)


def _lines(title: str, t: dict[str, dict[str, Any]]) -> list[str]:
    lines = [title]
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
