"""Benchmark the SQLite event store (a plain script, not a test).

    .venv/bin/python bench/bench_store.py [--dir DIR] [--seconds 1]

Prints durable appends per second, one event per transaction and batches of 10, with
``synchronous`` NORMAL and FULL side by side; then the time to read back a session of
10,000 events and parse them into typed events. Put ``--dir`` on the disk you care about:
the figures are mostly the cost of the filesystem's sync.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from trouper.config.models import LLMConfig, SessionConfig
from trouper.messages.actions import RunCommand
from trouper.messages.events import ActionEvent, MessageEvent, ObservationEvent
from trouper.messages.outcomes import Outcome
from trouper.store import SQLiteEventStore

CONFIG = SessionConfig(task="bench", llm=LLMConfig(model="m"), workspace="/tmp/ws")


def sample_events(n: int) -> list:
    """A realistic mix: action, observation (with ~1 KB of output), message."""
    events = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            events.append(
                ActionEvent(
                    action_id=f"a{i}",
                    turn_id=f"t{i}",
                    tool_call_id=f"c{i}",
                    tool="run",
                    arguments='{"command": "pytest -q"}',
                    action=RunCommand(command="pytest -q"),
                )
            )
        elif kind == 1:
            outcome = Outcome(status="ok", content="." * 1000, exit_code=0)
            events.append(ObservationEvent(action_id=f"a{i - 1}", outcome=outcome))
        else:
            events.append(MessageEvent(source="agent", text="thinking about it " * 5))
    return events


def appends_per_s(folder: Path, synchronous: str, batch: int, seconds: float) -> float:
    """Events appended per second, ``batch`` events per transaction, for ``seconds``."""
    store = SQLiteEventStore(folder / f"{synchronous}-{batch}.db", synchronous=synchronous)
    store.create_session("s", CONFIG)
    events = sample_events(batch)
    count, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        store.append("s", events)
        count += batch
    assert store.last_seq("s") == count
    store.close()
    return count / elapsed


def read_back(folder: Path, n: int) -> tuple[float, list[float], int]:
    """Seconds to read ``n`` events (rows only; then parsed, three times); database bytes."""
    path = folder / "read.db"
    store = SQLiteEventStore(path)
    store.create_session("s", CONFIG)
    for start in range(0, n, 500):
        store.append("s", sample_events(min(500, n - start)))
    store.close()
    raw = sqlite3.connect(path)
    started = time.perf_counter()
    rows = raw.execute("SELECT body_json FROM events WHERE session_id = 's' ORDER BY seq")
    assert len(rows.fetchall()) == n
    rows_s = time.perf_counter() - started
    raw.close()
    store = SQLiteEventStore(path)  # a fresh store, as a restore would open it
    parsed_s = []
    for _ in range(3):  # the first is cold (page cache, pydantic's first calls)
        started = time.perf_counter()
        events = store.read("s")
        parsed_s.append(time.perf_counter() - started)
        assert len(events) == n and events[-1].seq == n
    store.close()
    return rows_s, parsed_s, path.stat().st_size


def print_appends(folder: Path, seconds: float, rounds: int = 3) -> None:
    """NORMAL and FULL side by side; the median of ``rounds`` alternating runs of each."""
    print(f"\ndurable appends (WAL mode; median of {rounds} alternating runs of {seconds:g} s)")
    print(f"{'':>26} {'synchronous=NORMAL':>24} {'synchronous=FULL':>24}")
    for batch in (1, 10):
        runs: dict[str, list[float]] = {"normal": [], "full": []}
        for r in range(rounds):
            for sync in runs:
                runs[sync].append(appends_per_s(folder / f"{r}", sync, batch, seconds))
        rates = [statistics.median(v) for v in runs.values()]
        label = "1 event / transaction" if batch == 1 else f"{batch} events / transaction"
        cells = [f"{r:>9,.0f} ev/s {r / batch:>6,.0f} tx/s" for r in rates]
        print(f"{label:>26} {cells[0]:>24} {cells[1]:>24}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to put the databases")
    parser.add_argument("--seconds", type=float, default=1.0, help="time per append run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench_store_") as tmp:
        folder = Path(tmp)
        print(
            f"python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
            f"{os.cpu_count()} CPUs, databases in {folder}"
        )
        print_appends(folder, args.seconds)
        n = 10_000
        rows_s, parsed_s, size = read_back(folder, n)
        print(f"\nread back one session of {n:,} events ({size / 1e6:.1f} MB database)")
        print(f"  rows only (raw sqlite3):               {rows_s * 1000:7.1f} ms")
        for label, secs in zip(("1st", "2nd", "3rd"), parsed_s, strict=True):
            print(
                f"  store.read() -> typed events, {label} call: {secs * 1000:7.1f} ms"
                f"  ({secs / n * 1e6:.1f} us/event)"
            )


if __name__ == "__main__":
    main()
