"""Workload ``docker``: what the Docker runtime costs next to the local one, on the
busybox test image (``scripts/docker-engine start`` makes it).

- sandbox start: ``Sandbox.start()`` of a new session (local: the server and bash;
  docker: find the image, create and start the container, the server, ``docker exec`` of
  sh), and ``stop()`` (docker: the container removed);
- step cost: one ``run`` action (``echo i >> out.txt``) through ``runtime.execute``;
- a whole session of K steps with the scripted model, ``start_session`` to FINISHED.

Optional: without an engine or the image it is skipped, saying why.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from common import echo_command, echo_script, median, percentile
from contenders import llm_config

from trouper import AgentState, Trouper
from trouper.client.actor_system import free_port
from trouper.config.models import DockerRuntime, LocalRuntime
from trouper.messages.actions import RunCommand
from trouper.runtimes import load_sandbox
from trouper.testing import FakeLLMServer

IMAGE = "trouper-test-busybox:latest"
LIMITS = {"timeout_s": 30.0, "no_output_timeout_s": 20.0}


def engine_problem() -> str | None:
    """Why the workload cannot run here, or None."""
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get(IMAGE)
    except Exception as e:  # noqa: BLE001 - any reason is a reason to skip
        return (f"no Docker engine with {IMAGE} ({type(e).__name__}: {e}); to run it, start "
                "one and build the image with: bash scripts/docker-engine start")
    return None


def _sandbox_figures(runtime: Any, samples: int, steps: int, workdir: Path) -> dict[str, Any]:
    starts, stops, step_ms = [], [], []
    for i in range(samples):
        home = workdir / f"{runtime.kind}-home-{i}"
        sandbox = load_sandbox(runtime, session_id=f"s-bench{i}", workspace=home / "ws",
                               state_dir=home / "sessions" / f"s-bench{i}" / "runtime")
        began = time.perf_counter()
        sandbox.start()
        starts.append((time.perf_counter() - began) * 1000)
        try:
            for k in range(steps):
                began = time.perf_counter()
                outcome = sandbox.runtime.execute(f"a{k}", RunCommand(command=echo_command(k)),
                                                  **LIMITS)
                step_ms.append((time.perf_counter() - began) * 1000)
                if outcome.status != "ok":
                    raise RuntimeError(f"step {k} failed: {outcome.content}")
        finally:
            began = time.perf_counter()
            sandbox.stop()
            stops.append((time.perf_counter() - began) * 1000)
    return {"start_ms": median(starts), "stop_ms": median(stops),
            "step_ms": median(step_ms), "step_p90_ms": percentile(step_ms, 90),
            "raw": {"start_ms": starts, "stop_ms": stops}}


def _session_ms(runtime: Any, k: int, workdir: Path, shared: Trouper | None = None) -> float:
    """ms from ``start_session`` to FINISHED of a K-step session, on a fresh ``Trouper``
    (each runtime's session then pays the LLM broker's first call alike) or ``shared``."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(FakeLLMServer(echo_script(k)))
        t = shared or stack.enter_context(
            Trouper(home=workdir / f"session-{runtime.kind}", admin_port=free_port()))
        began = time.perf_counter()
        session = t.start_session("bench", llm=llm_config(server), runtime=runtime,
                                  workspace=workdir / f"session-ws-{runtime.kind}",
                                  max_iterations=k + 5)
        if session.wait(timeout=300) != AgentState.FINISHED:
            raise RuntimeError(f"the {runtime.kind} session did not finish")
        return (time.perf_counter() - began) * 1000


def run(samples: int, steps: int, k: int, workdir: Path,
        one_trouper: bool = False) -> dict[str, Any]:
    """``one_trouper`` (a smoke run, its figures not read): both sessions on one
    ``Trouper``, one actor system less to open and close."""
    problem = engine_problem()
    if problem is not None:
        print(f"  docker: skipped: {problem}", flush=True)
        return {"skipped": problem}
    figures: dict[str, Any] = {"image": IMAGE, "samples": samples, "steps": steps, "k": k}
    with contextlib.ExitStack() as stack:
        shared = stack.enter_context(
            Trouper(home=workdir / "session-shared", admin_port=free_port())
        ) if one_trouper else None
        for runtime in (LocalRuntime(), DockerRuntime(image=IMAGE)):
            print(f"  docker workload: {runtime.kind} sandbox", flush=True)
            by = _sandbox_figures(runtime, samples, steps, workdir)
            print(f"  docker workload: {runtime.kind} session of {k} steps", flush=True)
            by["session_ms"] = _session_ms(runtime, k, workdir, shared)
            figures[runtime.kind] = by
    return figures


def lines(r: dict[str, Any], fmt: Any, table: Any) -> list[str]:
    """The report's section (``fmt`` and ``table`` are report.py's)."""
    if "skipped" in r:
        return [f"Docker runtime: skipped: {r['skipped']}"]
    local, docker = r["local"], r["docker"]
    rows = [
        ["sandbox start()", fmt(local["start_ms"]), fmt(docker["start_ms"])],
        ["sandbox stop()", fmt(local["stop_ms"]), fmt(docker["stop_ms"])],
        ["one run step (execute)", fmt(local["step_ms"], 2), fmt(docker["step_ms"], 2)],
        ["  p90", fmt(local["step_p90_ms"], 2), fmt(docker["step_p90_ms"], 2)],
        [f"session of {r['k']} steps, start to FINISHED", fmt(local["session_ms"]),
         fmt(docker["session_ms"])],
    ]
    return [f"Docker runtime vs local ({r['image']}; median ms)"] + table(
        ["", "local", "docker"], rows)
