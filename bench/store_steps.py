"""The step cost of one session on each store: an embedded ``Trouper`` on PostgreSQL
beside one on SQLite, in one run (part of the ``cluster`` workload).

Two ``Trouper`` s are open at once, one with ``store=None`` (its home's SQLite file) and
one with ``store=<a scratch database>`` (dropped after); each round runs one K-step
session on each (``contenders.run_trouper``: ``echo i >> out.txt`` per step, model
latency 0, the step workload's ``echo_script``), alternating which goes first, so a
noisy machine hits both alike. A step is the time between two model requests at the
``FakeLLMServer`` (bench/common.py), pooled over every round: ``median_ms`` per store
and ``postgresql/sqlite``, the ratio of the medians. What PostgreSQL adds to a step is
its appends' round trips (a step appends the model's completion, the action and its
outcome: each a transaction on the server, with its NOTIFY), where SQLite writes a
local file.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from common import ratio
from contenders import Run, run_trouper
from step_overhead import summarize

from trouper import Trouper
from trouper.client.actor_system import free_port
from trouper.testing.postgres import scratch_database

STORES = ("sqlite", "postgresql")


def run(server: str, workdir: Path, k: int, rounds: int) -> dict[str, Any]:
    """K-step sessions on each store, ``rounds`` times; the summaries and their ratio."""
    runs: dict[str, list[Run]] = {name: [] for name in STORES}
    with contextlib.ExitStack() as ends:
        url = ends.enter_context(contextlib.contextmanager(scratch_database)(
            server, "trouper_bench"))
        ports = {name: free_port() for name in STORES}
        troupers = {
            "sqlite": ends.enter_context(Trouper(
                home=workdir / "steps-sqlite", admin_port=ports["sqlite"])),
            "postgresql": ends.enter_context(Trouper(
                home=workdir / "steps-postgresql", admin_port=ports["postgresql"], store=url)),
        }
        for r in range(rounds):
            for name in STORES[r % 2:] + STORES[: r % 2]:
                print(f"  cluster: step cost K={k} round {r + 1}/{rounds} {name}", flush=True)
                runs[name].append(run_trouper(troupers[name], ports[name], k, workdir))
    summary = {name: _brief(summarize(rs)) for name, rs in runs.items()}
    return {"k": k, "rounds": rounds, **summary,
            "postgresql/sqlite": ratio(summary["postgresql"]["median_ms"],
                                       summary["sqlite"]["median_ms"])}


def _brief(s: dict[str, Any]) -> dict[str, Any]:
    """The step workload's summary, less what is the step workload's to show."""
    keys = ("runs", "ok_runs", "notes", "median_ms", "p90_ms", "max_ms", "round_medians_ms",
            "cpu_ms_per_step_contender", "segments_ms", "others_cores")
    return {key: s.get(key) for key in keys}


def lines(r: dict[str, Any]) -> list[str]:
    """The report's rows."""
    if "skipped" in r:
        return [f"  step cost by store: skipped: {r['skipped']}"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    out = [f"  step cost by store, K={r['k']}, {r['rounds']} round(s), embedded Trouper: "
           f"SQLite {ms(r['sqlite']['median_ms'])} ms, PostgreSQL "
           f"{ms(r['postgresql']['median_ms'])} ms per step (medians); PostgreSQL / SQLite "
           f"{ms(r['postgresql/sqlite'])}"]
    for name in STORES:
        for note in r[name].get("notes") or []:
            out.append(f"    note ({name}): {note}")
    return out
