"""A setting that can never work is never retried: the session ends in ERROR at once,
with the cause and the fix (``Why.RUNTIME_MISCONFIGURED``, no ``resumes_at``), or it is
refused at ``start_session`` where that can be seen first; a resume after the fix tries
again. A fault that can heal keeps its timed retries (a killed container, a restarted
runtime server: ``test_docker_sessions.py``, ``test_remote_sessions.py``).

The rules first (core, classifier, checks: no process; the proxy's, that it reports and
does not exit, in ``test_runtime_driver.py``), then whole sessions: a Docker image that
is missing or has no ``sh``, a runtime server that refuses the token or is not one, a
workspace gone bad before a restore, and ``trouper run`` on a missing image or a remote
runtime without a token.
"""

from __future__ import annotations

import errno
import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trouper.config.checks import runtime_problems
from trouper.core.effects import AskModel, RestartRuntime
from trouper.core.states import Why
from trouper.messages.events import AgentState, RuntimeEvent, StateChanged
from trouper.messages.protocol import RuntimeFailed, RuntimeFailure, RuntimeReady
from trouper.runtimes import misconfigured
from trouper.testing import kill_actor, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_core_session import answer, command, make, only  # noqa: E402

FINISH = {"tool": "finish", "args": {"message": "done"}}
MISSING_IMAGE = "trouper-test-no-such-image:latest"
CLI_MISSING_IMAGE = "trouper-test-no-such-image:cli"  # never made: the tests run at once
NO_SH_IMAGE = "trouper-test-no-sh:latest"
TEST_IMAGE = "trouper-test-busybox:latest"


def misconfigured_changes(session: Any) -> list[StateChanged]:
    return [e for e in session.events() if isinstance(e, StateChanged)
            and e.cause == Why.RUNTIME_MISCONFIGURED]


def starts(session: Any) -> int:
    """How many times a sandbox start was begun (docker: its image was looked for)."""
    return sum(1 for e in session.events() if isinstance(e, RuntimeEvent)
               and e.phase == "starting" and e.detail.startswith("image: looking"))


def ended_misconfigured(session: Any, timeout_s: float = 60) -> StateChanged:
    """The session's settled ERROR: one change, no timer, recorded with its cause."""
    assert session.wait(timeout=timeout_s) == AgentState.ERROR, session.record.state_reason
    change, = misconfigured_changes(session)
    assert change.state == AgentState.ERROR and change.resumes_at is None
    assert change.settled
    return change


# -- the rules ------------------------------------------------------------------------------


def test_the_core_waits_in_error_for_the_user_and_a_resume_starts_a_fresh_sandbox():
    core, clock = make()
    core.begin(clock.now)
    failed = RuntimeFailed(session_id="s-1", epoch=0, cause=RuntimeFailure.MISCONFIGURED,
                           detail="image 'x' is missing: build it")
    core.handle(failed, clock.tick())
    assert (core.view.state, core.view.resumes_at) == (AgentState.ERROR, None)
    assert "image 'x' is missing: build it" in core.view.reason
    change = [e for e in core.recorded if isinstance(e, StateChanged)][-1]
    assert change.cause == Why.RUNTIME_MISCONFIGURED and change.settled
    seen = len(core.recorded)
    assert core.handle(failed, clock.tick()) == []  # told again (a restarted Controller)
    assert len(core.recorded) == seen
    reply, effects = command(core, clock, "resume")
    assert reply.error is None and only(effects, RestartRuntime)
    assert core.view.state == AgentState.RUNNING


def test_a_message_after_a_misconfigured_restart_starts_a_fresh_sandbox_for_its_action():
    core, clock = make()
    core.begin(clock.now)
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=1, attached=False), clock.tick())
    ask = only(effects, AskModel)
    answer(core, ask, clock, content="what next?")
    assert core.view.state == AgentState.AWAITING_USER_INPUT
    core.handle(RuntimeFailed(session_id="s-1", epoch=2, cause=RuntimeFailure.MISCONFIGURED,
                              detail="the workspace /w cannot be used"), clock.tick())
    assert core.view.state == AgentState.AWAITING_USER_INPUT  # settled: only the user moves it
    _, effects = command(core, clock, "send", "go on")
    assert core.view.state == AgentState.RUNNING
    only(effects, RestartRuntime)  # else it would wait for a sandbox nothing restarts
    assert not [e for e in effects if isinstance(e, AskModel)]  # not before it is up
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=3, attached=False), clock.tick())
    only(effects, AskModel)


