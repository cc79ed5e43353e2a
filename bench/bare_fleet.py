"""The floor at N: N bare agent loops at once, against the same model as N sessions.

    python bench/bare_fleet.py '{"n": 100, "steps": 20, "latency_s": 0.05, ...}'

The concurrency workload's N=100 rows (steps/s, step p50, CPU per step) depend on what
two cores can do for 100 agents at all; this measures it for the loop a user writes by
hand (``bare_worker.py``: one model call with the whole history, then the command in one
persistent bash), with nothing of trouper: no actors, no log, no sandbox server. One
process imports litellm and makes one call (so litellm's lazy setup is shared), then
forks N loops, each with its own bash and folder, all at once; each names itself in an
``x-trouper-session`` header, so the figures come from the fake model's request times,
as trouper's do: steps/s over the whole run (first fork to last loop ended), the time
between two model requests of one loop, every loop's first request. CPU is the loops'
and their shells' (``wait4``), start included; ``route`` "direct" makes the loops call
the model by trouper's direct route (``llm/direct.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import bare_worker
import litellm
from common import MODEL, echo_script, exit_now, expected_lines, percentile, read_lines
from procs import machine_cpu_s, others_load

from trouper.agent.prompt import PromptBuilder
from trouper.agent.tools import tool_specs
from trouper.testing import FakeLLMServer


def run_fleet(n: int, steps: int, latency_s: float, workdir: Path,
              route: str = "litellm") -> dict[str, Any]:
    """N bare loops at once (see the module doc); their figures."""
    from concurrency import _first_requests, _step_latencies_ms

    result: dict[str, Any] = {"n": n, "steps": steps, "latency_ms": latency_s * 1000,
                              "route": route}
    with FakeLLMServer(echo_script(steps), latency_s=latency_s, keep_bodies=False) as server:
        base = {"url": server.url, "model": MODEL, "steps": steps,
                "system": PromptBuilder().messages()[0]["content"], "tools": tool_specs(),
                "route": route}
        warm = workdir / "bare-fleet-warm"
        warm.mkdir(parents=True, exist_ok=True)
        bare_worker.warm_up({**base, "workspace": str(warm), "session": "warm"})
        ids = [f"bare-{i}" for i in range(n)]
        own_before, machine_before = time.process_time(), machine_cpu_s()
        began = time.time()
        children = {}
        for i, sid in enumerate(ids):
            folder = workdir / f"bare-fleet-{n}-{i}"
            folder.mkdir(parents=True, exist_ok=True)
            pid = os.fork()
            if pid == 0:  # the loop: never returns
                code = 1
                try:
                    # its own HTTP connections, not the warm-up's (a socket shared by
                    # forks would mix their answers)
                    litellm.in_memory_llm_clients_cache.flush_cache()
                    bare_worker.run({**base, "workspace": str(folder), "session": sid})
                    code = 0
                finally:
                    os._exit(code)
            children[pid] = folder
        cpu_s, failed = 0.0, 0
        for _ in range(n):
            _pid, status, usage = os.wait4(-1, 0)
            cpu_s += usage.ru_utime + usage.ru_stime  # the loop's and its reaped bash's
            failed += os.waitstatus_to_exitcode(status) != 0
        ended = time.time()
        ours_s = cpu_s + time.process_time() - own_before  # the loops, their shells, the model
        load = others_load(machine_before, machine_cpu_s(), ours_s, ended - began)
        latencies = _step_latencies_ms(server, ids)
        first = _first_requests(server, ids)
    good = sum(1 for folder in children.values()
               if read_lines(folder / "out.txt") == expected_lines(steps))
    firsts = [at - began for at in first.values()]
    result.update({
        "finished": n - failed,
        "out_ok": good,
        "wall_s": ended - began,
        "steps_per_s": len(latencies) / (ended - began),
        "step_p50_ms": percentile(latencies, 50),
        "step_p99_ms": percentile(latencies, 99),
        "first_request_all_s": max(firsts) if len(first) == n else None,
        "cpu_ms_per_step": cpu_s * 1000 / max(1, len(latencies)),
        **load,
    })
    return result


def _child(cfg: dict[str, Any]) -> int:
    try:
        result = run_fleet(cfg["n"], cfg["steps"], cfg["latency_s"], Path(cfg["workdir"]),
                           cfg.get("route", "litellm"))
    except Exception as exc:  # noqa: BLE001 - reported as this N's error
        result = {"n": cfg["n"], "error": f"{type(exc).__name__}: {exc}"}
    Path(cfg["out"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    exit_now(_child(json.loads(sys.argv[1])))
