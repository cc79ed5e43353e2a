"""Workload ``cluster``: a cluster of three daemons on one PostgreSQL store loses one to
SIGKILL; how long until its sessions run again on the others. Also the step cost of one
session on PostgreSQL beside SQLite (``store_steps.py``).

For each heartbeat (the default 1.0 s and 0.5 s) a fresh cluster is started: a scratch
database on the server, three daemons d0, d1, d2 (``TestDaemon``, one cluster key, no
capability detection) and one scripted ``FakeLLMServer`` whose every step runs ``echo i
>> out.txt`` after ``STEP_DELAY_S`` (``STEPS`` steps: far more than a trial lasts). Each
of ``reps`` repetitions then:

1. starts six sessions through a live daemon (placed least-loaded: two on each);
2. waits until every one has recorded two actions (all are moving);
3. notes each session of the victim (``sessions.daemon``, rotating d1, d2, d0...) and the
   last seq of its log, then SIGKILLs the victim (``TestDaemon.kill``: the daemon and,
   through its admin's owner watch, its actors), ``killed_at`` taken just before;
4. notes the last seq of each of the victim's sessions once the kill is over (no process
   of the victim is left to append), then polls the store (psycopg on the scratch
   database, every ``POLL_S``) until each of them is **running on another daemon**: its
   ``sessions.daemon`` names a daemon other than the victim whose row is ``alive``, AND
   its log holds an event after that seq: the new owner's first (it adopted the session,
   claimed its log with a new owner token and restored the actors from it; a restored
   RUNNING session records no new ``StateChanged(RUNNING)``, so the first event is what
   its actors append once up: the restarted runtime's ``RuntimeEvent``, the in-flight
   action's outcome, the next model completion);
5. stops the six sessions, starts the victim again (same name, a new generation) and
   waits until every daemon is alive and has kept its generation for ``4 x heartbeat``
   (``Cluster.settle``, also after the first start: a daemon that takes longer than
   ``3 x heartbeat`` from its registration to its first beat is declared dead once and
   joins again, and the next repetition must not place sessions on it meanwhile).

**failover_s** of a repetition is the latest, over the victim's sessions, of (the ``ts``
of the new owner's first event - ``killed_at``): both are this machine's clock, so the
poll's interval is not in it. The heartbeat math says: the victim is declared dead once
its last beat is ``3 x heartbeat`` old (at a peer's next beat, up to one more heartbeat),
the peers adopt at that beat and restore the session from its log; so 2-4 heartbeats
plus a restore. Also per repetition: ``declared_dead_s`` (the victim's
``daemons.ended_at``, the database's clock, - ``killed_at``), ``adopted_seen_s`` (the
poll that first saw every session on a live peer: coarse by ``POLL_S``), ``first_kinds``
(the kinds of those first events), ``next_action_s`` (an ``ActionEvent`` of the new
owner: the next step ran; latest over the sessions) and ``kill_call_s`` (how long
``TestDaemon.kill`` took).

Reported per heartbeat: median, min and max of ``failover_s`` over the repetitions, and
every repetition. PostgreSQL is the one ``--postgres-url`` names, else
``TROUPER_TEST_POSTGRES_URL``'s; without either the workload is skipped (its targets
null).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import store_steps
from common import median

from trouper.daemon.cluster_setup import DEAD_AFTER_HEARTBEATS, HEARTBEAT_S, ClusterOptions
from trouper.testing import FakeLLMServer, wait_until
from trouper.testing.daemon import TestDaemon
from trouper.testing.postgres import scratch_database

HEARTBEATS = (HEARTBEAT_S, 0.5)
"""The default heartbeat (1.0 s) and a shorter one."""
DAEMONS = 3
SESSIONS_PER_DAEMON = 2
STEPS = 400
STEP_DELAY_S = 0.2
POLL_S = 0.02
MODEL = "hosted_vllm/fake"


def script() -> list[dict[str, Any]]:
    """``STEPS`` steps of a short command, each answered after ``STEP_DELAY_S``."""
    return [{"tool": "run", "args": {"command": f"echo {i} >> out.txt"},
             "delay_s": STEP_DELAY_S} for i in range(STEPS)] + [
        {"tool": "finish", "args": {"message": "done"}}]


def server_url(postgres_url: str | None) -> tuple[str | None, str]:
    """(the PostgreSQL server's URL or None, where it comes from or why there is none)."""
    if postgres_url:
        return postgres_url, "--postgres-url"
    env = os.environ.get("TROUPER_TEST_POSTGRES_URL")
    if env:
        return env, "TROUPER_TEST_POSTGRES_URL"
    return None, "no --postgres-url and no TROUPER_TEST_POSTGRES_URL"


class Cluster:
    """Three daemons on one scratch database, and a psycopg connection to it."""

    def __init__(self, url: str, root: Path, heartbeat_s: float) -> None:
        import psycopg

        self.url, self.heartbeat_s = url, heartbeat_s
        root.mkdir(parents=True, exist_ok=True)
        env = {"TROUPER_STORE": url, "TROUPER_CLUSTER_KEY_FILE": str(root / "cluster.key")}
        self.daemons = [
            TestDaemon(root / f"h{i}", env=env, cluster=ClusterOptions(
                name=f"d{i}", heartbeat_s=heartbeat_s, detect=False))
            for i in range(DAEMONS)]
        self.db = psycopg.connect(url, autocommit=True)

    def start(self) -> None:
        for daemon in self.daemons:
            daemon.start()
        self.settle()

    def settle(self) -> None:
        """Wait until every daemon is alive and has kept beating (no rejoin) for ``3 x
        heartbeat`` and one more: a daemon registers before it serves and beats, and a
        start slower than that is declared dead once (fenced, it joins again)."""
        names = [d.cluster.name for d in self.daemons]
        quiet_s = self.heartbeat_s * (DEAD_AFTER_HEARTBEATS + 1)
        seen: dict[str, Any] = {"rows": None, "since": time.monotonic()}

        def steady() -> bool:
            rows = sorted(self.db.execute(
                "SELECT name, generation FROM daemons WHERE state = 'alive' AND name = ANY(%s)"
                " AND heartbeat_at >= now() - heartbeat_s * 2 * interval '1 second'",
                (names,)).fetchall())
            if len(rows) < len(names) or rows != seen["rows"]:
                seen.update(rows=rows, since=time.monotonic())
                return False
            return time.monotonic() - seen["since"] >= quiet_s

        wait_until(steady, 60 + 10 * quiet_s, "every daemon alive and beating", poll_s=0.05)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.db.close()
        for daemon in self.daemons:
            with contextlib.suppress(Exception):
                daemon.close()

    def live(self, but: TestDaemon | None = None) -> TestDaemon:
        return next(d for d in self.daemons if d is not but and d.running())

    def placed(self, ids: list[str]) -> dict[str, str]:
        rows = self.db.execute("SELECT id, daemon FROM sessions WHERE id = ANY(%s)",
                               (ids,)).fetchall()
        return {str(r[0]): str(r[1]) for r in rows}

    def last_seq(self, session_id: str) -> int:
        row = self.db.execute("SELECT coalesce(max(seq), 0) FROM events WHERE session_id = %s",
                              (session_id,)).fetchone()
        return int(row[0]) if row else 0

    def actions(self, session_id: str) -> int:
        row = self.db.execute("SELECT count(*) FROM events WHERE session_id = %s AND"
                              " kind = 'action'", (session_id,)).fetchone()
        return int(row[0]) if row else 0

    def on_live_peer(self, session_id: str, victim: str) -> bool:
        row = self.db.execute(
            "SELECT d.state FROM sessions s JOIN daemons d ON d.name = s.daemon"
            " WHERE s.id = %s AND s.daemon <> %s", (session_id, victim)).fetchone()
        return row is not None and row[0] == "alive"

    def events_after(self, session_id: str, seq: int) -> list[tuple[str, float, dict[str, Any]]]:
        rows = self.db.execute("SELECT kind, ts, body_json FROM events WHERE session_id = %s"
                               " AND seq > %s ORDER BY seq", (session_id, seq)).fetchall()
        return [(str(r[0]), _epoch(r[1]), json.loads(r[2])) for r in rows]

    def ended_at(self, name: str) -> float | None:
        row = self.db.execute("SELECT ended_at FROM daemons WHERE name = %s AND state = 'dead'",
                              (name,)).fetchone()
        return _epoch(row[0]) if row and row[0] is not None else None


def _epoch(ts: datetime) -> float:
    return ts.timestamp()


def trial(c: Cluster, llm: dict[str, str], victim: TestDaemon, timeout_s: float,
          rep: int) -> dict[str, Any]:
    """One repetition (steps 1-5 of the module doc); its figures."""
    client = c.live(but=victim).client()
    n = DAEMONS * SESSIONS_PER_DAEMON
    ids = [client.start_session(f"failover {rep}.{i}", llm=llm, max_iterations=STEPS + 5).id
           for i in range(n)]
    try:
        wait_until(lambda: all(c.actions(sid) >= 2 for sid in ids), 120, "two actions each")
        name = victim.cluster.name
        doomed = [sid for sid, on in c.placed(ids).items() if on == name]
        if not doomed:
            raise RuntimeError(f"no session was placed on {name}: {c.placed(ids)}")
        killed_at = time.time()
        victim.kill()  # returns once the daemon and all its actor processes are gone
        kill_returned = time.time()
        seqs = {sid: c.last_seq(sid) for sid in doomed}  # the old owner's last event
        running: dict[str, tuple[float, str]] = {}
        adopted_seen: float | None = None
        deadline = time.monotonic() + timeout_s
        while len(running) < len(doomed) and time.monotonic() < deadline:
            for sid in doomed:
                if sid in running or not c.on_live_peer(sid, name):
                    continue
                events = c.events_after(sid, seqs[sid])
                if events:  # the new owner's first event
                    running[sid] = (events[0][1], events[0][0])
            if adopted_seen is None and all(c.on_live_peer(s, name) for s in doomed):
                adopted_seen = time.time()
            time.sleep(POLL_S)
        next_action = _next_action_s(c, doomed, seqs, running, timeout_s / 2)
        dead_at = c.ended_at(name)
        row: dict[str, Any] = {
            "victim": name, "sessions_moved": len(doomed),
            "adopted_by": c.placed(doomed),
            "failover_s": max(ts for ts, _ in running.values()) - killed_at
            if len(running) == len(doomed) else None,
            "per_session_s": sorted(ts - killed_at for ts, _ in running.values()),
            "first_kinds": sorted(kind for _, kind in running.values()),
            "kill_call_s": kill_returned - killed_at,
            "declared_dead_s": None if dead_at is None else dead_at - killed_at,
            "adopted_seen_s": None if adopted_seen is None else adopted_seen - killed_at,
            "next_action_s": next_action and next_action - killed_at,
        }
        if row["failover_s"] is None:
            row["error"] = (f"{len(doomed) - len(running)} of {len(doomed)} sessions not "
                            f"running on a live peer {timeout_s:g} s after the kill")
        return row
    finally:
        for sid in ids:  # the next repetition starts on idle daemons (stopped: no load)
            with contextlib.suppress(Exception):
                c.live(but=victim).client().session(sid).stop()
        if not victim.running():
            victim.start()
        c.settle()


def _next_action_s(c: Cluster, doomed: list[str], seqs: dict[str, int],
                   running: dict[str, tuple[float, str]], timeout_s: float) -> float | None:
    """The latest, over the moved sessions, of the first ActionEvent after its restore."""
    found: dict[str, float] = {}

    def all_acted() -> bool:
        for sid in doomed:
            if sid in running and sid not in found:
                ts = next((t for kind, t, _ in c.events_after(sid, seqs[sid])
                           if kind == "action" and t >= running[sid][0]), None)
                if ts is not None:
                    found[sid] = ts
        return len(found) == len(running)

    with contextlib.suppress(Exception):
        wait_until(all_acted, timeout_s, "an action after the restore")
    return max(found.values()) if running and len(found) == len(running) else None


def one_heartbeat(server: str, workdir: Path, heartbeat_s: float, reps: int,
                  llm_url: str) -> dict[str, Any]:
    """``reps`` repetitions on a fresh cluster of this heartbeat; their summary."""
    rows: list[dict[str, Any]] = []
    llm = {"model": MODEL, "base_url": llm_url, "api_key": "bench-key"}
    timeout_s = 30.0 + 20 * heartbeat_s
    with contextlib.ExitStack() as ends:
        url = ends.enter_context(contextlib.contextmanager(scratch_database)(
            server, "trouper_bench"))
        c = Cluster(url, workdir / f"cluster-hb{heartbeat_s:g}", heartbeat_s)
        ends.callback(c.close)
        c.start()
        for rep in range(reps):
            victim = c.daemons[(rep + 1) % DAEMONS]
            print(f"  cluster: heartbeat {heartbeat_s:g} s, kill {victim.cluster.name}, "
                  f"repetition {rep + 1}/{reps}", flush=True)
            try:
                rows.append(trial(c, llm, victim, timeout_s, rep))
            except Exception as exc:  # noqa: BLE001 - reported, the other repetitions go on
                rows.append({"victim": victim.cluster.name,
                             "error": f"{type(exc).__name__}: {exc}"})
    times = [r["failover_s"] for r in rows if r.get("failover_s") is not None]
    homes = {d.cluster.name: d.home.root for d in c.daemons}
    return {
        "heartbeat_s": heartbeat_s,
        "dead_after_s": heartbeat_s * DEAD_AFTER_HEARTBEATS,
        "repetitions": reps,
        "ok": len(times),
        "median_s": median(times),
        "min_s": min(times, default=None),
        "max_s": max(times, default=None),
        **{f"median_{key}": median(r[key] for r in rows if r.get(key) is not None)
           for key in ("declared_dead_s", "adopted_seen_s", "first_event_s",
                       "next_action_s", "kill_call_s")},
        "trials": rows,
        "log_errors": _log_errors(homes),
    }


def _log_errors(homes: dict[str, Path], most: int = 20) -> dict[str, list[str]]:
    """The daemons' ERROR and CRITICAL log lines (their homes go with the bench's temporary
    folder): the first ``most`` of each daemon."""
    out: dict[str, list[str]] = {}
    for name, home in homes.items():
        found = []
        for log in ("daemon.log", "trouper.log"):
            with contextlib.suppress(OSError):
                found += [f"{log}: {line.strip()}"[:400]
                          for line in (home / "logs" / log).read_text(errors="replace")
                          .splitlines() if " ERROR " in line or " CRITICAL " in line]
        if found:
            out[name] = found[:most]
    return out


@contextlib.contextmanager
def _fake_llm() -> Iterator[FakeLLMServer]:
    server = FakeLLMServer(script()).start()
    try:
        yield server
    finally:
        server.stop()


def run(reps: int, workdir: Path, postgres_url: str | None = None, step_k: int = 20,
        step_rounds: int = 3) -> dict[str, Any]:
    """Failover at each heartbeat and the step cost by store; ``{"skipped": why}`` at
    both without PostgreSQL."""
    server, source = server_url(postgres_url)
    out: dict[str, Any] = {"postgres_source": source, "reps": reps}
    if server is None:
        why = f"no PostgreSQL ({source})"
        return {**out, "skipped": why, "by_heartbeat": {}, "step_by_store": {"skipped": why}}
    out["by_heartbeat"] = {}
    with _fake_llm() as llm_server:
        for heartbeat_s in HEARTBEATS:
            out["by_heartbeat"][f"{heartbeat_s:g}"] = one_heartbeat(
                server, workdir, heartbeat_s, reps, llm_server.url)
    print(f"  cluster: step cost on PostgreSQL and SQLite, K={step_k}", flush=True)
    out["step_by_store"] = store_steps.run(server, workdir, step_k, step_rounds)
    return out


def lines(r: dict[str, Any]) -> list[str]:
    """The workload's section of the report."""
    out = ["Cluster: 3 daemons on one PostgreSQL store, one SIGKILLed: its sessions RUNNING "
           "on a peer"]
    if "skipped" in r:
        return out + [f"  skipped: {r['skipped']}"]

    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for hb, by in r["by_heartbeat"].items():
        out.append(f"  heartbeat {hb} s (dead after {by['dead_after_s']:g} s): failover "
                   f"median {s(by['median_s'])} s, min {s(by['min_s'])}, max "
                   f"{s(by['max_s'])} ({by['ok']}/{by['repetitions']} ok); declared dead "
                   f"{s(by['median_declared_dead_s'])} s, next action "
                   f"{s(by['median_next_action_s'])} s (medians)")
        for row in by["trials"]:
            if "error" in row:
                out.append(f"    {row['victim']}: {row['error']}")
    out += store_steps.lines(r["step_by_store"])
    return out
