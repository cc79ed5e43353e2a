"""``trouper sessions`` and ``trouper events`` without a daemon: read through the
``StoreReader`` (a ``TrouperClient`` over the store alone), so they load no actor system
and no litellm, and ``events --follow`` ends on a signal with its code, as following a
session in ``run`` does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trouper.config.models import LLMConfig, SessionConfig
from trouper.home.paths import Home
from trouper.messages.events import AgentState, MessageEvent, StateChanged
from trouper.store import open_store

from accel import forkserver

pytestmark = pytest.mark.slow  # runs the CLI as processes


def stored_session(home: Path, state: AgentState) -> str:
    """A session in ``home``'s store whose log ends in ``state`` (nothing drives it)."""
    store = open_store(Home.at(home))
    try:
        config = SessionConfig(task="stored", workspace=str(home / "ws"),
                               llm=LLMConfig(model="hosted_vllm/x"))
        store.create_session("s-stored", config)
        store.append("s-stored", [MessageEvent(source="user", text="hello"),
                                  StateChanged(state=state)])
    finally:
        store.close()
    return "s-stored"


def test_reading_commands_load_no_actor_system_and_no_litellm(tmp_path):
    """A fresh interpreter (the suite's zygote has litellm loaded already)."""
    session_id = stored_session(tmp_path / "home", AgentState.FINISHED)
    probe = textwrap.dedent(f"""
        import json, sys
        from click.testing import CliRunner
        from trouper.cli.main import main
        runner = CliRunner()
        codes = [runner.invoke(main, args).exit_code for args in (
            ["sessions", "--json"], ["sessions", "--state", "finished"],
            ["events", "{session_id}", "--json"], ["events", "{session_id}", "--follow"])]
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("thespian", "litellm")
                       or m in ("trouper.client.embedded", "trouper.client.actor_system"))
        print(json.dumps({{"codes": codes, "heavy": heavy}}))
    """)
    env = {**os.environ, "TROUPER_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == {"codes": [0, 0, 0, 0], "heavy": []}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_events_follow_ends_on_a_signal_with_its_code(tmp_path, signum):
    """The session runs on (nothing here drives it): only the signal ends the following."""
    session_id = stored_session(tmp_path / "home", AgentState.RUNNING)
    env = {**os.environ, "TROUPER_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    follower = forkserver.Popen(
        [sys.executable, "-m", "trouper", "events", session_id, "--follow", "--json"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert follower.stdout is not None
        seqs = [json.loads(follower.stdout.readline())["seq"] for _ in range(2)]
        assert seqs == [1, 2]  # the log so far: it follows now
        follower.send_signal(signum)
        _, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(10)
    assert follower.returncode == 128 + signum, err
    assert "Traceback" not in err
