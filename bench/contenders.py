"""The three contenders of the step-overhead workload, each running one K-step session.

Every run gets its own ``FakeLLMServer`` (in this process) and its own workspace, and
returns the arrival times of its model requests: the step times come from those, the
same way for all three. A run is ``ok`` only when ``out.txt`` holds 0..K-1 once each.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    BENCH_DIR,
    MODEL,
    chat_requests,
    echo_script,
    expected_lines,
    read_lines,
    spawn,
)
from procs import (
    cpu_delta,
    machine_cpu_s,
    others_load,
    role_cpu_s,
    roles,
    session_processes,
    trouper_tree,
)

from trouper import AgentState, Trouper
from trouper.agent.prompt import PromptBuilder
from trouper.agent.tools import tool_specs
from trouper.messages.events import ActionEvent, LLMCompleted, ObservationEvent
from trouper.testing import FakeLLMServer, check_log

TASK = "bench: append the numbers to out.txt"


@dataclass
class Run:
    """One contender's K-step session."""

    contender: str
    k: int
    request_times_s: list[float] = field(default_factory=list)
    ok: bool = False
    note: str = ""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds used per process role over the measured steps."""
    cpu_steps: int = 0
    """How many steps ``cpu_s`` covers."""
    extra: dict[str, Any] = field(default_factory=dict)


def llm_config(server: FakeLLMServer) -> dict[str, str]:
    return {"model": MODEL, "base_url": server.url, "api_key": "x"}


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.002) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _check_out(run: Run, workspace: Path) -> None:
    lines = read_lines(workspace / "out.txt")
    if lines != expected_lines(run.k):
        run.ok = False
        run.note += f" out.txt has {len(lines)} lines, wanted 0..{run.k - 1}"


def _worker(python: Path | str, script: str, cfg: dict[str, Any], timeout_s: float) -> dict:
    proc = spawn("run")(
        [str(python), str(BENCH_DIR / script), json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = proc.stderr.strip().splitlines()[-5:]
        raise RuntimeError(f"{script} exited {proc.returncode}: {' | '.join(tail)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_bare(k: int, workdir: Path, latency_s: float = 0.0, route: str = "litellm") -> Run:
    """The bare loop, in a process of its own (this interpreter, litellm, one bash); with
    ``route="direct"``, its model calls by trouper's direct route."""
    run = Run("bare" if route == "litellm" else f"bare-{route}", k)
    workspace = workdir / f"bare-{k}-{time.monotonic_ns()}"
    workspace.mkdir(parents=True)
    with FakeLLMServer(echo_script(k), latency_s=latency_s) as server:
        cfg = {
            "url": server.url,
            "model": MODEL,
            "workspace": str(workspace),
            "steps": k,
            "system": PromptBuilder().messages()[0]["content"],
            "tools": tool_specs(),
            "route": route,
        }
        try:
            result = _worker(sys.executable, "bare_worker.py", cfg, 60 + k * 2.0)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            run.note = str(exc)
            return run
        run.request_times_s = [r.time_s for r in chat_requests(server)]
    run.ok = True
    run.cpu_s, run.cpu_steps = {"bare loop + bash": result["cpu_s"]}, max(1, k - 1)
    _check_out(run, workspace)
    return run


def run_openhands(
    python: Path, k: int, workdir: Path, latency_s: float = 0.0, terminal: str | None = None
) -> Run:
    """The OpenHands SDK in its own venv: terminal tool, persistence on, no visualizer.

    ``terminal`` forces the terminal tool's backend ("tmux" or "subprocess"); None lets
    the SDK choose, as a user gets it (tmux when it is installed).
    """
    run = Run("openhands" + (f"-{terminal}" if terminal else ""), k)
    workspace = workdir / f"openhands-{k}-{time.monotonic_ns()}"
    workspace.mkdir(parents=True)
    persistence = workdir / f"openhands-conversations-{time.monotonic_ns()}"
    script = echo_script(k, tool="terminal", finish="finish")
    with FakeLLMServer(script, latency_s=latency_s) as server:
        cfg = {
            "url": server.url,
            "model": MODEL,
            "workspace": str(workspace),
            "persistence_dir": str(persistence),
            "steps": k,
            "terminal": terminal,
        }
        try:
            result = _worker(python, "openhands_worker.py", cfg, 120 + k * 3.0)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            run.note = str(exc)
            return run
        requests = chat_requests(server)
    run.request_times_s = [r.time_s for r in requests]
    run.ok = "FINISHED" in result["status"]
    run.note = "" if run.ok else f"status {result['status']}"
    run.cpu_s, run.cpu_steps = {"openhands process": result["cpu_s"]}, max(1, k - 1)
    run.extra = {
        "start_to_first_request_ms": (requests[0].time_s - result["started_s"]) * 1000
        if requests
        else None,
        "python": result["python"],
        "versions": result["versions"],
        "terminal": result["terminal"],
    }
    _check_out(run, workspace)
    return run


