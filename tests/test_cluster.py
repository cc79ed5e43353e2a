"""Three daemons on one PostgreSQL store: sessions placed on all of them, any daemon
answering for any session, and a daemon's loss (SIGKILL, SIGTERM) survived with nothing
run twice, nothing lost and every event streamed once."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState
from trouper.client.sse_reading import parse_sse
from trouper.daemon.cluster_setup import ClusterOptions
from trouper.messages.events import ActionEvent, ObservationEvent
from trouper.store import open_store
from trouper.testing import check_log, wait_until
from trouper.testing.daemon import TestDaemon

pytestmark = pytest.mark.slow  # daemon processes on a database server

FINISH = {"tool": "finish", "args": {"message": "done"}}
HEARTBEAT_S = 0.5


def slow_steps(n: int, delay_s: float = 0.2) -> list[dict[str, Any]]:
    """n steps, each a line in ``ledger.txt`` (and a moment's work), then finish."""
    return [{"tool": "run", "args": {"command": f"echo step {i} >> ledger.txt; sleep 0.1"},
             "delay_s": delay_s} for i in range(n)] + [FINISH]


def ran_once(workspace: Path) -> None:
    """No command of ``slow_steps`` ran twice (a lost one may not have run at all)."""
    lines = (workspace / "ledger.txt").read_text().splitlines()
    assert len(lines) == len(set(lines)), lines


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str) -> Iterator[Callable[..., list[TestDaemon]]]:
    """``cluster(n, docker_on=())`` starts n more daemons (d0, d1... on from the last one
    started) on one store and one key; returns them all; all end at the test's end."""
    daemons: list[TestDaemon] = []
    env = {"TROUPER_STORE": postgres_url,
           "TROUPER_CLUSTER_KEY_FILE": str(tmp_path / "cluster.key")}

    def start(n: int, docker_on: tuple[int, ...] = (),
              heartbeat_s: float = HEARTBEAT_S) -> list[TestDaemon]:
        for i in range(len(daemons), len(daemons) + n):
            options = ClusterOptions(name=f"d{i}", heartbeat_s=heartbeat_s, detect=False,
                                     capabilities=("docker",) if i in docker_on else ())
            daemon = TestDaemon(tmp_path / f"h{i}", env=env, cluster=options)
            daemons.append(daemon)
            daemon.start()
        return daemons

    try:
        yield start
    finally:
        for daemon in daemons:
            daemon.close()


def actors_alive(daemon: TestDaemon) -> list[str]:
    """The actor processes the daemon's home published that still run (its admin, root,
    broker, and each session's supervisor, Controller and RuntimeProxy)."""
    from trouper.host.processes import published_pid

    root = daemon.home.root
    files = [*root.glob("actors/*.pid"), *root.glob("sessions/*/actors/*.pid")]
    return [f"{path.relative_to(root)}: {pid}" for path in files
            if (pid := published_pid(path)) is not None]


def generation_of(http: Any, name: str) -> int:
    """The generation of the daemon ``name`` as ``GET /v1/cluster`` shows it."""
    return int({x["name"]: x for x in http.get("/v1/cluster").json()["daemons"]}[name][
        "generation"])


@dataclass
class Link:
    """How one daemon reaches the store, and how a test cuts that link and heals it."""

    url: str
    cut: Callable[[], None]
    heal: Callable[[], None]


@contextlib.contextmanager
def role_link(postgres_url: str) -> Iterator[Link]:
    """The store as a role of its own; cut: its logins refused, its connections ended.
    The schema is made first: the role is granted the tables there are."""
    import psycopg

    from trouper.testing.postgres import database_role

    store = open_store(postgres_url)
    store.sessions()
    store.close()
    with contextlib.contextmanager(database_role)(postgres_url) as (url, role):
        def login(allowed: bool) -> None:
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                admin.execute(f'ALTER ROLE "{role}" {"LOGIN" if allowed else "NOLOGIN"}')
                if not allowed:
                    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                  " WHERE usename = %s", (role,))

        yield Link(url, lambda: login(False), lambda: login(True))


