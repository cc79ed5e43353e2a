"""The event log's latency on each store backend: SQLite always, PostgreSQL when there is one.

Part of the ``eventlog`` workload (bench/event_log.py). For each backend, in a fresh
database (SQLite: a new file; PostgreSQL: a new database, dropped after), through
``open_store`` with its defaults:

- **append, 1 event**: the latency of ``append`` of a one-event batch (median, p90, p99)
  over ``appends`` appends after ``warm`` unmeasured ones, and the CPU per append: the
  bench process's (the client) and, where the server's processes are on this machine and
  found (PostgreSQL's postmaster and its children), the server's;
- **append, 20 events**: the same for a 20-event batch;
- **read 1,000 events**: ``read`` of a 1,000-event session into typed events (median);
- **follow**: a live ``follow`` in this process, another process appending one event at a
  time at random 5-25 ms intervals: from the moment just before the other process calls
  ``append`` to the follower yielding the event (median, p90), so the append's own
  latency is in it.

PostgreSQL comes from ``--postgres-url``, else ``TROUPER_TEST_POSTGRES_URL``, else a
throwaway cluster ``scripts/postgres start`` makes (when Debian's server binaries are
installed; never in a quick run), stopped and removed after. Without one the backend is
reported ``skipped`` with the reason.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import random
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench_store import CONFIG, sample_events
from common import REPO_DIR, median, percentile
from procs import cpu_s, parent, pids

from trouper.messages.events import MessageEvent
from trouper.store import EventStore, open_store
from trouper.testing.postgres import scratch_database

SCRIPT = REPO_DIR / "scripts" / "postgres"


def counts(quick: bool) -> dict[str, int]:
    """How many of each operation a run measures (quick: a smoke run's handful)."""
    if quick:
        return {"warm": 5, "appends": 30, "batch_appends": 10, "reads": 2, "follows": 5}
    return {"warm": 200, "appends": 2000, "batch_appends": 500, "reads": 20, "follows": 200}


def _stats_ms(seconds: list[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "median_ms": median(ms), "p90_ms": percentile(ms, 90),
            "p99_ms": percentile(ms, 99)}


def _timed_appends(store: EventStore, session_id: str, batch: int, n: int, warm: int,
                   server_cpu: Callable[[], float | None]) -> dict[str, Any]:
    events = sample_events(batch)
    for _ in range(warm):
        store.append(session_id, events)
    times = []
    cpu0, server0 = time.process_time(), server_cpu()
    for _ in range(n):
        began = time.perf_counter()
        store.append(session_id, events)
        times.append(time.perf_counter() - began)
    cpu1, server1 = time.process_time(), server_cpu()
    out = _stats_ms(times)
    out["client_cpu_ms_per_append"] = (cpu1 - cpu0) * 1000 / n
    out["server_cpu_ms_per_append"] = (
        None if server0 is None or server1 is None else (server1 - server0) * 1000 / n)
    return out


def _read_ms(store: EventStore, reads: int) -> dict[str, Any]:
    store.create_session("read", CONFIG)
    for _ in range(2):
        store.append("read", sample_events(500))
    store.read("read")  # the first read warms caches and pydantic
    times = []
    for _ in range(reads):
        began = time.perf_counter()
        events = store.read("read")
        times.append(time.perf_counter() - began)
        assert len(events) == 1000
    return {"events": 1000, **_stats_ms(times)}


def _append_from_another_process(url: str, session_id: str, n: int, go: Any) -> None:
    """The other process: after ``go``, ``n`` one-event appends, each stamped with the
    system-wide monotonic clock just before its ``append`` call."""
    store = open_store(url)
    try:
        go.recv()
        time.sleep(0.2)  # the follower is waiting by then
        for _ in range(n):
            time.sleep(random.uniform(0.005, 0.025))
            store.append(session_id, [MessageEvent(source="user", text=repr(time.monotonic()))])
    finally:
        store.close()
        os._exit(0)  # no teardown of what the fork inherited


def _follow_ms(store: EventStore, url: str, n: int) -> dict[str, Any]:
    store.create_session("follow", CONFIG)
    since = store.last_seq("follow")
    theirs, ours = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(
        target=_append_from_another_process, args=(url, "follow", n, theirs), daemon=True)
    child.start()
    seen: list[float] = []
    try:
        ours.send(True)
        for event in store.follow("follow", since, timeout_s=60.0 + n * 0.1):
            seen.append(time.monotonic() - float(event.text))  # type: ignore[attr-defined]
            if len(seen) == n:
                break
    finally:
        child.join(10.0)
        if child.is_alive():
            child.kill()
            child.join()
    if len(seen) < n:
        raise TimeoutError(f"the follower saw {len(seen)} of {n} appends")
    out = _stats_ms(seen)
    del out["p99_ms"]
    return out


def measure(url: str, quick: bool, server_cpu: Callable[[], float | None]) -> dict[str, Any]:
    """Every figure of one backend, on the store at ``url`` (fresh and empty)."""
    c = counts(quick)
    store = open_store(url)
    try:
        store.create_session("s", CONFIG)
        one = _timed_appends(store, "s", 1, c["appends"], c["warm"], server_cpu)
        twenty = _timed_appends(store, "s", 20, c["batch_appends"], c["warm"] // 5,
                                server_cpu)
        return {"append_1": one, "append_20": twenty, "read_1000": _read_ms(store, c["reads"]),
                "follow": _follow_ms(store, url, c["follows"])}
    finally:
        store.close()


# ---- PostgreSQL: where it comes from, a fresh database, the server's CPU -----------------

def _binaries() -> str | None:
    """Debian's server binaries, as ``scripts/postgres`` looks for them; None without."""
    for bin_dir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if all(os.access(f"{bin_dir}/{b}", os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return bin_dir
    return None


@contextmanager
def postgres_server(url: str | None, quick: bool) -> Iterator[tuple[str | None, str]]:
    """(the server's URL or None, where it comes from or why there is none). A throwaway
    cluster started here is stopped and removed on the way out."""
    url = url or os.environ.get("TROUPER_TEST_POSTGRES_URL") or None
    if url:
        yield url, "given" if url != os.environ.get("TROUPER_TEST_POSTGRES_URL") \
            else "TROUPER_TEST_POSTGRES_URL"
        return
    if quick:
        yield None, "a quick run starts no cluster; give --postgres-url or " \
            "TROUPER_TEST_POSTGRES_URL"
        return
    if _binaries() is None:
        yield None, "no --postgres-url, no TROUPER_TEST_POSTGRES_URL, and no server " \
            "binaries under /usr/lib/postgresql/*/bin for scripts/postgres start"
        return
    started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True,
                             timeout=180, stdin=subprocess.DEVNULL)
    found = re.search(r"TROUPER_TEST_POSTGRES_DIR=(\S+) TROUPER_TEST_POSTGRES_URL=(\S+)",
                      started.stdout)
    if started.returncode != 0 or not found:
        tail = started.stderr.strip().splitlines()[-1:] or ["no message"]
        yield None, f"scripts/postgres start failed: {tail[0]}"
        return
    folder, server = found.group(1), found.group(2)
    try:
        yield server, "throwaway cluster (scripts/postgres: fsync and synchronous_commit off)"
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", folder], capture_output=True,
                       timeout=120, stdin=subprocess.DEVNULL, check=False)


@contextmanager
def fresh_database(server: str) -> Iterator[str]:
    """A new database on ``server`` (a URL with the right to create one), dropped after."""
    yield from scratch_database(server, "trouper_bench")


def postmaster_cpu(url: str) -> Callable[[], float | None]:
    """A reader of the CPU seconds of the server's postmaster and all its children, when
    the server is on this machine and its data directory readable; else of None."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
        pid = int(Path(str(row[0] if row else ""), "postmaster.pid").read_text().split()[0])
    except (psycopg.Error, OSError, ValueError, IndexError):
        return lambda: None
    if urlsplit(url).hostname not in ("127.0.0.1", "::1", "localhost") or \
            not Path(f"/proc/{pid}").exists():
        return lambda: None

    def total() -> float | None:
        tree, found = {pid}, True
        parents = {p: parent(p) for p in pids()}
        while found:
            more = {p for p, pp in parents.items() if pp in tree} - tree
            found = bool(more)
            tree |= more
        return sum(cpu_s(p) for p in tree)

    return total


def run(workdir: Path, quick: bool, postgres_url: str | None) -> dict[str, Any]:
    """Every backend's figures: ``{"sqlite": {...}, "postgresql": {...} or {"skipped":
    why}, "postgres_source": ..., "ratios": {...}}``."""
    folder = workdir / "store-latency"
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"counts": counts(quick)}
    out["sqlite"] = measure(f"sqlite://{(folder / 'latency.db').resolve()}", quick,
                            lambda: None)
    for leftover in folder.glob("latency.db*"):
        leftover.unlink()
    with postgres_server(postgres_url, quick) as (server, source):
        out["postgres_source"] = source
        if server is None:
            out["postgresql"] = {"skipped": f"no PostgreSQL ({source})"}
        else:
            with fresh_database(server) as url:
                out["postgresql"] = measure(url, quick, postmaster_cpu(url))
    pg, lite = out["postgresql"], out["sqlite"]
    out["ratios"] = {} if "skipped" in pg else {
        f"postgresql/sqlite {key}": _ratio(pg[key]["median_ms"], lite[key]["median_ms"])
        for key in ("append_1", "append_20", "read_1000", "follow")}
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def lines(r: dict[str, Any], fmt: Callable[..., str]) -> list[str]:
    """The report's rows: one column per backend."""
    pg = r.get("postgresql", {})
    names = ["sqlite"] + ([] if "skipped" in pg else ["postgresql"])
    head = "  " + "".ljust(38) + "".join(n.rjust(12) for n in names)
    rows = [
        ("append 1 event, median ms", "append_1", "median_ms"),
        ("append 1 event, p90 ms", "append_1", "p90_ms"),
        ("append 1 event, p99 ms", "append_1", "p99_ms"),
        ("client CPU per 1-event append, ms", "append_1", "client_cpu_ms_per_append"),
        ("server CPU per 1-event append, ms", "append_1", "server_cpu_ms_per_append"),
        ("append 20 events, median ms", "append_20", "median_ms"),
        ("append 20 events, p99 ms", "append_20", "p99_ms"),
        ("read 1,000 events, median ms", "read_1000", "median_ms"),
        ("follow sees another's append, median ms", "follow", "median_ms"),
        ("follow sees another's append, p90 ms", "follow", "p90_ms"),
    ]
    out = ["  store backends (fresh database each)", head]
    for label, key, field in rows:
        cells = "".join(fmt(r[n][key].get(field), 3).rjust(12) for n in names)
        out.append("  " + label.ljust(38) + cells)
    if "skipped" in pg:
        out.append(f"  postgresql: skipped: {pg['skipped']}")
    else:
        ratio = r.get("ratios", {}).get("postgresql/sqlite append_1")
        out.append(f"  postgresql: {r.get('postgres_source')}; PostgreSQL / SQLite append "
                   f"median {fmt(ratio, 1)}")
    return out