@pytest.mark.parametrize(("code", "healable"), [
    (errno.EACCES, False), (errno.EEXIST, False), (errno.ENOTDIR, False), (errno.EROFS, False),
    (errno.ENOSPC, True), (errno.EIO, True)])
def test_a_workspace_error_is_a_misconfiguration_unless_it_may_pass(code, healable):
    error = OSError(code, os.strerror(code), "/w")
    found = misconfigured.workspace_unusable(Path("/w"), error)
    assert (found is None) == healable
    if found is not None:
        assert "/w" in str(found) and "--workspace" in str(found)


@pytest.mark.parametrize(("said", "words"), [
    ('OCI runtime create failed: exec: "sh": executable file not found in $PATH: unknown',
     "has no sh"),
    ("exec /bin/sh: exec format error", "another platform"),
    ("invalid mount config for type \"bind\": bind source path does not exist: /w",
     "cannot mount the workspace"),
    ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock", None),
    ("500 Server Error: Internal Server Error (\"context deadline exceeded\")", None),
])
def test_what_the_engine_says_tells_a_misconfiguration_from_a_fault(said, words):
    found = misconfigured.container_refused("img", RuntimeError(said))
    assert (found is None) == (words is None)
    if found is not None:
        assert words in str(found)


def test_start_session_refuses_a_runtime_this_machine_cannot_run(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker CLI there
    (field, reason), = runtime_problems({"kind": "docker", "image": TEST_IMAGE})
    assert field == "runtime" and "docker CLI" in reason and "local runtime" in reason
    monkeypatch.delenv("TROUPER_RUNTIME_TOKEN", raising=False)
    (field, reason), = runtime_problems({"kind": "remote", "url": "http://127.0.0.1:1"})
    assert field == "runtime.remote.token" and "$TROUPER_RUNTIME_TOKEN" in reason
    monkeypatch.setenv("TROUPER_RUNTIME_TOKEN", "t" * 32)
    assert runtime_problems({"kind": "remote", "url": "http://127.0.0.1:1"}) == []


# -- whole sessions: Docker -------------------------------------------------------------------


@pytest.fixture
def docker_trouper(tmp_path: Path, docker_homes: Callable[[Path], Path]) -> Iterator[Any]:
    from trouper import Trouper

    with Trouper(home=docker_homes(tmp_path / "home")) as t:
        yield t


@pytest.fixture
def no_sh_image(docker_client: Any) -> Iterator[str]:
    """An image holding one file and no shell (``docker import`` of a tar)."""
    data, tar = io.BytesIO(), io.BytesIO()
    data.write(b"hello\n")
    with tarfile.open(fileobj=tar, mode="w") as archive:
        info = tarfile.TarInfo("hello.txt")
        info.size = data.tell()
        archive.addfile(info, io.BytesIO(data.getvalue()))
    subprocess.run(["docker", "import", "-", NO_SH_IMAGE], input=tar.getvalue(), check=True,
                   capture_output=True, timeout=60)
    try:
        yield NO_SH_IMAGE
    finally:
        docker_client.images.remove(NO_SH_IMAGE, force=True)


@pytest.mark.slow
@pytest.mark.docker
def test_a_missing_image_ends_in_error_at_once_and_a_resume_after_the_fix_runs(
        docker_trouper, docker_client, scripted, tmp_path):
    from trouper.config.models import DockerRuntime

    _, llm = scripted([FINISH])
    session = docker_trouper.start_session(
        "t", llm=llm, runtime=DockerRuntime(image=MISSING_IMAGE), workspace=tmp_path / "ws")
    change = ended_misconfigured(session)
    assert f"image {MISSING_IMAGE!r} is not on this machine and cannot be pulled" in (
        change.reason)
    assert f"docker build -t {MISSING_IMAGE}" in change.reason and "--image" in change.reason
    assert "resume" in change.reason
    failed, = [e for e in session.events() if isinstance(e, RuntimeEvent)
               and e.phase == "failed"]
    assert "cannot be pulled" in failed.detail
    kill_actor(session, "controller")  # its successor is told the sandbox waits for a fix
    docker_client.images.get(TEST_IMAGE).tag(MISSING_IMAGE)  # the user's fix
    try:
        session.resume()
        assert session.wait(timeout=120) == AgentState.FINISHED
    finally:
        docker_client.images.remove(MISSING_IMAGE)
    assert starts(session) == 2  # the failed one, never retried by itself; the resumed one
    assert len(misconfigured_changes(session)) == 1


@pytest.mark.slow
@pytest.mark.docker
def test_a_program_opening_its_home_tries_a_misconfigured_session_once_and_it_waits(
        tmp_path, docker_homes, docker_client, scripted):
    from trouper import Trouper
    from trouper.config.models import DockerRuntime

    home = docker_homes(tmp_path / "home")
    _, llm = scripted([FINISH])
    with Trouper(home=home) as t:
        session = t.start_session("t", llm=llm, runtime=DockerRuntime(image=MISSING_IMAGE),
                                  workspace=tmp_path / "ws")
        first = ended_misconfigured(session)
        session_id = session.id
    with Trouper(home=home) as t:  # resume=True: it carries on its unsettled sessions
        session = t.session(session_id)
        log = home / "logs" / "trouper.log"
        wait_until(lambda: log.read_text().count("cannot work as configured") >= 2, 60,
                   "the restored session's sandbox start to fail")
        wait_until(lambda: starts(session) == 2, 60, "its start's progress in the log")
        assert session.wait(timeout=60) == AgentState.ERROR
        assert misconfigured_changes(session) == [first]  # nothing new to say: it waits
        assert [e.phase for e in session.events() if isinstance(e, RuntimeEvent)
                and e.phase != "starting"] == ["failed"]
        assert session.info().reason == first.reason


@pytest.mark.slow
@pytest.mark.docker
def test_an_image_name_the_engine_refuses_ends_in_error_at_once(docker_trouper, scripted,
                                                                tmp_path):
    from trouper.config.models import DockerRuntime

    _, llm = scripted([FINISH])
    session = docker_trouper.start_session(
        "t", llm=llm, runtime=DockerRuntime(image="Not/Lower:Case"), workspace=tmp_path / "ws")
    change = ended_misconfigured(session)
    assert "image 'Not/Lower:Case' is not a name the Docker engine accepts" in change.reason
    assert "invalid reference format" in change.reason and "--image" in change.reason


@pytest.mark.slow
@pytest.mark.docker
def test_an_image_without_sh_ends_in_error_naming_the_fix(docker_trouper, no_sh_image,
                                                          scripted, tmp_path, docker_client):
    from trouper.config.models import DockerRuntime
    from trouper.runtimes.docker_support import LABEL_SESSION, list_containers

    _, llm = scripted([FINISH])
    session = docker_trouper.start_session(
        "t", llm=llm, runtime=DockerRuntime(image=no_sh_image), workspace=tmp_path / "ws")
    change = ended_misconfigured(session)
    assert f"image {no_sh_image!r} has no sh" in change.reason
    assert "choose an image with a POSIX shell" in change.reason
    session.stop()
    assert session.wait(timeout=60) == AgentState.STOPPED
    assert starts(session) == 1
    assert list_containers(docker_client, [f"{LABEL_SESSION}={session.id}"]) == []


@pytest.mark.slow
@pytest.mark.docker
def test_trouper_run_on_a_missing_image_exits_at_once_naming_the_fix(tmp_path, docker_client,
                                                                     docker_homes):
    from accel import forkserver

    home = docker_homes(tmp_path / "home")
    script = tmp_path / "script.json"
    script.write_text(json.dumps([FINISH]))
    env = {**os.environ, "TROUPER_HOME": str(home), "COLUMNS": "300"}
    done = forkserver.run(
        [sys.executable, "-m", "trouper", "run", "x", "--script", str(script), "--runtime",
         "docker", "--image", CLI_MISSING_IMAGE, "--workspace", str(tmp_path / "ws"),
         "--timeout", "300"],
        env=env, text=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    out = " ".join((done.stdout + done.stderr).split())  # any wrap undone
    assert done.returncode == 1, out
    assert "state error" in out and f"docker build -t {CLI_MISSING_IMAGE}" in out, out
    assert "trying again in" not in out, out
    assert "trouper resume" in out, out


@pytest.mark.slow
def test_trouper_run_refuses_a_remote_runtime_without_a_token_as_a_usage_error(tmp_path):
    from accel import forkserver

    script = tmp_path / "script.json"
    script.write_text(json.dumps([FINISH]))
    env = {k: v for k, v in os.environ.items() if k != "TROUPER_RUNTIME_TOKEN"}
    done = forkserver.run(
        [sys.executable, "-m", "trouper", "run", "x", "--script", str(script), "--runtime",
         "remote", "--url", "http://127.0.0.1:9"],
        env={**env, "TROUPER_HOME": str(tmp_path / "home"), "COLUMNS": "300"}, text=True,
        capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("trouper: error: runtime.remote.token: no token"), line
    assert "$TROUPER_RUNTIME_TOKEN" in line and "--token-file" in line


# -- whole sessions: the remote runtime and the workspace --------------------------------------


@pytest.mark.slow
def test_a_runtime_server_that_refuses_the_token_ends_in_error_at_once(
        trouper, scripted, remote_server, tmp_path):
    server = remote_server()
    _, llm = scripted([FINISH])
    runtime = server.runtime(token="w" * 40, ready_timeout_s=600)  # a wait would be long
    session = trouper.start_session("t", llm=llm, runtime=runtime, workspace=tmp_path / "w")
    change = ended_misconfigured(session)
    assert f"the runtime server at {server.url} refused the token" in change.reason
    assert "--token-file" in change.reason and "$TROUPER_RUNTIME_TOKEN" in change.reason
    assert "w" * 40 not in str(list(session.events()))


class NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_error(404)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def not_a_runtime_server() -> Iterator[str]:
    """A web server on loopback that is not a runtime server: 404 for everything."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.slow
def test_an_address_where_no_runtime_server_answers_ends_in_error_at_once(
        trouper, scripted, not_a_runtime_server, tmp_path):
    _, llm = scripted([FINISH])
    runtime = {"kind": "remote", "url": not_a_runtime_server, "token": "t" * 32,
               "ready_timeout_s": 600}
    session = trouper.start_session("t", llm=llm, runtime=runtime, workspace=tmp_path / "w")
    change = ended_misconfigured(session)
    assert f"{not_a_runtime_server} is not a trouper runtime server" in change.reason
    assert "answered 404" in change.reason, change.reason
    assert "check --url" in change.reason


@pytest.mark.slow
def test_a_workspace_replaced_by_a_file_ends_the_restored_session_in_error(
        scripted, tmp_path):
    from trouper import Trouper

    _, llm = scripted([{"say": "what next?"}, FINISH])
    workspace = tmp_path / "ws"
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("t", llm=llm, workspace=workspace)
        assert session.wait(timeout=60) == AgentState.AWAITING_USER_INPUT
        session_id = session.id
    workspace.rename(tmp_path / "moved")
    workspace.write_text("not a folder\n")
    with Trouper(home=tmp_path / "home") as t:
        session = t.session(session_id)
        session.send("go on")
        wait_until(lambda: misconfigured_changes(session), 60, "the misconfiguration")
        change = ended_misconfigured(session)
        assert f"the workspace {workspace} exists and is not a folder" in change.reason
        assert "--workspace" in change.reason


# -- the test suite's own skips --------------------------------------------------------------


def test_a_docker_test_that_skips_says_how_to_stop_skipping(monkeypatch, tmp_path):
    import conftest

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("TROUPER_REQUIRE_DOCKER", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        conftest.docker_client_or_skip()
    assert "no Docker engine" in str(skipped.value)
    assert "bash scripts/docker-engine start" in str(skipped.value)
    monkeypatch.setenv("TROUPER_REQUIRE_DOCKER", "1")  # CI: it fails instead, saying the same
    with pytest.raises(pytest.fail.Exception, match="bash scripts/docker-engine start"):
        conftest.docker_client_or_skip()
