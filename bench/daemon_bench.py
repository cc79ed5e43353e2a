"""The daemon: how fast events reach a streaming client, and how long a killed daemon's
session takes to move again.

    .venv/bin/python bench/daemon_bench.py [--quick] [--out FILE]

Figures (a real daemon process on 127.0.0.1, real clients):

- ``replay_sse_events_per_s`` / ``replay_ws_events_per_s``: a client reading a stored
  session of ``EVENTS`` events from seq 0 to its end, over SSE (httpx) and over the
  WebSocket (websockets); the best of ``ROUNDS``.
- ``live_latency_ms`` (p50, p95, max): from an append to the store (a writer in this
  process, ``LIVE`` events, one every 10 ms) to its arrival at an SSE client.
- ``kill_to_*_ms``: a scripted session runs (a step every ~0.2 s); the daemon is
  SIGKILLed right after an action is recorded, and started again at once (``daemon
  start``, as a user would). From the kill: ``kill_to_ready_ms`` (the new daemon answers
  ``/v1/health``: it has restored the session), ``kill_to_first_event_ms`` (the
  restored session's first new event in the log) and ``kill_to_next_request_ms`` (its
  next model request: the next step). Median of ``KILLS`` trials; each checks the log.

The replay and live figures are taken on the last trial's restarted daemon once its
session has finished (a daemon start less than a daemon of their own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from common import RESULTS_DIR, machine, median  # noqa: E402

from trouper.client.daemon import parse_sse  # noqa: E402
from trouper.config.models import LLMConfig, SessionConfig  # noqa: E402
from trouper.messages.events import AgentState as State  # noqa: E402
from trouper.messages.events import MessageEvent, StateChanged  # noqa: E402
from trouper.store import open_store  # noqa: E402
from trouper.testing import FakeLLMServer, check_log, load_script, wait_until  # noqa: E402
from trouper.testing.daemon import running_daemon  # noqa: E402


def stored_session(home: Path, n: int) -> str:
    """A finished session of ``n`` message events, written straight to the store."""
    store = open_store(home)  # type: ignore[arg-type]
    try:
        config = SessionConfig(task="bench", llm=LLMConfig(model="m"), workspace=str(home))
        store.create_session("s-bench", config)
        for start in range(0, n - 1, 1000):
            batch = [MessageEvent(source="agent", text=f"event {i} " + "x" * 120)
                     for i in range(start, min(start + 1000, n - 1))]
            store.append("s-bench", batch)
        store.append("s-bench", [StateChanged(state=State.FINISHED, reason="bench")])
    finally:
        store.close()
    return "s-bench"


def replay_sse(daemon: Any, sid: str) -> tuple[int, float]:
    http = daemon.http()
    count, started = 0, time.perf_counter()
    with http.stream("GET", f"/v1/sessions/{sid}/events/stream",
                     params={"until_settled": True}) as answer:
        for kind, _ in parse_sse(answer.iter_lines()):
            if kind == "end":
                break
            count += kind == "message"
    return count, time.perf_counter() - started


def replay_ws(daemon: Any, sid: str) -> tuple[int, float]:
    from websockets.asyncio.client import connect

    async def read() -> tuple[int, float]:
        count, started = 0, time.perf_counter()
        url = daemon.url.replace("http", "ws") + f"/v1/sessions/{sid}/events/ws?until_settled=1"
        async with connect(url, additional_headers={"Authorization": f"Bearer {daemon.token}"},
                           max_size=None) as ws:
            async for raw in ws:
                if json.loads(raw)["type"] == "end":
                    break
                count += 1
        return count, time.perf_counter() - started

    return asyncio.run(read())


def live_latency(daemon: Any, n: int) -> list[float]:
    """ms from each append to its arrival at an SSE client."""
    store = open_store(daemon.home)
    config = SessionConfig(task="live", llm=LLMConfig(model="m"), workspace=str(daemon.home.root))
    store.create_session("s-live", config)
    appended: dict[int, float] = {}
    arrived: dict[int, float] = {}
    ready = threading.Event()

    def client() -> None:
        http = daemon.http()
        with http.stream("GET", "/v1/sessions/s-live/events/stream") as answer:
            ready.set()
            for kind, data in parse_sse(answer.iter_lines()):
                if kind == "message":
                    arrived[data["seq"]] = time.perf_counter()
                    if data["seq"] >= n:
                        return

    reader = threading.Thread(target=client, daemon=True)
    reader.start()
    ready.wait(10)
    try:
        for _ in range(n):
            [event] = store.append("s-live", [MessageEvent(source="agent", text="tick")])
            appended[event.seq] = time.perf_counter()
            time.sleep(0.01)  # the load's pace, not a wait for a condition
        reader.join(30)
    finally:
        store.close()
    return [(arrived[s] - appended[s]) * 1000 for s in sorted(arrived) if s in appended]


def kill_trial(root: Path, then: Callable[[Any], None] | None = None) -> dict[str, float]:
    """12 steps of ~0.2 s; the kill comes after the fourth action (the 8 left are the
    margin for a kill that comes late on a loaded machine). ``then`` gets the restarted
    daemon once the trial is over (the stream figures: one daemon less)."""
    steps = [{"tool": "run", "args": {"command": f"echo {i} >> out.txt"}, "delay_s": 0.2}
             for i in range(12)] + [{"tool": "finish", "args": {"message": "done"}}]
    server = FakeLLMServer(load_script(steps)).start()
    try:
        llm = {"model": "hosted_vllm/fake", "base_url": server.url, "api_key": "bench-key"}
        with running_daemon(root / "home") as daemon:
            session = daemon.client().start_session("count", llm=llm, max_iterations=100)
            wait_until(lambda: session.info().actions >= 4, 60, "four actions")
            killed = time.time()
            daemon.kill()  # returns once the daemon and its actors are gone
            store = open_store(daemon.home)
            last_seq = store.last_seq(session.id)  # what the dead daemon's session did
            store.close()
            requests_before = len(server.requests)
            daemon.start()
            ready = time.time()
            store = open_store(daemon.home)
            try:
                first = wait_until(lambda: store.read(session.id, since=last_seq, limit=1), 60,
                                   "a new event")[0]
                wait_until(lambda: len(server.requests) > requests_before, 60, "a request")
                assert daemon.client().session(session.id).wait(60) == State.FINISHED
                assert check_log(store.read(session.id)) == []
            finally:
                store.close()
            next_request = min(r.time_s for r in server.requests[requests_before:])
            if then is not None:
                then(daemon)
            return {"kill_to_ready_ms": (ready - killed) * 1000,
                    "kill_to_first_event_ms": (first.ts.timestamp() - killed) * 1000,
                    "kill_to_next_request_ms": (next_request - killed) * 1000}
    finally:
        server.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run(quick: bool = False) -> dict[str, Any]:
    """Every figure of the module doc, as a dict (``bench/run.py``'s ``daemon`` workload)."""
    events, rounds, live, kills = (500, 1, 20, 1) if quick else (20000, 3, 300, 3)
    figures: dict[str, Any] = {"events": events}

    def stream(daemon: Any) -> None:
        """The replay and live figures, on the last trial's daemon (its session finished)."""
        sid = stored_session(daemon.home, events)
        sse = [replay_sse(daemon, sid) for _ in range(rounds)]
        ws = [replay_ws(daemon, sid) for _ in range(rounds)]
        assert all(count == events for count, _ in sse + ws), (sse, ws)
        figures["replay_sse_events_per_s"] = max(c / s for c, s in sse)
        figures["replay_ws_events_per_s"] = max(c / s for c, s in ws)
        latencies = live_latency(daemon, live)
        figures["live_latency_ms"] = {"p50": percentile(latencies, 0.5),
                                      "p95": percentile(latencies, 0.95),
                                      "max": max(latencies), "n": len(latencies)}

    with tempfile.TemporaryDirectory(prefix="trouper-bench-daemon-") as tmp:
        root = Path(tmp)
        trials = [kill_trial(root / f"kill-{i}", stream if i == kills - 1 else None)
                  for i in range(kills)]
        for key in trials[0]:
            figures[key] = median([t[key] for t in trials])
        figures["kill_trials"] = trials
    return figures


def lines(figures: dict[str, Any]) -> list[str]:
    """The workload's section of the report."""
    live = figures["live_latency_ms"]
    out = ["Daemon: events to a streaming client, and a SIGKILLed daemon's session moving again",
           f"  replay of {figures['events']:,} events: SSE "
           f"{figures['replay_sse_events_per_s']:,.0f}/s, WebSocket "
           f"{figures['replay_ws_events_per_s']:,.0f}/s",
           f"  append -> SSE client, live: p50 {live['p50']:.1f} ms, p95 {live['p95']:.1f} ms"]
    for key in ("kill_to_ready_ms", "kill_to_first_event_ms", "kill_to_next_request_ms"):
        if key in figures:
            out.append(f"  {key.replace('_', ' ')}: {figures[key]:,.0f} (median)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "daemon-latest.json")
    args = parser.parse_args(argv)
    figures = {"machine": machine(), **run(args.quick)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print("\n".join(lines(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
