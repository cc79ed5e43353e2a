"""The benchmark suite still runs (a tiny smoke run; figures are not asserted: see bench/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel import forkserver

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

BENCH = Path(__file__).resolve().parent.parent / "bench" / "run.py"


GROUPS = ["step,start,daemon", "concurrency,recovery,eventlog,idle",
          "docker,remote,checkpoints,tracing"]
"""Every workload, in three runs the suite's workers share (all in one run: ~22 s alone),
but those that need a server the suite may lack (``ON_THEIR_OWN``)."""
ON_THEIR_OWN = ["cluster"]
"""Run by a test of their own, skipped without PostgreSQL."""


def test_the_groups_cover_every_workload():
    import ast

    tree = ast.parse(BENCH.read_text())  # read, not imported: importing it costs seconds
    workloads = next(ast.literal_eval(node.value) for node in tree.body
                     if isinstance(node, ast.Assign)
                     and getattr(node.targets[0], "id", "") == "WORKLOADS")
    assert sorted(",".join(GROUPS + ON_THEIR_OWN).split(",")) == sorted(workloads)


def quick_bench(out: Path, only: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return forkserver.run(  # forked: the bench's own trouper imports are paid once
        [sys.executable, str(BENCH), "--quick", "--openhands", "skip", "--only", only,
         "--out", str(out), *extra],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("only", GROUPS)
def test_quick_bench_runs_and_leaves_nothing_behind(tmp_path, only):
    out = tmp_path / "bench.json"
    result = quick_bench(out, only)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["leftover_sandbox_pids"] == []
    errors = {name: w["error"] for name, w in figures["workloads"].items()
              if isinstance(w, dict) and w.get("error")}
    assert errors == {}
    assert figures["machine"]["cpu_count"] >= 1
    goals = figures["tree_goals"]  # the session tree's goals, each row checked on its own
    assert goals and all(set(row) == {"target", "value", "met"} for row in goals.values())
    if "concurrency" in only:  # the floor at N ran beside the sessions, and did the task
        bare = figures["workloads"]["concurrency"]["by_n"][0]["bare_loop"]
        assert bare["finished"] == bare["out_ok"] == bare["n"], bare
    if "eventlog" in only:  # each store backend measured, PostgreSQL only when given one
        backends = figures["workloads"]["event_log"]["backends"]
        assert set(backends["sqlite"]) == {"append_1", "append_20", "read_1000", "follow"}
        postgres = backends["postgresql"]
        if os.environ.get("TROUPER_TEST_POSTGRES_URL"):
            assert set(postgres) == set(backends["sqlite"]), postgres
        else:
            assert postgres["skipped"].startswith("no PostgreSQL ("), postgres


def test_quick_cluster_bench_kills_a_daemon_at_each_heartbeat_and_compares_the_stores(
        tmp_path, postgres_server):
    """The cluster workload in its quick form: two SIGKILLs of a daemon per heartbeat, and
    a session's steps on each store; what it reports, never how fast."""
    out = tmp_path / "bench.json"
    result = quick_bench(out, "cluster", "--postgres-url", postgres_server)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["leftover_sandbox_pids"] == []
    cluster = figures["workloads"]["cluster"]
    assert "error" not in cluster and "skipped" not in cluster, cluster
    assert set(cluster["by_heartbeat"]) == {"1", "0.5"}
    for by in cluster["by_heartbeat"].values():
        assert len(by["trials"]) == by["repetitions"] == 2
        for trial in by["trials"]:  # each kill moved the victim's sessions to its peers
            assert trial.get("error") is None, trial
            assert trial["sessions_moved"] >= 1
            assert trial["victim"] not in trial["adopted_by"].values()
    steps = cluster["step_by_store"]
    assert steps["sqlite"]["ok_runs"] == steps["postgresql"]["ok_runs"] == 1, steps
    targets = figures["targets"]
    for row in ("cluster failover, default heartbeat, median s",
                "cluster failover, 0.5 s heartbeat, median s"):
        assert set(targets[row]) == {"target", "value", "met"}
        assert targets[row]["value"] is not None
