"""I7 (docs/promises.md) for Docker: a session whose commands use a secret (revealed into the
command just before it reaches the sandbox) leaves the value in no file but secrets.json,
while its container still runs and after trouper closed. Every byte under the home is
read (database, WAL and SHM, logs, the sandbox's state and its shell's input folder, the
default workspace), as in tests/test_secrets_home.py, whose search this reuses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from trouper import AgentState, ObservationEvent, Trouper
from trouper.config.models import DockerRuntime
from trouper.testing import FakeLLMServer, load_script

sys.path.insert(0, str(Path(__file__).parent))  # the grep of test_secrets_home
from test_home_private import _readable_by_others  # noqa: E402
from test_secrets_home import API_KEY, FANCY, PLAIN, leaks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.docker]

RUNTIME = DockerRuntime(image="trouper-test-busybox:latest")
STEPS = [
    {"tool": "run", "args": {"command": "printf %s '<secret:PLAIN>' | wc -c"}},
    {"tool": "run", "args": {"command": "printf %s '<secret:FANCY>' | wc -c; echo used"}},
    {"tool": "finish", "args": {"message": "done"}},
]
"""The last command before the finish carries a revealed secret: a command file would still
be on disk when the session has finished."""


def test_a_docker_sessions_revealed_secret_rests_in_no_file(tmp_path, docker_homes,
                                                            docker_client):
    home = docker_homes(tmp_path / "home")
    server = FakeLLMServer(load_script(STEPS)).start()
    llm = {"model": "hosted_vllm/scripted", "base_url": server.url, "api_key": API_KEY}
    umask = os.umask(0)  # owner-only whatever the umask: the input folder and FIFO too
    try:
        with Trouper(home=home) as t:
            session = t.start_session("use the secrets", llm=llm, runtime=RUNTIME,
                                      secrets={"FANCY": FANCY, "PLAIN": PLAIN})
            assert session.wait(timeout=120) == AgentState.FINISHED, session.record.state_reason
            got = [e.outcome.content.split() for e in session.events()
                   if isinstance(e, ObservationEvent)]
            assert got[:2] == [[str(len(PLAIN))], [str(len(FANCY.encode())), "used"]]
            io_dir = home / "sessions" / session.id / "runtime" / "io"
            assert any(p.name.startswith("in-") for p in io_dir.iterdir())  # its shell lives
            found, sources = leaks(home, session.id)
            assert found == []
            runtime = str(home / "sessions" / session.id / "runtime")
            assert any(name.startswith(runtime) for name in sources)  # the journal, read
            assert _readable_by_others(home) == []
        found, _ = leaks(home, session.id)
        assert found == []
        assert _readable_by_others(home) == []
    finally:
        os.umask(umask)
        server.stop()
