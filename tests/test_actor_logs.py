"""What an actor logs reaches ``<home>/logs/trouper.log``, whatever the program logged
before it opened the Trouper."""

from __future__ import annotations

import logging
import socket

import pytest

from trouper import Trouper
from trouper.testing import wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it


def test_a_logger_the_program_asked_before_still_logs_in_the_actors(scripted, tmp_path):
    """Python caches a logger's "is INFO enabled?" answer; a program whose root logger is
    at WARNING cached "no" for a trouper logger it used, its actors inherited that answer
    through the fork, and the actor's INFO lines on that logger were dropped unseen (a
    proxy's "waiting for the runtime server" line, in a loaded test run)."""
    remote = logging.getLogger("trouper.runtimes.remote")
    assert logging.getLogger().level >= logging.WARNING  # the program's root, as by default
    assert not remote.isEnabledFor(logging.INFO)  # asked, and cached, here
    held = socket.socket()  # bound, never listening: refused, the proxy waits and says so
    held.bind(("127.0.0.1", 0))
    runtime = {"kind": "remote", "url": f"http://127.0.0.1:{held.getsockname()[1]}",
               "token": "t" * 32, "ready_timeout_s": 600}
    _, llm = scripted([{"tool": "finish", "args": {"message": "done"}}])
    try:
        with Trouper(home=tmp_path / "home") as t:
            t.start_session("t", llm=llm, runtime=runtime, workspace=tmp_path / "local")
            log = tmp_path / "home" / "logs" / "trouper.log"
            wait_until(lambda: "to answer healthy" in log.read_text(), 30,
                       "the proxy's INFO line on trouper.runtimes.remote")
    finally:
        held.close()
