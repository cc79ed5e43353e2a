"""The daemon's ``GET /metrics``: what a session's steps, retries, rate limits, actions and
a killed RuntimeProxy's restart count, read by Prometheus's own parser, behind the token
(or open on loopback when asked), with no session id in any label; and the counts of
processes that are gone, kept when the metrics folder is compacted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from trouper.daemon.auth import open_metrics
from trouper.host.processes import pid_alive, published_pid
from trouper.observability import folder
from trouper.observability.exposition import render
from trouper.testing import wait_until
from trouper.testing.daemon import running_daemon

FINISH = {"tool": "finish", "args": {"message": "done"}}
SLOW = "touch started; sleep 1.5; echo one >> ledger.txt"
MODEL = "hosted_vllm/scripted"  # the scripted fixture's model


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the text, by name and labels, read by prometheus_client's parser."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in found.items() if n == name and wanted <= have)


def scrape(http: Any) -> dict:
    answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return samples(answer.text)


@pytest.mark.slow  # a daemon process, its actors and a sandbox
def test_a_session_s_steps_retries_actions_and_a_killed_proxy_are_counted(tmp_path, scripted):
    _, llm = scripted([
        {"tool": "run", "args": {"command": SLOW},
         "fail": [{"status": 429, "retry_after": 0.1}, {"status": 500}]},
        {"tool": "run", "args": {"command": "cat ledger.txt"}},
        FINISH,
    ])
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with running_daemon(tmp_path / "home") as daemon:
        http = daemon.http()
        made = http.post("/v1/sessions", json={"task": "count", "llm": llm,
                                               "workspace": str(workspace)})
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
        wait_until(lambda: (workspace / "started").exists(), 60, "the slow command to start")
        proxy = published_pid(daemon.home.actor_pid_path("runtime", sid))
        assert proxy is not None
        os.kill(proxy, signal.SIGKILL)  # mid-command: its supervisor restarts it
        wait_until(lambda: not pid_alive(proxy), 30, "the RuntimeProxy to die")
        wait_until(lambda: http.get(f"/v1/sessions/{sid}").json()["state"] == "finished",
                   90, "the session to finish")

        found = scrape(http)
        assert value(found, "trouper_steps_total", model=MODEL) == 3
        assert value(found, "trouper_llm_latency_seconds_count", model=MODEL) == 3
        assert value(found, "trouper_llm_retries_total", model=MODEL,
                     error_class="rate_limit") == 1
        assert value(found, "trouper_llm_retries_total", model=MODEL,
                     error_class="transient") == 1
        assert value(found, "trouper_llm_rate_limit_waits_total", model=MODEL) == 1
        assert value(found, "trouper_llm_rate_limit_wait_seconds_total", model=MODEL) > 0
        assert value(found, "trouper_actions_total", tool="run", runtime="local",
                     status="ok") == 2  # the killed proxy's command kept its real outcome
        assert value(found, "trouper_actions_total", tool="finish") == 1
        assert value(found, "trouper_action_duration_seconds_count", tool="run",
                     runtime="local") >= 1
        assert value(found, "trouper_actor_restarts_total", role="runtime",
                     cause="exited") == 1
        assert value(found, "trouper_actor_restarts_total", role="controller") == 0
        assert value(found, "trouper_sandbox_starts_total", runtime="local") >= 2
        assert value(found, "trouper_sessions", state="finished") == 1
        assert value(found, "trouper_sessions", state="running") == 0
        assert value(found, "trouper_state_changes_total", state="finished",
                     cause="finished") == 1
        assert value(found, "trouper_store_append_seconds_count", backend="sqlite") > 0
        assert value(found, "trouper_daemon_info", cluster="false") == 1
        for (name, labels), _ in found.items():  # no label holds a session's id
            assert not any(sid in v for _, v in labels), (name, labels)
            assert not {"session", "session_id", "action_id"} & {k for k, _ in labels}

        assert value(found, "trouper_stream_clients") == 0
        with http.stream("GET", f"/v1/sessions/{sid}/events/stream",
                         params={"until_settled": False}) as stream:
            assert stream.status_code == 200
            assert value(scrape(daemon.http()), "trouper_stream_clients") == 1

        for refused in (httpx.get(f"{daemon.url}/metrics", timeout=30),  # no token
                        daemon.http(token="wrong-token").get("/metrics")):
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"]["code"] == "unauthorized"


@pytest.mark.slow  # a daemon process
def test_metrics_open_on_loopback_serve_without_the_token_and_nothing_else(tmp_path):
    with running_daemon(tmp_path / "home", env={"TROUPER_METRICS_OPEN": "1"}) as daemon:
        with httpx.Client(base_url=daemon.url, timeout=30) as anyone:  # no token
            answer = anyone.get("/metrics")
            assert answer.status_code == 200, answer.text
            assert value(samples(answer.text), "trouper_daemon_info") == 1
            assert anyone.get("/v1/health").status_code == 401
            assert anyone.get("/v1/sessions").status_code == 401


def test_the_open_switch_is_ignored_off_loopback(monkeypatch):
    from trouper.config.settings import settings

    monkeypatch.setenv("TROUPER_METRICS_OPEN", "1")
    settings.cache_clear()
    try:
        assert open_metrics(frozenset({"127.0.0.1:80", "localhost:80", "[::1]:80"})) \
            == {"/metrics"}
        assert open_metrics(frozenset({"127.0.0.1:80", "example.org:80"})) == frozenset()
        monkeypatch.delenv("TROUPER_METRICS_OPEN")
        settings.cache_clear()
        assert open_metrics(frozenset({"127.0.0.1:80"})) == frozenset()
    finally:
        settings.cache_clear()


@pytest.mark.slow  # a program's actor system and a sandbox
def test_a_plain_program_serves_a_hung_proxy_s_probes_kill_and_restart(scripted, tmp_path,
                                                                        monkeypatch):
    from trouper import AgentState, Trouper
    from trouper.observability.exposition import SessionStates
    from trouper.testing import hang

    for name, seconds in (("WORKING_PROBE_S", "0.5"), ("PROBE_ANSWER_S", "1.5")):
        monkeypatch.setenv(f"TROUPER_{name}", seconds)  # read by the actors it forks
    _, llm = scripted([{"tool": "run", "args": {"command": "sleep 1 && echo slept"}}, FINISH])
    with Trouper(home=tmp_path / "home") as trouper:
        session = trouper.start_session("t", llm=llm, workspace=tmp_path / "ws")
        wait_until(lambda: any(e.kind == "action" for e in session.events()), 30,
                   "the action to start")
        with hang(session, "runtime") as pid:  # SIGSTOP: it answers no probe
            wait_until(lambda: not pid_alive(pid), 30, "the hung proxy to be killed")
        assert session.wait(timeout=60) == AgentState.FINISHED
        found = samples(render(trouper.home.root,
                               [SessionStates(lambda: trouper.store)]).decode())
    assert value(found, "trouper_actor_probes_total", role="runtime", cause="working") >= 1
    assert value(found, "trouper_actor_probe_kills_total", role="runtime") == 1
    assert value(found, "trouper_actor_restarts_total", role="runtime", cause="hung") == 1
    assert value(found, "trouper_sessions", state="finished") == 1
    assert value(found, "trouper_steps_total") == 2


RECORDER = textwrap.dedent("""
    import sys
    from trouper.observability import metrics, timing
    metrics.enable(sys.argv[1])
    for _ in range(int(sys.argv[2])):
        metrics.restarted("runtime:some-session", "exited unexpectedly (killed or crashed)")
        timing.observe_append[0]("sqlite", 0.002)