@contextlib.contextmanager
def packet_link(postgres_url: str) -> Iterator[Link]:
    """The store at its second loopback address, 127.0.0.2 (scripts/postgres listens on
    it), which this daemon alone uses; cut: iptables drops the packets to and from it, a
    partition (queries hang rather than fail, and the server finds the connection dead
    by its keepalives). Skips without root, iptables or that address."""
    import shutil
    import subprocess
    from urllib.parse import urlsplit

    import psycopg

    if shutil.which("iptables") is None or os.geteuid() != 0:
        pytest.skip("needs root and iptables to drop a daemon's packets to the store")
    parts = urlsplit(postgres_url)
    port = str(parts.port)
    url = parts._replace(netloc=parts.netloc.replace(f"@{parts.hostname}:",
                                                     "@127.0.0.2:")).geturl()
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        pytest.skip(f"the test server does not listen on 127.0.0.2 (scripts/postgres "
                    f"does): {exc}")
    rules = [["INPUT", "-i", "lo", "-d", "127.0.0.2", "-p", "tcp", "--dport", port],
             ["OUTPUT", "-o", "lo", "-s", "127.0.0.2", "-p", "tcp", "--sport", port]]
    dropping: list[bool] = []

    def iptables(action: str) -> None:
        for rule in rules:
            subprocess.run(["iptables", action, *rule, "-m", "comment", "--comment",
                            f"trouper-test-{port}", "-j", "DROP"], check=True,
                           capture_output=True)

    def cut() -> None:
        iptables("-A")
        dropping.append(True)

    def heal() -> None:
        if dropping:
            iptables("-D")
            dropping.clear()

    try:
        yield Link(url, cut, heal)
    finally:
        heal()  # never a rule left behind


def taken_over_after_a_cut(cluster: Callable[..., list[TestDaemon]], scripted: Any,
                           postgres_url: str, home: Path, link: Link) -> None:
    """A daemon "cut" runs a session through ``link``, which is cut mid-session: d0 takes
    the session over and finishes it, nothing run twice; healed, "cut" joins again as a
    new generation (fenced: its late appends fail, its actors stop)."""
    d = cluster(1)  # d0 makes the schema; "cut" reaches the store through the link
    _, waiting = scripted([{"say": "What next?"}])
    d[0].client().start_session("wait", llm=waiting)  # d0 the busier: the next is cut's
    cut = TestDaemon(home, env={**d[0].env, "TROUPER_STORE": link.url},
                     cluster=ClusterOptions(name="cut", heartbeat_s=HEARTBEAT_S,
                                            detect=False))
    try:
        cut.start()
        client = cut.client()
        _, llm = scripted(slow_steps(20, delay_s=0.3))
        sid = client.start_session("count", llm=llm, max_iterations=100).id
        assert stored(postgres_url, sid)[2] == "cut"
        wait_until(lambda: client.session(sid).info().actions >= 3, 90, "3 actions")
        link.cut()
        try:
            wait_until(lambda: stored(postgres_url, sid)[2] == "d0", 60,
                       "d0 to take the session over")
            assert d[0].client().session(sid).wait(timeout=120) == AgentState.FINISHED
        finally:
            link.heal()
        http = d[0].http()
        wait_until(lambda: generation_of(http, "cut") == 2, 120,
                   "the cut-off daemon to join again")
        one_outcome_each(stored(postgres_url, sid)[1])
        ran_once(cut.home.default_workspace(sid))
        assert stored(postgres_url, sid)[2] == "d0"
    finally:
        cut.close()


def stored(url: str, session_id: str) -> tuple[Any, list[Any], str | None]:
    store = open_store(url)
    try:
        with store.pooled("test") as conn:  # type: ignore[attr-defined]
            row = conn.execute("SELECT daemon FROM sessions WHERE id = %s",
                               (session_id,)).fetchone()
        return store.session(session_id), store.read(session_id), row[0]
    finally:
        store.close()


def one_outcome_each(log: list[Any]) -> None:
    assert check_log(log) == []  # seq contiguous, every action exactly one outcome
    actions = [e.action_id for e in log if isinstance(e, ActionEvent)]
    outcomes = [e.action_id for e in log if isinstance(e, ObservationEvent)]
    assert len(actions) == len(set(actions)) and sorted(actions) == sorted(outcomes)


