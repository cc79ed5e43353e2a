"""The bench's printed tables (the targets are in targets.py)."""

from __future__ import annotations

from typing import Any

import docker_runtime
from common import fmt, median
from procs import role_order
from targets import target_lines, tree_goal_lines


def _line(cells: list[str], widths: list[int]) -> str:
    return "  " + "  ".join(
        c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=False))
    )


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [_line(header, widths), *(_line(r, widths) for r in rows)]


CONTENDERS = ("bare", "bare-direct", "trouper", "openhands", "openhands-subprocess")


def step_lines(r: dict[str, Any]) -> list[str]:
    head = [
        "K",
        "contender",
        "median ms",
        "first->last tenth",
        "p90 ms",
        "max ms",
        "CPU ms/step",
        "x trouper",
    ]
    rows = []
    for k, by in r["by_k"].items():
        base = (by.get("trouper") or {}).get("median_ms")
        for name in CONTENDERS:
            s = by.get(name)
            if not s or s.get("median_ms") is None:
                continue
            rows.append(
                [
                    k,
                    name,
                    fmt(s["median_ms"]),
                    f"{s['first_tenth_median_ms']:.1f} -> {s['last_tenth_median_ms']:.1f}",
                    fmt(s["p90_ms"]),
                    fmt(s["max_ms"]),
                    fmt(s.get("cpu_ms_per_step_contender", s.get("cpu_ms_per_step_total"))),
                    fmt(s["median_ms"] / base if base else None, 2, "x"),
                ]
            )
    lines = [
        f"1. Step overhead: ms per step (between two model requests at the server), "
        f"{r['rounds']} round(s), model latency {r['latency_s'] * 1000:g} ms"
    ]
    lines += _table(head, rows)
    for k, by in r["by_k"].items():
        lines += _trouper_parts(f"trouper K={k}", by.get("trouper", {}))
        ratios = ", ".join(f"{name} {fmt(value, 2)}" for name, value in by["ratios"].items()
                           if value is not None)
        lines.append(f"  K={k} ratios: {ratios}")
    for by in r["by_k"].values():
        for name in CONTENDERS:
            for note in (by.get(name) or {}).get("notes", []):
                lines.append(f"  note ({name}): {note}")
    return lines


def _trouper_parts(name: str, trouper: dict[str, Any]) -> list[str]:
    """A trouper contender's step cut in three, its CPU by role, and the machine's noise."""
    lines = []
    for part, seg in trouper.get("segments_ms", {}).items():
        lines.append(
            f"  {name} {part}: {fmt(seg['median_ms'], 2)} ms "
            f"({fmt(seg['first_tenth_ms'], 2)} -> {fmt(seg['last_tenth_ms'], 2)})"
        )
    if trouper.get("cpu_ms_per_step"):
        parts = [
            f"{role} {ms:.2f}"
            for role, ms in sorted(trouper["cpu_ms_per_step"].items(), key=lambda kv: -kv[1])
            if ms > 0
        ]
        lines.append(f"  {name} CPU ms per step by role: " + ", ".join(parts))
    if trouper.get("others_cores") is not None:
        lines.append(f"  {name}: others' work used {fmt(trouper['others_cores'], 2)} cores, "
                     f"the hypervisor stole {fmt(trouper.get('steal_cores'), 2)} (medians)")
    return lines


def start_lines(r: dict[str, Any], openhands_start_ms: float | None) -> list[str]:
    lines = ["2. Session start, local runtime (median ms)"]
    rows = [
        ["Trouper() open", fmt(r["open_ms"])],
        [
            "first session: start_session() -> first model request",
            fmt(r["first_session_to_first_request_ms"]),
        ],
        [
            "later sessions: start_session() -> first model request",
            fmt(r["warm_to_first_request_ms"]),
        ],
        ["  p90", fmt(r["warm_to_first_request_p90_ms"])],
        ["start_session() returns", fmt(r["start_session_returns_ms"])],
        ["Trouper.close()", fmt(r["close_ms"])],
    ]
    if openhands_start_ms is not None:
        rows.append(["openhands: Conversation() -> first model request", fmt(openhands_start_ms)])
    lines += _table(["", "ms"], rows)
    by_role = r.get("warm_session_cpu_ms_by_role") or {}
    if by_role:
        total = sum(by_role.values())
        parts = ", ".join(f"{role} {ms:.1f}" for role, ms in
                          sorted(by_role.items(), key=lambda kv: -kv[1]) if ms >= 0.05)
        lines.append(f"  CPU of a later session, start to finish (one step), ms: "
                     f"{total:.1f} ({parts})")
    return lines