def run_trouper(t: Trouper, admin_port: int, k: int, workdir: Path, latency_s: float = 0.0) -> Run:
    """One trouper session (local runtime, multiprocTCPBase, durable log) in ``t``.

    CPU is counted by role over every process that serves the session: its own (the
    SessionSupervisor and all below it, its sandbox server and shell) and the shared ones
    (Thespian admin and logger, root, LLM broker), from its second model request to its
    last (K - 1 steps); earlier sessions of ``t``, idle by then, are left out.
    """
    run = Run("trouper", k)
    workspace = workdir / f"trouper-{k}-{time.monotonic_ns()}"
    home = t.home.root
    with FakeLLMServer(echo_script(k), latency_s=latency_s) as server:
        session = t.start_session(
            TASK, llm=llm_config(server), workspace=workspace, max_iterations=k + 5
        )
        started = wait_until(lambda: len(chat_requests(server)) >= 2, 60.0)
        pids = session_processes(trouper_tree(admin_port, home), home, session.id)
        if pids is None:
            pids = roles(trouper_tree(admin_port, home))
            run.note += " the session's processes were not found: CPU is the whole tree's"
        before = role_cpu_s(pids) if started else {}
        bench_before, machine_before, began = time.process_time(), machine_cpu_s(), time.time()
        wait_until(lambda: len(chat_requests(server)) >= k + 1, 60 + k * 2.0, poll_s=0.01)
        machine_after, ended = machine_cpu_s(), time.time()
        if started:
            pids.update(session_processes(trouper_tree(admin_port, home), home, session.id)
                        or {})  # any process started since (a restarted actor)
            run.cpu_s = {r: s for r, s in cpu_delta(before, role_cpu_s(pids)).items() if s}
        run.cpu_s["bench process (LLM server, wait)"] = time.process_time() - bench_before
        load = others_load(machine_before, machine_after, sum(run.cpu_s.values()),
                           ended - began)
        state = session.wait(timeout=60 + k * 2.0)
        run.request_times_s = [r.time_s for r in chat_requests(server)]
        run.cpu_steps = max(1, k - 1)
    events = list(session.events())
    problems = check_log(events)
    run.ok = state == AgentState.FINISHED and not problems
    run.note += "" if run.ok else f" state {state.value}; {problems[:3]}"
    run.extra = {"session_id": session.id, "segments": segments(run.request_times_s, events),
                 **load}
    _check_out(run, workspace)
    return run


SEGMENTS = {
    "request -> completion recorded": "the model's answer, litellm, broker -> controller",
    "action recorded -> outcome recorded": "controller -> proxy -> sandbox -> bash and back",
    "outcome recorded -> next request": "log, prompt, controller -> broker, litellm, HTTP",
}


def segments(request_times_s: list[float], events: list[Any]) -> dict[str, list[float]]:
    """Each step cut in three at the Controller's event timestamps, in ms (steps 1..K-1).

    An event's ``ts`` is taken when the Controller makes it, before it is appended.
    """
    completed = [e.ts.timestamp() for e in events if isinstance(e, LLMCompleted)]
    actions = [e.ts.timestamp() for e in events if isinstance(e, ActionEvent)]
    outcomes = [e.ts.timestamp() for e in events if isinstance(e, ObservationEvent)]
    steps = range(1, min(len(actions), len(outcomes), len(request_times_s) - 1))
    a, b, c = SEGMENTS
    return {
        a: [(completed[i] - request_times_s[i]) * 1000 for i in steps],
        b: [(outcomes[i] - actions[i]) * 1000 for i in steps],
        c: [(request_times_s[i + 1] - outcomes[i]) * 1000 for i in steps],
    }


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def session_roles(admin_port: int, home: Path, session_id: str) -> dict[str, int]:
    """Pid of each process serving one session: its SessionSupervisor, Controller and
    RuntimeProxy (from the pid files they publish), its sandbox server and shell, and the
    shared ones (root supervisor, LLM broker, Thespian admin)."""
    from procs import children_map, listening_pid, parent, sandbox_server_of, session_actor

    server = sandbox_server_of(home, session_id)
    if server is None:
        return {}
    children = children_map()
    supervisor = session_actor(home, session_id, "session")
    root = parent(supervisor) if supervisor else None
    roles = {
        "sandbox server": server,
        "runtime proxy": session_actor(home, session_id, "runtime"),
        "controller": session_actor(home, session_id, "controller"),
        "session supervisor": supervisor,
        "root supervisor": root,
    }
    shells = children.get(server, [])
    brokers = [c for c in children.get(root, []) if _comm(c) == "trouper-llm"]
    for role, found in (("bash", shells), ("llm broker", brokers)):
        if found:
            roles[role] = found[0]
    roles["thespian admin"] = listening_pid(admin_port)
    return {role: pid for role, pid in roles.items() if pid}
