"""Workload ``checkpoints``: what a workspace checkpoint costs per step.

1. **The store alone** (``runtimes/sandbox/checkpoints.py``), on a small workspace (20
   files, 2 KB each) and a large one (5,000 files in 50 folders, 10 KB each, 50 MB): the
   first snapshot (every file read, hashed, compressed), then ``samples`` steps that each
   append a line to one file and snapshot again (the steady state: one file reread, the
   walk and the manifest). Reported: the first's ms, the steps' median and 90th
   percentile ms, and what the store holds on disk after them.
2. **A session's step**: K-step sessions (``echo i >> out.txt``, an instant scripted
   model) with ``checkpoints`` on and off, rounds alternating which goes first; the median
   step (time between two model requests) of each, and the difference.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from common import chat_requests, echo_script, step_intervals_ms
from contenders import llm_config

from trouper import AgentState, Trouper
from trouper.runtimes.sandbox.checkpoints import Checkpoints
from trouper.testing import FakeLLMServer

WORKSPACES = {"small": (20, 1, 2_000), "large": (5_000, 50, 10_000)}
"""name -> (files, folders, bytes per file)."""


def run(samples: int, k: int, rounds: int, workdir: Path) -> dict[str, Any]:
    return {"store": {name: _store(name, *shape, samples, workdir)
                      for name, shape in WORKSPACES.items()},
            "session": _sessions(k, rounds, workdir)}


def _store(name: str, files: int, folders: int, size: int, samples: int,
           workdir: Path) -> dict[str, Any]:
    workspace, root = workdir / f"ckpt-{name}-ws", workdir / f"ckpt-{name}-store"
    for path in (workspace, root):
        shutil.rmtree(path, ignore_errors=True)
    for i in range(files):
        folder = workspace / f"d{i % folders}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i}.txt").write_bytes((f"{i} " * (size // 4)).encode()[:size])
    store = Checkpoints(str(root), str(workspace))
    began = time.perf_counter()
    store.take("first")
    first_ms = (time.perf_counter() - began) * 1000
    took = []
    changed = workspace / "d0" / "f0.txt"
    for i in range(samples):
        with changed.open("a") as f:
            f.write(f"line {i}\n")
        began = time.perf_counter()
        store.take(f"s{i}")
        took.append((time.perf_counter() - began) * 1000)
    stored = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    shutil.rmtree(workspace, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    return {"files": files, "workspace_mb": round(files * size / 1e6, 2),
            "first_ms": round(first_ms, 2), "median_ms": round(statistics.median(took), 3),
            "p90_ms": round(sorted(took)[int(len(took) * 0.9) - 1], 3),
            "store_mb_after": round(stored / 1e6, 2), "samples": samples}


def _sessions(k: int, rounds: int, workdir: Path) -> dict[str, Any]:
    steps: dict[str, list[float]] = {"on": [], "off": []}
    with Trouper(home=workdir / "ckpt-home") as t:
        for round_no in range(rounds):
            order = ("on", "off") if round_no % 2 == 0 else ("off", "on")
            for which in order:
                steps[which] += _one(t, k, which == "on", workdir)
    on, off = statistics.median(steps["on"]), statistics.median(steps["off"])
    return {"k": k, "rounds": rounds, "median_step_ms_on": round(on, 3),
            "median_step_ms_off": round(off, 3), "cost_ms": round(on - off, 3)}


def _one(t: Trouper, k: int, checkpoints: bool, workdir: Path) -> list[float]:
    workspace = workdir / f"ckpt-session-{time.monotonic_ns()}"
    with FakeLLMServer(echo_script(k)) as server:
        session = t.start_session("echo", llm=llm_config(server), workspace=workspace,
                                  max_iterations=k + 5, checkpoints=checkpoints)
        state = session.wait(timeout=60 + k * 2.0)
        times = [r.time_s for r in chat_requests(server)]
    if state != AgentState.FINISHED:
        raise RuntimeError(f"a checkpoints={checkpoints} session ended {state.value}")
    return step_intervals_ms(times)[1:k]  # the first interval holds the session's start
