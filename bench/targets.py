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


def _trouper_name(w: Workloads, layout: str | None = None) -> str:
    """The step workload's trouper contender in ``layout`` (None: the first one)."""
    troupers: dict[str, str | None] = w.get("step_overhead", {}).get(
        "troupers", {"trouper": None})
    if layout is None or len(troupers) == 1:
        return next(iter(troupers), "trouper")
    return next((name for name, lay in troupers.items() if lay == layout), "")


def _ratio(name: str, k: int, layout: str | None = None) -> Callable[[Workloads], float | None]:
    """``name`` is ``trouper/...``: the ratio of the trouper contender in ``layout``."""
    def value(w: Workloads) -> float | None:
        mine = _trouper_name(w, layout) + name.removeprefix("trouper")
        return _step(w, k).get("ratios", {}).get(mine if name.startswith("trouper/") else name)

    return value


def _one_session_cpu(w: Workloads) -> float | None:
    by_k = w.get("step_overhead", {}).get("by_k", {})
    if not by_k:
        return None
    k = "200" if "200" in by_k else max(by_k, key=int)
    return by_k[k].get(_trouper_name(w), {}).get("cpu_ms_per_step_contender")


def _rows(w: Workloads, layout: str | None = None) -> list[dict[str, Any]]:
    """The concurrency rows of ``layout`` (None: the first layout's, or all of a run of
    one layout)."""
    conc = w.get("concurrency", {})
    rows: list[dict[str, Any]] = conc.get("by_n", [])
    layouts = conc.get("layouts") or [None]
    if len(layouts) == 1:
        return rows
    return [r for r in rows if r.get("layout") == (layout or layouts[0])]


def _at_n(key: str, n: int = 100, latency_ms: float | None = None,
          layout: str | None = None) -> Callable[..., Any]:
    def value(w: Workloads) -> float | None:
        conc = w.get("concurrency", {})
        if latency_ms is not None and conc.get("latency_ms") != latency_ms:
            return None
        row = next((r for r in _rows(w, layout) if r.get("n") == n), None)
        return None if row is None or "error" in row else row.get(key)

    return value


def sessions_that_finish(w: Workloads, layout: str | None = None,
                         none_restarted: bool = False) -> float | None:
    """The largest N of the concurrency run whose every session FINISHED with the right
    ``out.txt`` (0 when none did; None without a concurrency run); ``none_restarted``:
    and no supervisor restarted a child during it."""
    if w.get("concurrency", {}).get("by_n") is None:
        return None
    ok = [r["n"] for r in _rows(w, layout)
          if "error" not in r and r.get("finished") == r["n"] and r.get("out_ok") == r["n"]
          and not (none_restarted and r.get("restarts"))]
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


TREE_GOALS: dict[str, tuple[str, float]] = {
    "PSS per session at N=100, MB": ("<=", 22.0),
    "CPU per step at N=100 (all processes), ms": ("<=", 10.0),
    "steps/s at N=100 / the bare fleet's": (">=", 0.8),
    "start of 100 sessions / the bare fleet's": ("<=", 1.1),
    "trouper / bare loop per step, K=20": ("<=", 1.5),
    "trouper / bare loop per step, K=200": ("<=", 1.5),
    "sessions that finish on this machine, none restarted": (">=", 800.0),
}
"""The goals of the design's tree (the ``split`` layout made cheap): name -> (comparison,
limit). The two fleet ratios divide trouper's figure at N = 100 by the bare fleet's of
the same N in the same run (``concurrency.against_bare``)."""


def _tree_values(layout: str) -> dict[str, Callable[[Workloads], float | None]]:
    return {
        "PSS per session at N=100, MB": _at_n("pss_per_session_mb", layout=layout),
        "CPU per step at N=100 (all processes), ms": _at_n("cpu_ms_per_step_total",
                                                           layout=layout),
        "steps/s at N=100 / the bare fleet's": _at_n("steps_per_s_vs_bare", layout=layout),
        "start of 100 sessions / the bare fleet's": _at_n("first_request_all_vs_bare",
                                                          layout=layout),
        "trouper / bare loop per step, K=20": _ratio("trouper/bare", 20, layout),
        "trouper / bare loop per step, K=200": _ratio("trouper/bare", 200, layout),
        "sessions that finish on this machine, none restarted": lambda w: sessions_that_finish(
            w, layout, none_restarted=True),
    }


def tree_goals(workloads: Workloads, layouts: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """The design tree's goals (``TREE_GOALS``) for each layout the run measured, each
    row in the targets' format (``target``, ``value``, ``met``)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for layout in layouts:
        values = _tree_values(layout)
        out[layout] = {}
        for name, (op, limit) in TREE_GOALS.items():
            value = values[name](workloads)
            met = None if value is None else (value <= limit if op == "<=" else value >= limit)
            out[layout][name] = {"target": f"{op} {limit:g}", "value": value, "met": met}
    return out


def tree_goal_lines(goals: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The design tree's goals, one column per layout."""
    if not goals:
        return []
    layouts = list(goals)
    width = max(len(name) for name in TREE_GOALS)
    lines = ["Goals of the design's tree (split), each layout measured in this run"]
    lines.append(f"  {'goal'.ljust(width)}  {'target':>8}  "
                 + "  ".join(f"{layout:>16}" for layout in layouts))
    for name, (op, limit) in TREE_GOALS.items():
        cells = []
        for layout in layouts:
            row = goals[layout][name]
            value = row["value"]
            verdict = {True: "met", False: "NOT", None: "-"}[row["met"]]
            digits = 2 if value is not None and abs(value) < 10 else 1
            cells.append(f"{fmt(value, digits)} {verdict}".rjust(16))
        lines.append(f"  {name.ljust(width)}  {op + ' ' + format(limit, 'g'):>8}  "
                     + "  ".join(cells))
    return lines


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
