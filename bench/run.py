"""Run trouper's benchmark suite: print a table, write the figures as JSON.

    .venv/bin/python bench/run.py            # the full suite (builds the OpenHands venv once)
    .venv/bin/python bench/run.py --quick    # tiny K and N: a smoke run, well under a minute

Workloads (``--only`` picks some): ``step`` (K-step sessions: bare loop, trouper,
OpenHands SDK), ``start`` (start_session to the first model request), ``concurrency``
(N sessions at once, 50 ms model latency), ``recovery`` (SIGKILL an actor mid-command),
``eventlog`` (durable appends, restoring a 10,000-event session, append/read/follow
latency on SQLite and PostgreSQL: bench/store_latency.py), ``daemon`` (events to a
streaming client, SIGKILL to the next step: bench/daemon_bench.py), ``docker`` (the Docker
runtime next to the local one; skipped without an engine), ``idle`` (the CPU of sessions
that wait for the user or have finished: bench/idle.py), ``cluster`` (three daemons on one
PostgreSQL store, one SIGKILLed: the time until its sessions run on the others; and a
session's step on PostgreSQL beside SQLite: bench/cluster_failover.py). Every workload uses
the same scripted ``FakeLLMServer`` over HTTP on loopback. Results go to
``bench/results/bench-<time>.json`` and ``bench/results/latest.json``; their ``targets``
are the bench's goals with the run's values, and their ``tree_goals`` the goals of the
session tree (a Controller and a RuntimeProxy per session, under a shared SessionSupervisor) against
the bare loop and the bare fleet (bench/targets.py; bench/README.md says what each row
means and how it is measured).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checkpoints  # noqa: E402
import cluster_failover  # noqa: E402
import concurrency  # noqa: E402
import daemon_bench  # noqa: E402
import docker_runtime  # noqa: E402
import event_log  # noqa: E402
import idle  # noqa: E402
import recovery  # noqa: E402
import remote_runtime  # noqa: E402
import session_start  # noqa: E402
import step_overhead  # noqa: E402
import tracing  # noqa: E402
import venvs  # noqa: E402
from common import RESULTS_DIR, exit_now, fork_python_processes, machine  # noqa: E402
from procs import sandbox_servers  # noqa: E402
from report import render  # noqa: E402
from targets import targets, tree_goals  # noqa: E402

WORKLOADS = ("step", "start", "concurrency", "recovery", "eventlog", "docker", "remote",
             "daemon", "idle", "cluster", "checkpoints", "tracing")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny K and N (a smoke run)")
    parser.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help=f"comma-separated workloads among {', '.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--openhands",
        choices=("auto", "skip"),
        default="auto",
        help="auto: build its venv if missing (never with --quick); skip",
    )
    parser.add_argument("--ks", help="step counts for the step workload, e.g. 20,200")
    parser.add_argument("--rounds", type=int, help="rounds of the step workload")
    parser.add_argument(
        "--ns",
        help="session counts for the concurrency workload, e.g. 1,10,50,100,500,1000 (a "
        "run that runs out of time or memory is recorded as that N's error)",
    )
    parser.add_argument(
        "--mem-floor-mb",
        type=float,
        default=concurrency.MEM_FLOOR_MB,
        help="end a concurrency run when MemAvailable falls below this (default "
        f"{concurrency.MEM_FLOOR_MB:g})",
    )
    parser.add_argument("--conc-steps", type=int, help="steps per session (concurrency)")
    parser.add_argument(
        "--bare-max-n", type=int, default=concurrency.BARE_MAX_N,
        help="also run N bare loops at once for each N up to this (the floor at N; "
        f"default {concurrency.BARE_MAX_N}, 0: never)",
    )
    parser.add_argument(
        "--conc-latency-ms",
        type=float,
        default=50.0,
        help="model latency for the concurrency workload (default 50)",
    )
    parser.add_argument("--trials", type=int, help="recovery trials per killed role")
    parser.add_argument("--cluster-reps", type=int,
                        help="SIGKILLs of a daemon per heartbeat (cluster; default 5, quick 2)")
    parser.add_argument("--idle-sessions", type=int, help="sessions of the idle workload")
    parser.add_argument("--idle-window-s", type=float, help="the idle workload's window")
    parser.add_argument(
        "--install-s",
        type=float,
        help="seconds the README's first command took on a fresh machine (timed outside "
        "the bench): the value of that target row, null without it",
    )
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="model latency for the step workload (default 0)",
    )
    parser.add_argument(
        "--postgres-url",
        help="a PostgreSQL server for the eventlog workload's store backends and the cluster "
        "workload (a user that may CREATE DATABASE; default TROUPER_TEST_POSTGRES_URL, else, "
        "for eventlog only, a throwaway cluster from scripts/postgres when its binaries are "
        "installed, never in --quick)",
    )
    parser.add_argument("--out", type=Path, help="where to write the JSON (default: results/)")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(sorted(unknown))}")
    return args


def settings(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    return {
        "ks": [int(k) for k in (args.ks or ("3" if quick else "20,200")).split(",")],
        "rounds": args.rounds or (1 if quick else 3),
        # quick: one N of several sessions (each N is a child process with a trouper of its own)
        "ns": [int(n) for n in (args.ns or ("2" if quick else "1,10,50,100")).split(",")],
        "concurrency_steps": args.conc_steps or (3 if quick else 20),
        "concurrency_latency_s": args.conc_latency_ms / 1000,
        "start_samples": 1 if quick else 3,
        "start_warm": 1 if quick else 5,
        "trials": args.trials or (1 if quick else 5),
        "append_seconds": 0.02 if quick else 1.0,  # each of the 4 runs appends busily that long
        "log_events": 300 if quick else 10_000,
        "restore_samples": 1 if quick else 3,
        "docker_samples": 1 if quick else 5,
        "docker_steps": 2 if quick else 50,
        "docker_k": 3 if quick else 20,
        "remote": {"k": 3 if quick else 20, "rounds": 1 if quick else 3,
                   "warm": 1 if quick else 3, "actions": 5 if quick else 200},
        "daemon_quick": quick,
        "idle_sessions": args.idle_sessions or (2 if quick else 20),  # quick: one of each state
        # full: two periods of a local sandbox's health request (100 s), so its cost is in it
        "idle_window_s": args.idle_window_s or (0.5 if quick else 200.0),
        "idle_settle_s": 0.1 if quick else 2.0,
        # quick: a loaded machine (the suite) may never let the trouper look quiet
        "idle_quiet_max_s": 1.0 if quick else idle.QUIET_MAX_S,
        "mem_floor_mb": args.mem_floor_mb,
        "cluster_reps": args.cluster_reps or (2 if quick else 5),
        "cluster_step_k": 3 if quick else 20,
        "cluster_step_rounds": 1 if quick else 3,
        "checkpoints": {"samples": 3 if quick else 30, "k": 3 if quick else 40,
                        "rounds": 1 if quick else 4},
        "tracing": {"k": 3 if quick else 40, "rounds": 1 if quick else 4},
    }


def openhands_env(args: argparse.Namespace) -> dict[str, Any]:
    if args.openhands == "skip" or "step" not in args.only.split(","):
        return {"python": None, "note": "skipped"}
    env = venvs.openhands(create=not args.quick)
    return {"python": str(env.python) if env.python else None, "note": env.note}


def run_workloads(
    args: argparse.Namespace, cfg: dict[str, Any], oh: dict[str, Any], workdir: Path
) -> dict[str, Any]:
    oh_python = Path(oh["python"]) if oh["python"] else None
    jobs: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
        "step": (
            "step_overhead",
            lambda: step_overhead.run(
                cfg["ks"],
                cfg["rounds"],
                workdir,
                oh_python,
                args.latency_ms / 1000,
                openhands_subprocess=not args.quick,
            ),
        ),
        "start": (
            "session_start",
            lambda: session_start.run(cfg["start_samples"], cfg["start_warm"], workdir),
        ),
        "concurrency": (
            "concurrency",
            lambda: concurrency.run(
                cfg["ns"],
                cfg["concurrency_steps"],
                cfg["concurrency_latency_s"],
                workdir,
                cfg["mem_floor_mb"],
                args.bare_max_n,
            ),
        ),
        "idle": (
            "idle",
            lambda: idle.run(
                cfg["idle_sessions"], cfg["idle_window_s"], cfg["idle_settle_s"], workdir,
                cfg["idle_quiet_max_s"],
            ),
        ),
        "recovery": ("recovery", lambda: recovery.run(cfg["trials"], workdir)),
        "remote": ("remote_runtime", lambda: remote_runtime.run(workdir=workdir, **cfg["remote"])),
        "daemon": ("daemon", lambda: daemon_bench.run(cfg["daemon_quick"])),
        "checkpoints": ("checkpoints", lambda: checkpoints.run(workdir=workdir,
                                                              **cfg["checkpoints"])),
        "tracing": ("tracing", lambda: tracing.run(workdir=workdir, **cfg["tracing"])),
        "cluster": (
            "cluster",
            lambda: cluster_failover.run(
                cfg["cluster_reps"], workdir, args.postgres_url, cfg["cluster_step_k"],
                cfg["cluster_step_rounds"],
            ),
        ),
        "eventlog": (
            "event_log",
            lambda: event_log.run(
                cfg["append_seconds"], cfg["log_events"], cfg["restore_samples"], workdir,
                quick=args.quick, postgres_url=args.postgres_url,
            ),
        ),
        "docker": (
            "docker_runtime",
            lambda: docker_runtime.run(
                cfg["docker_samples"], cfg["docker_steps"], cfg["docker_k"], workdir,
                one_trouper=args.quick,
            ),
        ),
    }
    results: dict[str, Any] = {}
    for key in args.only.split(","):
        name, job = jobs[key]
        print(f"{name} ...", flush=True)
        began = time.monotonic()
        try:
            results[name] = job()
        except Exception as exc:  # noqa: BLE001 - one broken workload must not hide the rest
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results[name]["elapsed_s"] = time.monotonic() - began
    return results


def reap(workdir: Path) -> list[int]:
    """Kill sandbox servers this run left behind (there should be none); their pids."""
    left = sandbox_servers(workdir)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def write(results: dict[str, Any], out: Path | None) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = results["started_at"].replace(":", "").replace("-", "")[:15]
    path = out or RESULTS_DIR / f"bench-{stamp}{'-quick' if results['quick'] else ''}.json"
    text = json.dumps(results, indent=1, default=str)
    path.write_text(text)
    if out is None:  # a run told where to write (the suite's smoke test) leaves latest alone
        (RESULTS_DIR / ("latest-quick.json" if results["quick"] else "latest.json")
         ).write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = settings(args)
    if args.quick:  # a smoke run: its Python processes are forked, not started afresh
        fork_python_processes()
    results: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": cfg,
        "machine": machine(),
        "load_average": {"start": os.getloadavg()},
    }
    began = time.monotonic()
    oh = openhands_env(args)
    with tempfile.TemporaryDirectory(prefix="trouper-bench-") as tmp:
        workdir = Path(tmp)
        results["workloads"] = run_workloads(args, cfg, oh, workdir)
        results["leftover_sandbox_pids"] = reap(workdir)
    results["openhands_env"] = _openhands_versions(oh, results["workloads"])
    results["install_s"] = args.install_s
    results["targets"] = targets(results["workloads"], args.install_s)
    results["tree_goals"] = tree_goals(results["workloads"])
    results["elapsed_s"] = time.monotonic() - began
    results["load_average"]["end"] = os.getloadavg()  # others' work on a shared machine
    path = write(results, args.out)
    print()
    print(render(results))
    if results["leftover_sandbox_pids"]:
        print(f"\nWARNING: killed leftover sandbox servers {results['leftover_sandbox_pids']}")
    print(f"\n{results['elapsed_s']:.0f} s; figures written to {path}")
    failed = [name for name, r in results["workloads"].items() if "error" in r]
    return 1 if failed else 0


def _openhands_versions(oh: dict[str, Any], workloads: dict[str, Any]) -> dict[str, Any]:
    step = workloads.get("step_overhead", {}).get("by_k", {})
    extra = next(
        (by["openhands"]["extra"] for by in step.values() if by.get("openhands", {}).get("extra")),
        {},
    )
    return {
        **oh,
        "versions": extra.get("versions"),
        "python_version": extra.get("python"),
        "terminal": extra.get("terminal"),
    }


if __name__ == "__main__":
    exit_now(main())
