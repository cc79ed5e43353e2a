"""Workload: the remote runtime against a ``trouper runtime-server`` on loopback, beside
the local runtime on the same ``Trouper``.

- start: ``start_session()`` to the first model request (the sandbox must be up first: for
  remote, a health check, the start request and the shell on the server);
- step: K-step echo sessions, the median step (request to request at the model server)
  and the "action recorded -> outcome recorded" segment (controller -> proxy -> sandbox
  and back), local and remote taking turns;
- action: one ``execute`` of ``true`` straight on a started sandbox object, no actors:
  the round trip the remote backend adds (HTTP + FastAPI + the journal) against the local
  one (stdlib HTTP + the same journal).

Loopback hides the network: on a real link add one round trip per action (two when the
command outlives the first long-poll).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import chat_requests, echo_script, median, percentile, spawn
from contenders import TASK, llm_config, segments, wait_until

from trouper import AgentState, Trouper
from trouper.client.actor_system import free_port
from trouper.testing import FakeLLMServer

SEGMENT = "action recorded -> outcome recorded"


class LoopbackServer:
    """A ``trouper runtime-server`` subprocess on 127.0.0.1 (any free port)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_urlsafe(32)
        self.token_file = root / "token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        self.workdir = root / "workdir"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def __enter__(self) -> LoopbackServer:
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - the child holds it
        self.proc = spawn("popen")(
            [sys.executable, "-m", "trouper", "runtime-server", "--port", "0", "--workdir",
             str(self.workdir), "--token-file", str(self.token_file), "--log-level", "warning"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        info = self.workdir / "server.json"
        if not wait_until(lambda: info.exists() or self.proc.poll() is not None, 30.0) or (
                self.proc.poll() is not None):
            raise RuntimeError("the runtime server did not start: "
                               + (self.root / "server.log").read_text()[-1000:])
        self.url = json.loads(info.read_text())["url"]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def runtime(self) -> dict[str, Any]:
        return {"kind": "remote", "url": self.url, "token": self.token}


def _start_ms(t: Trouper, server: FakeLLMServer, runtime: Any, workspace: Path) -> float:
    server.reset()
    began = time.time()
    session = t.start_session(TASK, llm=llm_config(server), runtime=runtime,
                              workspace=workspace, max_iterations=5)
    if not wait_until(lambda: bool(chat_requests(server)), 60.0):
        raise TimeoutError("no model request within 60 s of start_session()")
    first = chat_requests(server)[0].time_s
    session.wait(timeout=60.0)
    return (first - began) * 1000


def _steps(t: Trouper, runtime: Any, k: int, workspace: Path) -> tuple[list[float], list[float]]:
    """(step ms, action->outcome ms) of one K-step session."""
    with FakeLLMServer(echo_script(k)) as server:
        session = t.start_session(TASK, llm=llm_config(server), runtime=runtime,
                                  workspace=workspace, max_iterations=k + 5)
        state = session.wait(timeout=60 + k * 2.0)
        if state != AgentState.FINISHED:
            raise RuntimeError(f"a {k}-step session ended {state.value}: "
                               f"{session.record.state_reason}")
        times = [r.time_s for r in chat_requests(server)]
    steps = [(b - a) * 1000 for a, b in zip(times, times[1:], strict=False)][:k]
    return steps, segments(times, list(session.events()))[SEGMENT]


def _actions_ms(sandbox: Any, n: int) -> list[float]:
    from trouper.messages.actions import RunCommand

    sandbox.start()
    took = []
    try:
        for i in range(n):
            began = time.perf_counter()
            sandbox.runtime.execute(f"bench-{i}", RunCommand(command="true"), timeout_s=30,
                                    no_output_timeout_s=10)
            took.append((time.perf_counter() - began) * 1000)
    finally:
        sandbox.stop()
    return took


def run(k: int, rounds: int, warm: int, actions: int, workdir: Path) -> dict[str, Any]:
    from trouper.config.models import RemoteRuntime
    from trouper.runtimes.local import LocalSandbox
    from trouper.runtimes.remote import RemoteSandbox

    figures: dict[str, dict[str, list[float]]] = {
        name: {"start": [], "step": [], "segment": [], "action": []}
        for name in ("local", "remote")}
    with LoopbackServer(workdir / "remote-server") as remote, \
            Trouper(home=workdir / "remote-home", admin_port=free_port()) as t, \
            FakeLLMServer(echo_script(1)) as llm:
        runtimes = {"local": "local", "remote": remote.runtime()}
        for r in range(rounds):
            for name in (("local", "remote") if r % 2 == 0 else ("remote", "local")):
                print(f"  remote runtime: round {r + 1}/{rounds} {name}", flush=True)
                for j in range(warm):
                    figures[name]["start"].append(
                        _start_ms(t, llm, runtimes[name], workdir / f"rs-{name}-{r}-{j}"))
                steps, segment = _steps(t, runtimes[name], k, workdir / f"rk-{name}-{r}")
                figures[name]["step"] += steps
                figures[name]["segment"] += segment
        config = RemoteRuntime(url=remote.url, token=remote.token)
        figures["remote"]["action"] = _actions_ms(
            RemoteSandbox("bench-actions", config=config), actions)
        figures["local"]["action"] = _actions_ms(
            LocalSandbox("bench-actions", workdir / "ra-ws", workdir / "ra-state"), actions)
    return {
        "k": k, "rounds": rounds, "warm": warm, "actions": actions,
        "by_runtime": {name: {
            "start_to_first_request_ms": median(f["start"]),
            "step_median_ms": median(f["step"]),
            "step_p90_ms": percentile(f["step"], 90),
            "action_to_outcome_median_ms": median(f["segment"]),
            "execute_true_median_ms": median(f["action"]),
            "execute_true_p90_ms": percentile(f["action"], 90),
        } for name, f in figures.items()},
    }


def lines(r: dict[str, Any]) -> list[str]:
    """The report's section."""
    from report import _table, fmt

    rows = []
    labels = [("start_to_first_request_ms", "start_session() -> first model request"),
              ("step_median_ms", f"step (K={r['k']}), median"),
              ("step_p90_ms", "  p90"),
              ("action_to_outcome_median_ms", "action recorded -> outcome recorded"),
              ("execute_true_median_ms", "execute('true') on a sandbox object, median"),
              ("execute_true_p90_ms", "  p90")]
    local, remote = r["by_runtime"]["local"], r["by_runtime"]["remote"]
    for key, label in labels:
        rows.append([label, fmt(local[key], 2), fmt(remote[key], 2)])
    return ["Remote runtime on loopback vs local (ms)"] + _table(["", "local", "remote"], rows)
