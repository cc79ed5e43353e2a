"""Workload 4: recovery. SIGKILL one actor of a session mid-command; time the way back.

Each trial runs a session of ``STEPS`` steps of ``sleep 0.3; echo i >> out.txt`` and
kills the actor 0.25 s after step 1's action was recorded, while its command runs (about
50 ms of it is left, in the sandbox, which outlives the proxy). Measured from the kill:

- ``command_left_ms``: how much of the command was still to run (roughly: it starts a
  few ms after its action is recorded), a floor under the outcome;
- ``runtime_back_ms``: the ``RuntimeEvent`` (started or attached) of the new RuntimeProxy;
- ``running_ms``: the ``StateChanged(RUNNING)`` that ends the recovery (RuntimeProxy kills
  only; a Controller kill changes no state);
- ``first_event_ms``: the first event recorded after the kill;
- ``outcome_ms``: the in-flight action's ``ObservationEvent`` (resolved from the
  sandbox's journal: never run twice);
- ``next_request_ms``: the session's next model request: it is moving on.

Each trial checks the promises: ``out.txt`` holds every line exactly once and
``check_log`` finds nothing. The kill goes through ``trouper.testing.kill_actor(session,
role)`` when trouper has it; otherwise the pid comes from ``/proc`` (see ``procs``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from common import chat_requests, expected_lines, median, read_lines
from contenders import TASK, llm_config, wait_until
from procs import session_actor

import trouper.testing
from trouper import AgentState, Trouper
from trouper.client.actor_system import free_port
from trouper.messages.events import ActionEvent, ObservationEvent, RuntimeEvent, StateChanged
from trouper.testing import FakeLLMServer, check_log

STEPS = 4
KILL_STEP = 1
COMMAND_S = 0.3
KILL_AFTER_S = 0.25
ROLES = ("runtime", "controller")


def script() -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"tool": "run", "args": {"command": f"sleep {COMMAND_S}; echo {i} >> out.txt"}}
        for i in range(STEPS)
    ]
    return steps + [{"tool": "finish", "args": {"message": "done"}}]


def role_pid(home: Path, session_id: str, role: str) -> int | None:
    """The pid of a session's live RuntimeProxy or Controller (from its pid file)."""
    return session_actor(home, session_id, "runtime" if role == "runtime" else "controller")


def kill(session: Any, home: Path, role: str) -> tuple[float, str]:
    """SIGKILL the session's actor ``role``; returns the time of the kill and how."""
    kill_actor = getattr(trouper.testing, "kill_actor", None)
    if kill_actor is not None:
        at = time.time()
        kill_actor(session, role)
        return at, "trouper.testing.kill_actor"
    pid = role_pid(home, session.id, role)
    if pid is None:
        raise RuntimeError(f"cannot find the {role} process of {session.id}")
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    return at, f"SIGKILL pid {pid} (found through /proc)"


def trial(t: Trouper, role: str, workdir: Path, index: int) -> dict[str, Any]:
    workspace = workdir / f"recovery-{role}-{index}"
    with FakeLLMServer(script()) as server:
        session = t.start_session(
            TASK, llm=llm_config(server), workspace=workspace, max_iterations=STEPS + 5
        )
        actions: list[ActionEvent] = []

        def kill_step_started() -> bool:
            actions[:] = [e for e in session.events() if isinstance(e, ActionEvent)]
            return len(actions) > KILL_STEP

        if not wait_until(kill_step_started, 30.0, poll_s=0.005):
            raise TimeoutError(f"step {KILL_STEP} never started")
        time.sleep(max(0.0, actions[KILL_STEP].ts.timestamp() + KILL_AFTER_S - time.time()))
        killed_at, how = kill(session, t.home.root, role)
        state = session.wait(timeout=60.0)
        requests = [r.time_s for r in chat_requests(server)]
    events = list(session.events())
    after = [e for e in events if e.ts.timestamp() >= killed_at]
    in_flight = actions[KILL_STEP].action_id

    def ms_to(match: Any) -> float | None:
        found = next((e for e in after if match(e)), None)
        return (found.ts.timestamp() - killed_at) * 1000 if found else None

    outcome = next(
        (e for e in after if isinstance(e, ObservationEvent) and e.action_id == in_flight), None
    )
    problems = check_log(events)
    lines_ok = read_lines(workspace / "out.txt") == expected_lines(STEPS)
    return {
        "role": role,
        "how": how,
        "state": state.value,
        "ok": state == AgentState.FINISHED and lines_ok and not problems,
        "problems": problems[:3] + ([] if lines_ok else ["out.txt is not 0..STEPS-1 once each"]),
        "command_left_ms": (actions[KILL_STEP].ts.timestamp() + COMMAND_S - killed_at) * 1000,
        "runtime_back_ms": ms_to(
            lambda e: isinstance(e, RuntimeEvent) and e.phase in ("started", "attached")
        ),
        "running_ms": ms_to(
            lambda e: isinstance(e, StateChanged) and e.state == AgentState.RUNNING
        ),
        "first_event_ms": ms_to(lambda e: True),
        "outcome_ms": ms_to(lambda e: e is outcome),
        "outcome_status": outcome.outcome.status if outcome else None,
        "next_request_ms": next(((r - killed_at) * 1000 for r in requests if r > killed_at), None),
    }


def run(trials: int, workdir: Path) -> dict[str, Any]:
    results: dict[str, Any] = {
        "trials": trials,
        "command_s": COMMAND_S,
        "kill_after_s": KILL_AFTER_S,
        "by_role": {},
    }
    with Trouper(home=workdir / "recovery-home", admin_port=free_port()) as t:
        for role in ROLES:
            rows = []
            for i in range(trials):
                print(f"  recovery: kill {role}, trial {i + 1}/{trials}", flush=True)
                try:
                    rows.append(trial(t, role, workdir, i))
                except Exception as exc:  # noqa: BLE001 - reported, the other trials go on
                    error = f"{type(exc).__name__}: {exc}"
                    rows.append({"role": role, "ok": False, "error": error})
            results["by_role"][role] = {
                "ok_trials": sum(1 for r in rows if r.get("ok")),
                **{
                    f"median_{key}": median(r[key] for r in rows if r.get(key) is not None)
                    for key in (
                        "command_left_ms",
                        "runtime_back_ms",
                        "running_ms",
                        "first_event_ms",
                        "outcome_ms",
                        "next_request_ms",
                    )
                },
                "trials": rows,
            }
    return results