def test_sessions_spread_over_the_daemons_and_any_daemon_answers_for_any(
        cluster, scripted, postgres_url):
    d = cluster(3)
    _, llm = scripted([{"say": "What next?"}, FINISH])
    ids = [d[0].client().start_session(f"task {i}", llm=llm).id for i in range(6)]
    placed = {sid: d[0].http().get(f"/v1/sessions/{sid}").json()["daemon"] for sid in ids}
    assert sorted(placed.values()) == ["d0", "d0", "d1", "d1", "d2", "d2"]  # least loaded
    for sid in ids:
        assert d[1].client().session(sid).wait(timeout=90) == AgentState.AWAITING_USER_INPUT
    # a message through a daemon that does not run the session reaches the one that does
    for i, sid in enumerate(ids):
        d[i % 3].client().session(sid).send("go on")
    for sid in ids:
        assert d[2].client().session(sid).wait(timeout=90) == AgentState.FINISHED
        record, log, daemon = stored(postgres_url, sid)
        assert daemon == placed[sid]
        assert [e.text for e in log if getattr(e, "source", "") == "user"
                and e.kind == "message"][-1] == "go on"
    view = d[1].http().get("/v1/cluster").json()
    assert view["me"] == "d1" and view["cluster"] is True
    assert sorted((x["name"], x["state"]) for x in view["daemons"]) == \
        [("d0", "alive"), ("d1", "alive"), ("d2", "alive")]
    assert all(x["heartbeat_age_s"] < 10 for x in view["daemons"])


def test_a_session_that_needs_docker_is_placed_only_where_docker_is(cluster, scripted):
    d = cluster(3, docker_on=(2,))
    _, llm = scripted([FINISH])
    for i in range(3):
        answer = d[i].http().post("/v1/sessions", json={
            "task": "t", "llm": llm, "runtime": {"kind": "docker", "image": "no-such:image"}})
        assert answer.status_code == 201, answer.text
        assert answer.json()["daemon"] == "d2"
    refused = d[0].http().post("/v1/sessions", json={"task": "t", "llm": llm,
                                                     "labels": ["gpu=a100"]})
    assert refused.status_code == 422
    assert "label:gpu=a100" in refused.json()["error"]["message"]


def test_a_daemon_killed_mid_session_its_sessions_finish_on_the_others_streamed_once(
        cluster, scripted, postgres_url, tmp_path):
    d = cluster(3)
    _, llm = scripted(slow_steps(15))
    ids = [d[0].client().start_session(f"count {i}", llm=llm, max_iterations=100,
                                       workspace=str(tmp_path / f"ws{i}")).id
           for i in range(3)]
    on = {sid: d[0].http().get(f"/v1/sessions/{sid}").json()["daemon"] for sid in ids}
    victim_name = "d1"
    victim = d[1]
    doomed = [sid for sid in ids if on[sid] == victim_name]
    assert doomed  # one session each (least loaded)
    sid = doomed[0]
    followed: list[Any] = []
    stop = threading.Event()

    def follow() -> None:  # a client streaming from the daemon that dies, then another
        try:
            for event in victim.client().session(sid).events(follow=True, stop=stop):
                followed.append(event)
        except Exception:  # noqa: BLE001 - the connection dies with the daemon
            pass

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    wait_until(lambda: len(followed) >= 8, 60, "the session midway")
    assert actors_alive(victim)  # (the check below can see them)
    victim.kill()  # the daemon and its actor processes, as a host's crash
    wait_until(lambda: not actors_alive(victim), 30, "no actor of the killed daemon left")
    follower.join(timeout=30)
    after = followed[-1].seq if followed else 0
    with d[2].http(timeout=None) as http, http.stream(
            "GET", f"/v1/sessions/{sid}/events/stream",
            params={"until_settled": "true"}, headers={"Last-Event-ID": str(after)}) as got:
        resumed = [data["seq"] for kind, data in parse_sse(got.iter_lines())
                   if kind == "message"]
    for i, other in enumerate(ids):
        assert d[2].client().session(other).wait(timeout=120) == AgentState.FINISHED
        record, log, daemon = stored(postgres_url, other)
        one_outcome_each(log)
        ran_once(tmp_path / f"ws{i}")
        assert daemon != victim_name
    _, log, adopter = stored(postgres_url, sid)
    # the adopter had no secrets file of the session: it came sealed through the store
    secrets_file = d[int(adopter[1:])].home.secrets_path(sid)
    assert json.loads(secrets_file.read_text())["llm_api_key"] == "test-key"
    assert secrets_file.stat().st_mode & 0o777 == 0o600
    seqs = [e.seq for e in followed] + resumed
    assert seqs == list(range(1, len(log) + 1))  # every event exactly once, in order