""")


def _record_in_a_process(home: Path, times: int) -> None:
    """A process of its own records ``times`` restarts and appends, then exits."""
    subprocess.run([sys.executable, "-c", RECORDER, str(home), str(times)], check=True,
                   timeout=120)


def test_a_dead_process_s_counts_stay_when_its_files_are_merged(tmp_path):
    home = tmp_path / "home"
    _record_in_a_process(home, 2)
    _record_in_a_process(home, 3)
    path = folder.folder_of(home)
    assert len(list(path.glob("counter_*[0-9].db"))) == 2
    for _ in range(2):  # merged at the first scrape; the same counts at the next
        found = samples(render(home).decode())
        assert value(found, "trouper_actor_restarts_total", role="runtime",
                     cause="exited") == 5
        assert value(found, "trouper_store_append_seconds_count", backend="sqlite") == 5
        assert value(found, "trouper_store_append_seconds_bucket", backend="sqlite",
                     le="0.0025") == 5
        assert value(found, "trouper_store_append_seconds_bucket", backend="sqlite",
                     le="0.001") == 0
        assert sorted(p.name for p in path.glob("*.db")) == ["counter_archive.db",
                                                             "histogram_archive.db"]
    _record_in_a_process(home, 1)
    found = samples(render(home).decode())
    assert value(found, "trouper_actor_restarts_total", role="runtime") == 6

    folder.at_opening(path)  # a program opens its actor system, nobody else writes here
    assert list(path.glob("*.db")) == []
    assert value(samples(render(home).decode()), "trouper_actor_restarts_total") == 0


@pytest.mark.parametrize(("reason", "cause"), [
    ("exited unexpectedly (killed or crashed)", "exited"),
    ("hung: it did not answer for 10 s after its session kept working, so its process "
     "was killed", "hung"),
    ("its process could not be started (OSError: [Errno 11] Resource temporarily "
     "unavailable)", "start_failed"),
    ("cooldown over after give-up round 2; trying again", "cooldown"),
    ("KeyError while handling Executed: 'a-1'", "failed"),
    ("resumed by the user", "other"),
])
def test_a_restart_s_reason_is_one_of_a_few_causes(reason, cause):
    from trouper.observability.metrics import restart_cause

    assert restart_cause(reason) == cause


@pytest.mark.parametrize(("why", "cause"), [
    ("a user's command waited 5 s for its answer", "unanswered_command"),
    ("its session kept working", "working"),
    ("session s-1's model call waited 30 s for it", "broker_slow"),
])
def test_a_probe_s_reason_is_one_of_a_few_causes(why, cause):
    from trouper.observability.metrics import probe_cause

    assert probe_cause(why) == cause


def test_a_cluster_daemon_names_itself_and_counts_each_daemon_s_sessions():
    from types import SimpleNamespace

    from trouper.observability.exposition import DaemonInfo

    member = SimpleNamespace(name="b", daemons=lambda: [
        SimpleNamespace(name="a", state="alive", sessions=3),
        SimpleNamespace(name="b", state="alive", sessions=1),
        SimpleNamespace(name="c", state="dead", sessions=0)])
    found = samples(render("/nonexistent-home", [DaemonInfo(member)]).decode())
    assert value(found, "trouper_daemon_info", daemon="b", cluster="true") == 1
    assert {d: value(found, "trouper_cluster_sessions", daemon=d) for d in "abc"} == \
        {"a": 3, "b": 1, "c": 0}
    assert value(found, "trouper_cluster_daemon_up", daemon="c") == 0
    assert value(found, "trouper_cluster_daemon_up") == 2
