"""Workload 2: session start, from ``start_session()`` to the first model request.

Each sample opens a ``Trouper`` (timed), starts one session on the fresh system (the
first: its model call is the LLM broker's first) and then ``warm`` more, one after the
other, on the same system. The first model request's arrival at the server ends each
measurement. Also timed: ``start_session()`` returning, and ``close()``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from common import chat_requests, echo_script, median, percentile
from contenders import TASK, llm_config, wait_until
from procs import cpu_delta, role_cpu_s, roles, trouper_tree

from trouper import Trouper
from trouper.client.actor_system import free_port
from trouper.testing import FakeLLMServer


def _one_start(t: Trouper, server: FakeLLMServer, workspace: Path) -> tuple[float, float]:
    """(ms until start_session returned, ms until the server got the first request)."""
    server.reset()
    started = time.time()
    session = t.start_session(TASK, llm=llm_config(server), workspace=workspace, max_iterations=5)
    returned = time.time()
    if not wait_until(lambda: bool(chat_requests(server)), 30.0):
        raise TimeoutError("no model request within 30 s of start_session()")
    first = chat_requests(server)[0].time_s
    session.wait(timeout=30.0)
    return (returned - started) * 1000, (first - started) * 1000


def _role_cpu(port: int, home: Path) -> dict[str, float]:
    return role_cpu_s(roles(trouper_tree(port, home)))


def run(samples: int, warm: int, workdir: Path) -> dict[str, Any]:
    opens, closes, cold, warm_ms, returns = [], [], [], [], []
    cpu_by_role: dict[str, list[float]] = {}
    with FakeLLMServer(echo_script(1)) as server:
        for i in range(samples):
            print(f"  session start: sample {i + 1}/{samples}", flush=True)
            began = time.perf_counter()
            port, home = free_port(), workdir / f"start-home-{i}"
            t = Trouper(home=home, admin_port=port)
            opens.append((time.perf_counter() - began) * 1000)
            try:
                before: dict[str, float] = {}
                for j in range(warm + 1):
                    returned_ms, first_ms = _one_start(t, server, workdir / f"start-{i}-{j}")
                    returns.append(returned_ms)
                    (cold if j == 0 else warm_ms).append(first_ms)
                    if j == 0:
                        before = _role_cpu(port, home)
                if warm:  # the warm sessions' whole lives (start, one step, finish), by role
                    spent = cpu_delta(before, _role_cpu(port, home))
                    for role, cpu_s in spent.items():
                        cpu_by_role.setdefault(role, []).append(cpu_s / warm * 1000)
            finally:
                began = time.perf_counter()
                t.close()
                closes.append((time.perf_counter() - began) * 1000)
    return {
        "samples": samples,
        "warm_per_sample": warm,
        "open_ms": median(opens),
        "first_session_to_first_request_ms": median(cold),
        "warm_to_first_request_ms": median(warm_ms),
        "warm_to_first_request_p90_ms": percentile(warm_ms, 90),
        "start_session_returns_ms": median(returns),
        "close_ms": median(closes),
        "warm_session_cpu_ms_by_role": {role: median(values)
                                        for role, values in cpu_by_role.items()},
        "raw": {"open_ms": opens, "cold_ms": cold, "warm_ms": warm_ms, "close_ms": closes},
    }