def concurrency_lines(r: dict[str, Any]) -> list[str]:
    lines = [
        f"3. Concurrency: N sessions x {r['steps']} steps, model latency "
        f"{r['latency_ms']:g} ms; steps/s over the whole run and once all were started; "
        "all started: first start_session() -> every session's first model request; "
        "calls: start_session() calls returning; PSS and CPU (start included, bench "
        "process not) over actors + sandbox servers + shells (fixed: with no session)"
    ]
    head = [
        "N",
        "finished",
        "steps/s",
        "after start",
        "p50 ms",
        "p99 ms",
        "PSS/session MB",
        "marginal MB",
        "fixed MB",
        "procs",
        "all started s",
        "calls s",
        "wall s",
        "CPU ms/step",
    ]
    rows = []
    for n in r["by_n"]:
        if "finished" not in n:
            rows.append([str(n["n"]), n.get("error", "?")[:80]] + [""] * (len(head) - 2))
            continue
        rows.append(
            [
                str(n["n"]),
                f"{n['finished']}/{n['n']}",
                fmt(n["steps_per_s"]),
                fmt(n["steps_per_s_after_start"]),
                fmt(n["step_p50_ms"]),
                fmt(n["step_p99_ms"]),
                fmt(n["pss_per_session_mb"]),
                fmt(n["pss_marginal_per_session_mb"]),
                fmt(n["pss_idle_mb"]),
                str(n["processes"]),
                fmt(n.get("first_request_all_s"), 2),
                fmt(n["start_all_s"], 2),
                fmt(n["wall_s"], 2),
                fmt(n.get("cpu_ms_per_step_total")),
            ]
        )
    lines += _table(head, rows)
    lines += [f"  N={n['n']}: {n['error']}" for n in r["by_n"] if "error" in n and "finished" in n]
    lines += [f"  N={n['n']}: WARNING: {n['leftover_sandboxes']} "
              "sandbox server(s) still up after Trouper.close() (ended by the bench)"
              for n in r["by_n"] if n.get("leftover_sandboxes")]
    lines += [f"  N={n['n']}: others' work used "
              f"{fmt(n.get('others_cores'), 2)} cores, the hypervisor stole "
              f"{fmt(n.get('steal_cores'), 2)}; restarts {n.get('restarts') or 'none'}"
              for n in r["by_n"] if "finished" in n]
    return lines + bare_fleet_lines(r["by_n"]) + role_lines(r["by_n"])


def bare_fleet_lines(by_n: list[dict[str, Any]]) -> list[str]:
    """The floor at each N: N bare loops at once (``bare_fleet.py``), beside trouper's."""
    lines = []
    for n in by_n:
        bare = n.get("bare_loop")
        if not bare:
            continue
        if "error" in bare:
            lines.append(f"  the bare loop, N={n['n']} at once: {bare['error']}")
            continue
        mine = "" if "finished" not in n else (
            " (trouper: "
            f"{fmt(n['steps_per_s'])} steps/s = {fmt(n.get('steps_per_s_vs_bare'), 2)}x, "
            f"p50 {fmt(n['step_p50_ms'])} ms, "
            f"all started {fmt(n.get('first_request_all_s'), 2)} s = "
            f"{fmt(n.get('first_request_all_vs_bare'), 2)}x, "
            f"{fmt(n.get('cpu_ms_per_step_total'))} ms CPU/step)")
        lines.append(
            f"  the bare loop, N={n['n']} at once: {bare['finished']}/{bare['n']} finished, "
            f"{fmt(bare['steps_per_s'])} steps/s, p50 {fmt(bare['step_p50_ms'])} ms, "
            f"all started {fmt(bare.get('first_request_all_s'), 2)} s, "
            f"{fmt(bare['cpu_ms_per_step'])} ms CPU/step, others' work "
            f"{fmt(bare.get('others_cores'), 2)} cores{mine}")
    return lines


def role_lines(by_n: list[dict[str, Any]]) -> list[str]:
    """Per role, per session: CPU ms per step, private and PSS MB, for each N."""
    runs = [n for n in by_n if n.get("by_role")]
    if not runs:
        return []
    lines = ["  by role, per session (role's sum / N): CPU ms/step | private MB | PSS MB"]
    head = ["role"] + [f"N={n['n']}" for n in runs]
    names = role_order({role for n in runs for role in n["by_role"]})
    rows = []
    for role in names:
        cells = [role]
        for n in runs:
            x = n["by_role"].get(role)
            cells.append(
                f"{fmt(x['cpu_ms_per_step'], 2)} | {fmt(x['private_mb_per_session'])} | "
                f"{fmt(x['pss_mb_per_session'])}"
                if x
                else "-"
            )
        rows.append(cells)
    rows.append(
        ["all"]
        + [
            f"{fmt(n['cpu_ms_per_step_total'], 2)} | {fmt(n['private_per_session_mb'])} | "
            f"{fmt(n['pss_per_session_mb'])}"
            for n in runs
        ]
    )
    lines += _table(head, rows)
    return lines + process_lines(runs)


def process_lines(runs: list[dict[str, Any]]) -> list[str]:
    """One process of each role (the median one): private, shared, PSS MB."""
    runs = [n for n in runs if n.get("per_process")]
    if not runs:
        return []
    lines = ["  one process of each role (median): private | shared | PSS MB"]
    head = ["role"] + [f"N={n['n']}" for n in runs]
    rows = []
    for role in role_order({role for n in runs for role in n["per_process"]}):
        cells = [role]
        for n in runs:
            x = n["per_process"].get(role)
            cells.append(f"{fmt(x['private_mb'])} | {fmt(x['shared_mb'])} | {fmt(x['pss_mb'])}"
                         if x else "-")
        rows.append(cells)
    return lines + _table(head, rows)


