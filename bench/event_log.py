"""Workload 5: the event log. Durable appends per second, restoring a long session, and
the latency of appends, reads and a live follow on SQLite and PostgreSQL side by side
(``store_latency.py``).

The store figures come from ``bench_store.py`` (the same functions, shorter runs). The
restore is end to end: a session whose log holds ``n`` events (actions, observations
with 1 KB of output, messages) is restored into a running ``Trouper`` with
``Trouper.restore``, and timed until its first model request reaches the server: the
Controller reads and folds the whole log, rebuilds the prompt, and asks the model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import store_latency
from bench_store import appends_per_s, read_back, sample_events
from common import chat_requests, median
from contenders import TASK, wait_until

from trouper import Trouper
from trouper.client.actor_system import free_port
from trouper.client.embedded import new_session_id
from trouper.config.models import LLMConfig, SessionConfig
from trouper.messages.events import AgentState, MessageEvent, StateChanged
from trouper.testing import FakeLLMServer

BATCH = 500


def store_figures(folder: Path, seconds: float, n: int) -> dict[str, Any]:
    appends = {
        f"{sync}_batch{batch}_events_per_s": appends_per_s(folder / "appends", sync, batch, seconds)
        for sync in ("normal", "full")
        for batch in (1, 10)
    }
    rows_s, parsed_s, size = read_back(folder, n)
    return {
        **appends,
        "read_events": n,
        "read_rows_ms": rows_s * 1000,
        "read_parsed_ms": [s * 1000 for s in parsed_s],
        "db_mb": size / 1e6,
    }


def _seed(t: Trouper, server: FakeLLMServer, workspace: Path, n: int) -> str:
    """A RUNNING session with ``n`` events in the log and no live actors."""
    session_id = new_session_id()
    llm = LLMConfig(model="hosted_vllm/fake", base_url=server.url, api_key="x")
    # a synthetic log repeats one step: stuck detection would pause it at once
    t.store.create_session(session_id, SessionConfig(task=TASK, llm=llm, workspace=str(workspace),
                                                     stuck=False))
    t.store.append(
        session_id,
        [
            MessageEvent(source="user", text=TASK),
            StateChanged(state=AgentState.RUNNING, reason="bench"),
        ],
    )
    # sample_events repeats action, observation, message: take whole triples so that no
    # action is left without its outcome (a restore would run it), then user messages.
    whole = n - n % 3
    events = sample_events(whole) + [
        MessageEvent(source="user", text="carry on") for _ in range(n - whole)
    ]
    for start in range(0, n, BATCH):
        t.store.append(session_id, events[start : start + BATCH])
    return session_id


def restore_ms(n: int, samples: int, workdir: Path) -> dict[str, Any]:
    """Median ms from ``Trouper.restore`` to the first model request, for an n-event log.

    One short session runs first, so the LLM broker's first (slow) call is not counted.
    """
    times = []
    with (
        FakeLLMServer([{"say": "restored"}]) as server,
        Trouper(home=workdir / "restore-home", admin_port=free_port(), resume=False) as t,
    ):
        warm = t.start_session(
            TASK,
            llm={"model": "hosted_vllm/fake", "base_url": server.url, "api_key": "x"},
            workspace=workdir / "restore-warm",
        )
        warm.wait(timeout=60.0)  # the broker's first model call is slow: keep it out
        for i in range(samples):
            workspace = workdir / f"restore-{i}"
            workspace.mkdir(parents=True)
            session_id = _seed(t, server, workspace, n)
            server.reset()
            began = time.time()
            t.restore(session_id)
            if not wait_until(lambda: bool(chat_requests(server)), 120.0, poll_s=0.005):
                raise TimeoutError(f"no model request within 120 s of restoring {n} events")
            times.append((chat_requests(server)[0].time_s - began) * 1000)
            t.session(session_id).wait(timeout=60.0)
    return {"events": n, "samples": samples, "median_ms": median(times), "raw_ms": times}


def run(seconds: float, n: int, restore_samples: int, workdir: Path, quick: bool = False,
        postgres_url: str | None = None) -> dict[str, Any]:
    print(
        f"  event log: appends ({seconds:g} s per run), read and restore {n:,} events", flush=True
    )
    folder = workdir / "event-log"
    (folder / "appends").mkdir(parents=True, exist_ok=True)
    result = store_figures(folder, seconds, n)
    result["restore"] = restore_ms(n, restore_samples, workdir)
    print("  event log: latency on each store backend", flush=True)
    result["backends"] = store_latency.run(workdir, quick, postgres_url)
    return result
