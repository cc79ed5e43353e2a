"""Forking a session at an event: the new session's log is the original's first N events
and its files the checkpoint taken then; it carries on with a new script, and nothing of
the original changes. Also a fork at an action in flight, a fork of a running session, a
session without checkpoints, and checkpoints that outlive the program."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trouper import AgentState, Trouper
from trouper.client.fork import NOT_RUN_FORKED
from trouper.exceptions import ConfigError
from trouper.messages.events import ActionEvent, ObservationEvent, SessionForked, StateChanged
from trouper.testing import check_log, wait_until

pytestmark = pytest.mark.slow  # real sessions

FINISH = {"tool": "finish", "args": {"message": "done"}}
STEPS = [{"tool": "write_file", "args": {"path": "a.txt", "content": "one\n"}},
         {"tool": "run", "args": {"command": "echo two > b.txt"}},
         {"tool": "write_file", "args": {"path": "a.txt", "content": "three\n"}},
         FINISH]


def files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".trouper" not in p.parts and ".git" not in p.parts}


def outcome_seq(events: list, n: int) -> int:
    """The seq of the outcome of the agent's ``n``-th action (from 1)."""
    ids = [e.action_id for e in events if isinstance(e, ActionEvent) and e.source == "agent"]
    return next(e.seq for e in events
                if isinstance(e, ObservationEvent) and e.action_id == ids[n - 1])


def test_a_fork_starts_from_the_log_and_files_at_n_and_leaves_the_original_alone(
        tmp_path, scripted):
    _, llm = scripted(STEPS)
    ws = tmp_path / "ws"
    with Trouper(home=tmp_path / "home") as t:
        original = t.start_session("write files", llm=llm, workspace=ws)
        assert original.wait(timeout=60) == AgentState.FINISHED
        before = list(original.events())
        at = outcome_seq(before, 2)  # after b.txt, before a.txt's rewrite
        # a scripted model answers by the number of replies in the prompt: the fork's
        # holds the original's first two, so its new script starts at the third step
        _, again = scripted([*STEPS[:2], {"tool": "run", "args": {
            "command": "cat a.txt b.txt > c.txt"}}, FINISH])
        fork = t.fork(original.id, at_seq=at, message="now join them", llm=again)
        assert fork.wait(timeout=60) == AgentState.FINISHED
        forked = list(fork.events())
        assert [e.model_dump(exclude={"ts"}) for e in forked[:at]] == [
            e.model_dump(exclude={"ts"}) for e in before[:at]]
        [mark] = [e for e in forked if isinstance(e, SessionForked)]
        assert (mark.from_session, mark.at_seq) == (original.id, at)
        assert "after action" in mark.files and mark.checkpoint
        assert files(Path(fork.workspace)) == {"a.txt": "one\n", "b.txt": "two\n",
                                               "c.txt": "one\ntwo\n"}
        assert list(original.events()) == before  # nothing of the original changed
        assert files(ws) == {"a.txt": "three\n", "b.txt": "two\n"}
        assert check_log(forked) == []


def test_a_fork_at_an_action_in_flight_never_runs_it_and_waits_for_the_user(
        tmp_path, scripted):
    _, llm = scripted(STEPS)
    with Trouper(home=tmp_path / "home") as t:
        original = t.start_session("write files", llm=llm, workspace=tmp_path / "ws")
        assert original.wait(timeout=60) == AgentState.FINISHED
        events = list(original.events())
        third = [e for e in events if isinstance(e, ActionEvent)][2]  # a.txt's rewrite
        with pytest.raises(ConfigError, match="llm.model: is required"):
            t.fork(original.id, at_seq=third.seq, llm={})  # refused before anything is made
        fork = t.fork(original.id, at_seq=third.seq)
        assert fork.info().state == AgentState.PAUSED
        forked = list(fork.events())
        [never] = [e for e in forked if isinstance(e, ObservationEvent)
                   and e.action_id == third.action_id]
        assert never.outcome.status == "rejected" and never.outcome.content == NOT_RUN_FORKED
        assert files(Path(fork.workspace)) == {"a.txt": "one\n", "b.txt": "two\n"}
        assert "forked from" in [e for e in forked if isinstance(e, StateChanged)][-1].reason


def test_a_fork_of_a_session_at_its_start_has_the_files_the_first_action_found(
        tmp_path, scripted):
    _, llm = scripted(STEPS)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "given.txt").write_text("from the user\n")
    with Trouper(home=tmp_path / "home") as t:
        original = t.start_session("write files", llm=llm, workspace=ws)
        assert original.wait(timeout=60) == AgentState.FINISHED
        fork = t.fork(original.id, at_seq=1)  # the task only
        assert files(Path(fork.workspace)) == {"given.txt": "from the user\n"}
        assert "before the first action" in next(
            e for e in fork.events() if isinstance(e, SessionForked)).files