def recovery_lines(r: dict[str, Any]) -> list[str]:
    lines = [
        f"4. Recovery: SIGKILL {r['kill_after_s']:g} s after a {r['command_s']:g} s "
        f"command's action was recorded; median ms from the kill ({r['trials']} trial(s) "
        "per role)"
    ]
    head = [
        "killed",
        "ok",
        "command left",
        "-> runtime back",
        "-> RUNNING",
        "-> first event",
        "-> outcome",
        "-> next request",
    ]
    rows = [
        [
            role,
            f"{by['ok_trials']}/{r['trials']}",
            fmt(by.get("median_command_left_ms")),
            fmt(by.get("median_runtime_back_ms")),
            fmt(by["median_running_ms"]),
            fmt(by["median_first_event_ms"]),
            fmt(by["median_outcome_ms"]),
            fmt(by["median_next_request_ms"]),
        ]
        for role, by in r["by_role"].items()
    ]
    how = {
        t.get("how", "").split(" pid")[0]
        for by in r["by_role"].values()
        for t in by["trials"]
        if t.get("how")
    }
    errors = [t["error"] for by in r["by_role"].values() for t in by["trials"] if "error" in t]
    return (
        lines
        + _table(head, rows)
        + [f"  killed with: {', '.join(sorted(how))}"]
        + [f"  error: {e}" for e in errors[:3]]
    )


def event_log_lines(r: dict[str, Any]) -> list[str]:
    lines = ["5. Event log (SQLite, WAL)"]
    rows = [
        [
            f"appends/s, synchronous={s.upper()}, {b} event(s)/tx",
            fmt(r[f"{s}_batch{b}_events_per_s"], 0),
        ]
        for s in ("normal", "full")
        for b in (1, 10)
    ]
    n = r["read_events"]
    rows += [
        [f"read {n:,} events, rows only (ms)", fmt(r["read_rows_ms"])],
        [
            f"read {n:,} events into typed events (ms, median of 3)",
            fmt(median(r["read_parsed_ms"])),
        ],
    ]
    restore = r.get("restore", {})
    rows.append(
        [
            f"restore a {restore.get('events', 0):,}-event session -> first model request (ms)",
            fmt(restore.get("median_ms")),
        ]
    )
    backends = r.get("backends")
    import store_latency

    extra = store_latency.lines(backends, fmt) if backends else []
    return lines + _table(["", ""], rows) + extra


def _remote_lines(r: dict[str, Any]) -> list[str]:
    from remote_runtime import lines

    return lines(r)


def _idle_lines(r: dict[str, Any]) -> list[str]:
    from idle import lines

    return lines(r)


def _daemon_lines(r: dict[str, Any]) -> list[str]:
    from daemon_bench import lines

    return lines(r)


def _cluster_lines(r: dict[str, Any]) -> list[str]:
    from cluster_failover import lines

    return lines(r)


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    oh = results["openhands_env"]
    lines = [
        f"trouper bench ({'quick' if results['quick'] else 'full'}), {results['started_at']}",
        f"machine: {m['cpu_count']} x {m['cpu_model']}, {m['mem_total_gib']} GiB, {m['os']}",
        "load average (1, 5, 15 min): "
        + "; ".join(
            f"{when} " + ", ".join(f"{x:.2f}" for x in load)
            for when, load in results.get("load_average", {}).items()
        ),
        f"python {m['python']}, " + ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v),
        f"openhands: {oh['note']}" + (f" ({oh['versions']})" if oh.get("versions") else ""),
        "",
    ]
    w = results["workloads"]
    step = w.get("step_overhead")
    if step and "by_k" in step:
        lines += step_lines(step) + [""]
    oh_start = None
    if step and "by_k" in step:
        oh_start = next(
            (
                by["openhands"]["extra"].get("start_to_first_request_ms")
                for by in step["by_k"].values()
                if by.get("openhands", {}).get("extra")
            ),
            None,
        )
    sections = [
        ("session_start", lambda r: start_lines(r, oh_start)),
        ("concurrency", concurrency_lines),
        ("recovery", recovery_lines),
        ("event_log", event_log_lines),
        ("docker_runtime", lambda r: docker_runtime.lines(r, fmt, _table)),
        ("remote_runtime", _remote_lines),
        ("daemon", _daemon_lines),
        ("idle", _idle_lines),
        ("cluster", _cluster_lines),
    ]
    for name, render_section in sections:
        if name in w and "error" not in w[name]:
            lines += render_section(w[name]) + [""]
    for name, r in w.items():
        if "error" in r:
            lines += [f"{name}: FAILED: {r['error']}", ""]
    goals = tree_goal_lines(results.get("tree_goals") or {})
    return "\n".join(lines + target_lines(results["targets"]) + ([""] + goals if goals else []))