def test_sigterm_drains_a_daemon_its_sessions_go_on_at_once_on_its_peers(
        cluster, scripted, postgres_url, tmp_path):
    d = cluster(3)
    _, llm = scripted(slow_steps(12))
    ids = [d[0].client().start_session(f"count {i}", llm=llm, max_iterations=100,
                                       workspace=str(tmp_path / f"ws{i}")).id
           for i in range(3)]
    on = {sid: d[0].http().get(f"/v1/sessions/{sid}").json()["daemon"] for sid in ids}
    drained = [sid for sid in ids if on[sid] == "d0"]
    assert drained
    wait_until(lambda: all(d[1].client().session(s).info().actions >= 2 for s in ids), 90,
               "two actions in each session")
    d[0].stop()  # SIGTERM; returns once the daemon is gone
    assert actors_alive(d[0]) == []  # none outlives a drain
    for sid in drained:  # handed over in the drain, not after a heartbeat lapsed
        assert stored(postgres_url, sid)[2] in ("d1", "d2")
    view = d[1].http().get("/v1/cluster").json()
    assert {x["name"]: x["state"] for x in view["daemons"]}["d0"] == "stopped"
    for i, sid in enumerate(ids):
        assert d[2].client().session(sid).wait(timeout=120) == AgentState.FINISHED
        one_outcome_each(stored(postgres_url, sid)[1])
        ran_once(tmp_path / f"ws{i}")


def test_a_daemon_cut_off_from_the_store_is_fenced_and_cannot_append_when_it_comes_back(
        cluster, scripted, postgres_url, tmp_path):
    """Its role's logins refused: its queries fail at once."""
    with role_link(postgres_url) as link:
        taken_over_after_a_cut(cluster, scripted, postgres_url, tmp_path / "hc", link)


def test_status_shows_the_cluster_and_the_store_holds_no_secret_in_clear(
        cluster, scripted, postgres_url):
    import psycopg
    from click.testing import CliRunner

    from trouper.cli.main import main

    d = cluster(2)
    assert d[0].token == d[1].token  # one cluster token: a client may go to either
    _, llm = scripted([FINISH])
    sids = [d[0].http().post("/v1/sessions", json={
        "task": "t", "llm": {**llm, "api_key": "sk-cluster-secret-1"},
        "secrets": {"DEPLOY": "hush-cluster-value"}}).json()["id"] for _ in range(2)]
    for sid in sids:
        assert d[1].client().session(sid).wait(timeout=90) == AgentState.FINISHED
    with psycopg.connect(postgres_url) as conn:
        for table in ("sessions", "events", "session_meta", "daemon_calls", "daemons"):
            dump = str(conn.execute(f"SELECT * FROM {table}").fetchall())
            assert "sk-cluster-secret-1" not in dump and "hush-cluster-value" not in dump
    shown = CliRunner().invoke(main, ["daemon", "status", "--home", str(d[1].home.root)])
    assert shown.exit_code == 0, shown.output
    assert "cluster of 2 daemon(s); this one is d1" in shown.output
    rows = [line.split() for line in shown.output.splitlines() if " alive " in line]
    assert sorted(row[1] if row[0] == "*" else row[0] for row in rows) == ["d0", "d1"]