def test_without_checkpoints_a_fork_says_it_copies_the_current_files(tmp_path, scripted):
    _, llm = scripted(STEPS)
    with Trouper(home=tmp_path / "home") as t:
        original = t.start_session("write files", llm=llm, workspace=tmp_path / "ws",
                                   checkpoints=False)
        assert original.wait(timeout=60) == AgentState.FINISHED
        fork = t.fork(original.id, at_seq=outcome_seq(list(original.events()), 1))
        mark = next(e for e in fork.events() if isinstance(e, SessionForked))
        assert mark.checkpoint is None and "copy of the original's current files" in mark.files
        assert files(Path(fork.workspace)) == {"a.txt": "three\n", "b.txt": "two\n"}


def test_checkpoints_outlive_the_program_and_a_git_repository_is_left_as_it_was(
        tmp_path, scripted):
    ws = tmp_path / "ws"
    ws.mkdir()
    git = ["git", "-C", str(ws), "-c", "user.name=t", "-c", "user.email=t@example.test"]
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    (ws / "a.txt").write_text("zero\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    head = (ws / ".git" / "HEAD").read_text()
    objects = sorted(p.name for p in (ws / ".git" / "objects").rglob("*"))
    _, llm = scripted(STEPS)
    home = tmp_path / "home"
    with Trouper(home=home) as t:
        original = t.start_session("write files", llm=llm, workspace=ws)
        assert original.wait(timeout=60) == AgentState.FINISHED
        at = outcome_seq(list(original.events()), 1)
    with Trouper(home=home) as t:  # every process of the first program is gone
        fork = t.fork(original.id, at_seq=at)
        forked = Path(fork.workspace)
        assert files(forked) == {"a.txt": "one\n"}
        status = subprocess.run(["git", "-C", str(forked), "status", "--porcelain"],
                                capture_output=True, text=True, check=True).stdout
        assert status == " M a.txt\n"  # the repository as it was, with the agent's change
    assert (ws / ".git" / "HEAD").read_text() == head  # the user's repository: untouched
    assert sorted(p.name for p in (ws / ".git" / "objects").rglob("*")) == objects


def test_a_running_session_can_be_forked_and_both_go_on(tmp_path, scripted):
    slow = {"tool": "run", "args": {"command": "touch started; sleep 1; echo x > slow.txt"}}
    _, llm = scripted([STEPS[0], slow, FINISH])
    ws = tmp_path / "ws"
    with Trouper(home=tmp_path / "home") as t:
        original = t.start_session("slowly", llm=llm, workspace=ws)
        wait_until(lambda: (ws / "started").exists(), 60, "the slow command")
        fork = t.fork(original.id)  # at its last event: the slow command in flight
        assert original.wait(timeout=60) == AgentState.FINISHED
        assert fork.info().state == AgentState.PAUSED
        assert files(Path(fork.workspace)) == {"a.txt": "one\n"}  # after the first action
        in_flight = [e for e in fork.events() if isinstance(e, ObservationEvent)]
        assert in_flight[-1].outcome.content == NOT_RUN_FORKED
        assert (ws / "slow.txt").exists() and not (Path(fork.workspace) / "slow.txt").exists()


def test_a_fork_through_the_daemon_by_http_and_by_its_client(tmp_path, scripted):
    from trouper.testing.daemon import running_daemon

    _, llm = scripted(STEPS)
    with running_daemon(tmp_path / "dhome") as daemon:
        client = daemon.client()
        original = client.start_session("write files", llm=llm, workspace=tmp_path / "ws")
        assert original.wait(timeout=60) == AgentState.FINISHED
        at = outcome_seq(list(original.events()), 2)
        http = daemon.http()
        answer = http.post(f"/v1/sessions/{original.id}/fork", json={"at_seq": at})
        assert answer.status_code == 201, answer.text
        made = answer.json()
        assert made["session_id"] == made["id"] and made["state"] == "paused"
        assert files(Path(made["workspace"])) == {"a.txt": "one\n", "b.txt": "two\n"}
        refused = http.post(f"/v1/sessions/{original.id}/fork", json={"at_seq": 10_000})
        assert refused.status_code == 409 and "cannot fork at 10000" in refused.text
        _, again = scripted([*STEPS[:2], {"tool": "run", "args": {
            "command": "cat a.txt b.txt > c.txt"}}, FINISH])
        fork = client.fork(original.id, at, "join them", llm=again)
        assert fork.wait(timeout=60) == AgentState.FINISHED
        assert files(Path(fork.info().workspace))["c.txt"] == "one\ntwo\n"


def test_trouper_fork_waits_or_carries_on_with_a_hint(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from trouper.testing import FakeLLMServer, load_script

    def trouper(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "TROUPER_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
        return subprocess.run([sys.executable, "-m", "trouper", *args], env=env, text=True,
                              capture_output=True, timeout=120, stdin=subprocess.DEVNULL)

    script = tmp_path / "script.json"
    script.write_text(json.dumps(STEPS))
    with FakeLLMServer(load_script(script)) as server:
        first = trouper("run", "write files", "--model", "hosted_vllm/x", "--base-url",
                        server.url, "--api-key", "k", "--workspace", str(tmp_path / "ws"))
        assert first.returncode == 0, first.stdout + first.stderr
        original = trouper("sessions").stdout.split()[0]
        with Trouper(home=tmp_path / "home") as t:
            at = outcome_seq(list(t.session(original).events()), 2)
        waiting = trouper("fork", original, "--at", str(at))
        assert waiting.returncode == 0, waiting.stdout + waiting.stderr
        assert "after action" in waiting.stdout and "it waits" in waiting.stdout
        going = trouper("fork", original, "--at", str(at), "-m", "go on")
    assert going.returncode == 0, going.stdout + going.stderr
    assert "user: go on" in going.stdout and "state → finished" in going.stdout
    with Trouper(home=tmp_path / "home") as t:
        forks = [s for s in t.sessions() if s.id != original]
        states = sorted(s.state.value for s in forks)
        done = next(s for s in forks if s.state == AgentState.FINISHED)
        assert states == ["finished", "paused"]
        assert files(Path(t.session(done.id).workspace)) == {"a.txt": "three\n",
                                                             "b.txt": "two\n"}


def test_a_sessions_checkpoint_limits_reach_its_sandbox_and_a_fork_names_what_they_left(
        tmp_path, scripted):
    _, llm = scripted([
        {"tool": "run", "args": {"command": "head -c 5000 /dev/zero > big.bin; mkdir -p dist"
                                            " && echo x > dist/out.js; echo y > small.txt"}},
        FINISH])
    with Trouper(home=tmp_path / "home") as t:
        original = t.start_session("make files", llm=llm, workspace=tmp_path / "ws",
                                   checkpoints={"max_file_bytes": 1000, "ignore": ["dist"]})
        assert original.wait(timeout=60) == AgentState.FINISHED
        fork = t.fork(original.id, at_seq=outcome_seq(list(original.events()), 1))
        mark = next(e for e in fork.events() if isinstance(e, SessionForked))
        assert "left out: big.bin, dist" in mark.files
        assert files(Path(fork.workspace)) == {"small.txt": "y\n"}


def test_a_fork_of_a_fork_that_ran_takes_each_event_s_files_from_the_store_that_kept_them(
        tmp_path, scripted):
    _, llm = scripted(STEPS)
    with Trouper(home=tmp_path / "home") as t:
        original = t.start_session("write files", llm=llm, workspace=tmp_path / "ws",
                                   secrets={"TOKEN": "tok-5e6f7a8b9c0d"})
        assert original.wait(timeout=60) == AgentState.FINISHED
        first = outcome_seq(list(original.events()), 1)
        _, again = scripted([*STEPS[:3], {"tool": "write_file", "args": {
            "path": "a.txt", "content": "four\n"}}, FINISH])
        fork = t.fork(original.id, at_seq=outcome_seq(list(original.events()), 3),
                      message="once more, with tok-5e6f7a8b9c0d", llm=again)
        assert fork.wait(timeout=60) == AgentState.FINISHED
        assert files(Path(fork.workspace))["a.txt"] == "four\n"
        again_first = t.fork(fork.id, at_seq=first)  # an event the fork copied
        assert files(Path(again_first.workspace)) == {"a.txt": "one\n"}
        later = t.fork(fork.id)  # its own last change
        assert files(Path(later.workspace))["a.txt"] == "four\n"
        assert "tok-5e6f7a8b9c0d" not in "".join(e.model_dump_json() for e in fork.events())
        (tmp_path / "used").mkdir()
        (tmp_path / "used" / "mine.txt").write_text("keep\n")
        with pytest.raises(ConfigError, match="not an empty folder"):
            t.fork(fork.id, workspace=tmp_path / "used")
        assert (tmp_path / "used" / "mine.txt").read_text() == "keep\n"