def test_a_lone_daemon_cut_off_from_its_store_carries_its_sessions_on_once_it_is_back(
        scripted, postgres_url, tmp_path):
    with role_link(postgres_url) as link:
        lone = TestDaemon(tmp_path / "h", env={
            "TROUPER_STORE": link.url, "TROUPER_CLUSTER_KEY_FILE": str(tmp_path / "k")},
            cluster=ClusterOptions(name="lone", heartbeat_s=HEARTBEAT_S, detect=False))
        try:
            lone.start()
            client = lone.client()
            _, llm = scripted(slow_steps(16, delay_s=0.3))
            sid = client.start_session("count", llm=llm, max_iterations=100).id
            wait_until(lambda: client.session(sid).info().actions >= 3, 90, "3 actions")
            log = lone.home.root / "logs" / "daemon.log"
            link.cut()  # the store goes away
            try:
                wait_until(lambda: "is fenced (no heartbeat reached the store"
                           in log.read_text(), 60, "the daemon to stop its sessions by itself")
            finally:
                link.heal()  # and comes back
            assert client.session(sid).wait(timeout=120) == AgentState.FINISHED
            one_outcome_each(stored(postgres_url, sid)[1])
            ran_once(lone.home.default_workspace(sid))
            assert stored(postgres_url, sid)[2] == "lone"
        finally:
            lone.close()


def test_a_remote_sandbox_outlives_its_daemon_and_its_action_keeps_its_real_outcome(
        cluster, scripted, postgres_url, remote_server, monkeypatch, tmp_path):
    monkeypatch.delenv("TROUPER_RUNTIME_TOKEN", raising=False)
    server = remote_server()
    d = cluster(2)
    _, llm = scripted([
        {"tool": "run", "args": {"command": "touch started; sleep 3; echo one >> ledger.txt"}},
        {"tool": "run", "args": {"command": "cat ledger.txt"}},
        FINISH,
    ])
    sid = d[0].client().start_session("t", llm=llm, runtime=server.runtime(),
                                      workspace=str(tmp_path / "unused")).id
    host = stored(postgres_url, sid)[2]
    victim, peer = (d[0], "d1") if host == "d0" else (d[1], "d0")
    workspace = server.workspace(sid)
    wait_until(lambda: (workspace / "started").exists(), 60, "the slow command to start")
    victim.kill()  # mid-command: the command goes on in the runtime server
    survivor = d[int(peer[1:])]
    assert survivor.client().session(sid).wait(timeout=120) == AgentState.FINISHED
    record, log, daemon = stored(postgres_url, sid)
    assert daemon == peer
    one_outcome_each(log)
    first = [e for e in log if isinstance(e, ObservationEvent)][0].outcome
    assert (first.status, first.exit_code) == ("ok", 0)  # resolved from the journal
    assert (workspace / "ledger.txt").read_text() == "one\n"  # run once, not again


def test_a_session_whose_workspace_stayed_with_its_dead_daemon_is_an_error_saying_so(
        cluster, scripted, postgres_url, tmp_path):
    d = cluster(1, heartbeat_s=2.0)  # dead after 6 s: time to take the workspace away
    _, waiting = scripted([{"say": "What next?"}])
    d[0].client().start_session("wait", llm=waiting)  # d0 the busier: the next is d1's
    d = cluster(1, heartbeat_s=2.0)
    _, llm = scripted(slow_steps(12, delay_s=0.3))
    workspace = tmp_path / "on-d1"
    workspace.mkdir()
    sid = d[1].client().start_session("count", llm=llm, workspace=str(workspace),
                                      max_iterations=100).id
    assert stored(postgres_url, sid)[2] == "d1"
    wait_until(lambda: d[1].client().session(sid).info().actions >= 2, 90, "2 actions")
    d[1].kill()
    away = workspace.rename(tmp_path / "elsewhere")  # the disk went with its host
    wait_until(lambda: stored(postgres_url, sid)[0].state == AgentState.ERROR, 60,
               "the session in ERROR")
    record, _, daemon = stored(postgres_url, sid)
    assert daemon == "d0"
    assert f"workspace {workspace} is not reachable from daemon d0" in record.state_reason
    assert not workspace.exists()  # no empty folder made in its place
    away.rename(workspace)  # shared again: a resume carries it on
    d[0].client().session(sid).resume()
    assert d[0].client().session(sid).wait(timeout=120) == AgentState.FINISHED
    one_outcome_each(stored(postgres_url, sid)[1])
    ran_once(workspace)


@pytest.mark.docker
def test_a_docker_session_of_a_killed_daemon_goes_on_in_a_new_container_and_the_old_goes(
        cluster, scripted, postgres_url, tmp_path, docker_homes, docker_client):
    from trouper.runtimes.docker_support import (
        LABEL_OWNER,
        LABEL_SESSION,
        list_containers,
        owner_of_home,
    )

    homes = [docker_homes(tmp_path / f"h{i}") for i in range(2)]  # the fixture's paths
    d = cluster(1, docker_on=(0,))
    _, waiting = scripted([{"say": "What next?"}])
    d[0].client().start_session("wait", llm=waiting)  # d0 the busier: the next is d1's
    d = cluster(1, docker_on=(1,))
    steps = [{"tool": "run", "args": {"command": f"echo {i} >> steps.txt; sleep 0.2"}}
             for i in range(15)]
    _, llm = scripted([*steps, FINISH])
    workspace = tmp_path / "ws"
    sid = d[1].client().start_session(
        "count", llm=llm, runtime={"kind": "docker", "image": "trouper-test-busybox:latest"},
        workspace=str(workspace), max_iterations=100).id
    assert stored(postgres_url, sid)[2] == "d1"
    wait_until(lambda: d[1].client().session(sid).info().actions >= 3, 120, "3 actions")

    def of(home: Path) -> list[Any]:
        return list_containers(docker_client, [f"{LABEL_SESSION}={sid}",
                                               f"{LABEL_OWNER}={owner_of_home(home)}"])

    assert len(of(homes[1])) == 1
    d[1].kill()  # its container is left running: no daemon of that home sweeps it
    assert d[0].client().session(sid).wait(timeout=180) == AgentState.FINISHED
    assert stored(postgres_url, sid)[2] == "d0"
    assert of(homes[1]) == []  # removed by the daemon that took the session over
    log = stored(postgres_url, sid)[1]
    one_outcome_each(log)
    lines = (workspace / "steps.txt").read_text().splitlines()
    assert len(lines) == len(set(lines)), lines  # no step ran twice
    lost = [e for e in log if isinstance(e, ObservationEvent) and e.outcome.status == "lost"]
    assert len(lost) <= 1  # the one in flight at the kill, if any: never run again


def test_a_partition_that_swallows_the_store_packets_fences_the_daemon_behind_it(
        cluster, scripted, postgres_url, tmp_path):
    """A real partition: the packets between one daemon and the store are dropped (an
    iptables rule on the port it alone uses), so its queries hang instead of failing."""
    with packet_link(postgres_url) as link:
        taken_over_after_a_cut(cluster, scripted, postgres_url, tmp_path / "hp", link)


def test_a_daemon_whose_root_dies_resumes_its_own_sessions_only(
        cluster, scripted, postgres_url, tmp_path):
    import signal

    from trouper.host.processes import published_pid

    d = cluster(2)
    _, llm = scripted(slow_steps(10))
    ids = [d[0].client().start_session(f"count {i}", llm=llm, max_iterations=100,
                                       workspace=str(tmp_path / f"ws{i}")).id
           for i in range(2)]
    on = {sid: stored(postgres_url, sid)[2] for sid in ids}
    assert sorted(on.values()) == ["d0", "d1"]
    theirs = next(sid for sid in ids if on[sid] == "d1")
    wait_until(lambda: all(d[0].client().session(s).info().actions >= 2 for s in ids), 90,
               "two actions in each session")
    root = published_pid(d[0].home.root / "actors" / "root.pid")
    assert root is not None
    os.kill(root, signal.SIGKILL)  # d0's program starts a new root, which resumes
    for i, sid in enumerate(ids):
        assert d[1].client().session(sid).wait(timeout=120) == AgentState.FINISHED
        one_outcome_each(stored(postgres_url, sid)[1])
        ran_once(tmp_path / f"ws{i}")
    store = open_store(postgres_url)
    try:  # d1's session was claimed by d1's Controller alone: d0 never took it
        assert store.get_meta(theirs, "owner") == "1"
    finally:
        store.close()
