"""The Docker sandbox on a busybox image: the journal contract, the shell (state, the
three timeouts), file actions and their owner, container death, startup failures, gc."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from docker.errors import NotFound

from trouper.config.models import DockerRuntime
from trouper.config.settings import settings
from trouper.exceptions import RuntimeUnavailable
from trouper.messages.actions import ReadFile, RunCommand, WriteFile
from trouper.messages.causes import RuntimeFailure
from trouper.runtimes.docker import DockerSandbox
from trouper.runtimes.docker_seccomp import profile_json
from trouper.runtimes.docker_support import (
    LABEL_OWNER,
    LABEL_SESSION,
    gc_containers,
    list_containers,
    owner_of_home,
    session_keeper,
)
from trouper.testing import wait_until
from trouper.testing.runtime_contract import SandboxContract

pytestmark = [pytest.mark.slow, pytest.mark.docker]

IMAGE = "trouper-test-busybox:latest"
LIMITS = {"timeout_s": 30.0, "no_output_timeout_s": 20.0}


@pytest.fixture
def home(tmp_path: Path, docker_homes: Callable[[Path], Path]) -> Path:
    return docker_homes(tmp_path / "home")


@pytest.fixture
def make(home: Path, tmp_path: Path) -> Iterator[Callable[..., DockerSandbox]]:
    """``make(session_id="s-1", **config)``: a new (not started) DockerSandbox; every one
    is stopped at the end."""
    made: list[DockerSandbox] = []

    def new(session_id: str = "s-1", workspace: Path | None = None, env: Any = None,
            grace_s: float = 0.5, **config: Any) -> DockerSandbox:
        config.setdefault("image", IMAGE)
        sandbox = DockerSandbox(session_id, workspace or tmp_path / "ws",
                                home / "sessions" / session_id / "runtime", env=env,
                                config=DockerRuntime(**config), interrupt_grace_s=grace_s)
        made.append(sandbox)
        return sandbox

    yield new
    for sandbox in reversed(made):
        sandbox.stop()


class TestDockerSandboxContract(SandboxContract):
    @pytest.fixture
    def workspace(self, tmp_path: Path) -> Path:
        return tmp_path / "ws"

    @pytest.fixture
    def new_sandbox(self, make: Callable[..., DockerSandbox]) -> Callable[[], DockerSandbox]:
        return lambda: make("s-contract")


def run(sandbox: DockerSandbox, action_id: str, command: str, **limits: Any) -> Any:
    return sandbox.runtime.execute(action_id, RunCommand(command=command),
                                   **{**LIMITS, **limits})


def test_the_container_is_labelled_confined_and_never_runs_as_root(make, docker_client):
    sandbox = make(memory="256m", cpus=0.5, pids_limit=64)
    sandbox.start()
    container = docker_client.containers.get(sandbox.container_id)
    labels, host = container.labels, container.attrs["HostConfig"]
    assert labels[LABEL_SESSION] == "s-1" and labels[LABEL_OWNER] == sandbox.owner
    assert labels["trouper.epoch"] == "1"
    assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == [
        "no-new-privileges", f"seccomp={profile_json()}"]
    assert host["Init"] is True and host["NetworkMode"] == "none"
    assert (host["Memory"], host["NanoCpus"], host["PidsLimit"]) == (256 << 20, 5 * 10**8, 64)
    env = container.attrs["Config"].get("Env") or []
    assert not host.get("PortBindings") and [e for e in env if not e.startswith("PATH=")] == []
    mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
    assert set(mounts) == {"/workspace", "/.trouper"} and not mounts["/.trouper"]["RW"]
    assert "docker.sock" not in str(mounts)
    # you, or when trouper is root (the workspace is root's) the dedicated uid and gid
    ids = (os.getuid(), os.getgid()) if os.geteuid() else (settings().sandbox_uid,) * 2
    assert container.attrs["Config"]["User"] == f"{ids[0]}:{ids[1]}"
    outcome = run(sandbox, "a1", "id -u; id -g; touch made-here; pwd")
    assert outcome.content.split() == [str(ids[0]), str(ids[1]), "/workspace"]
    assert (sandbox.workspace / "made-here").stat().st_uid == ids[0]


def test_a_configured_user_owns_the_files_the_agent_makes(make, tmp_path):
    workspace = tmp_path / "shared"
    workspace.mkdir(mode=0o777)
    os.chmod(workspace, 0o777)
    sandbox = make(workspace=workspace, user="4321:4322")
    sandbox.start()
    assert run(sandbox, "a1", "id -u; touch mine").content.split() == ["4321"]
    info = (workspace / "mine").stat()
    assert (info.st_uid, info.st_gid) == (4321, 4322)


def test_shell_state_persists_and_secrets_reach_it_by_name_only(make, docker_client):
    sandbox = make(env={"MY_TOKEN": "tok-123-secret"})
    sandbox.start()
    run(sandbox, "a1", "mkdir -p sub && cd sub && export K=v && X=local")
    outcome = run(sandbox, "a2", 'echo "$PWD $K $X"; echo "$MY_TOKEN"')
    assert outcome.content.splitlines()[0] == "/workspace/sub v local"
    assert "tok-123-secret" not in outcome.content and "MY_TOKEN" in outcome.content
    container = docker_client.containers.get(sandbox.container_id)
    assert "tok-123-secret" not in str(container.attrs)
    long = "echo " + "x" * 20_000 + " | wc -c"  # longer than a tty line
    assert run(sandbox, "a3", long).content.strip() == "20001"
    quoted = run(sandbox, "a4", "printf '%s\\n' \"it's\" 'a \"b\"' $'x' \\\\")
    assert quoted.content.splitlines()[:2] == ["it's", 'a "b"']


def test_the_hard_timeout_interrupts_then_kills(make):
    sandbox = make(grace_s=0.5)
    sandbox.start()
    interrupted = run(sandbox, "a1", "echo go; sleep 30", timeout_s=1.0)
    assert interrupted.timed_out == "hard" and interrupted.exit_code == 130
    assert "Ctrl-C" in interrupted.content
    stubborn = run(sandbox, "a2", "(trap '' INT; echo go; sleep 30; echo never)", timeout_s=1.0)
    assert stubborn.timed_out == "hard" and "so it was killed" in stubborn.content
    assert stubborn.exit_code == 137 and "never" not in stubborn.content
    assert run(sandbox, "a3", "echo still here").content.strip() == "still here"


def test_the_no_output_timeout_hands_back_control_and_the_command_goes_on(make):
    sandbox = make()
    sandbox.start()
    soft = run(sandbox, "a1", "echo first; sleep 2; echo second", no_output_timeout_s=0.5)
    assert soft.timed_out == "soft" and soft.still_running and "first" in soft.content
    more = run(sandbox, "a2", "", no_output_timeout_s=10)
    assert "second" in more.content and not more.still_running
    interrupt = sandbox.runtime.execute("a3", RunCommand(command="", interrupt=True), **LIMITS)
    assert interrupt.status == "ok" and "nothing to interrupt" in interrupt.content


def test_file_actions_work_on_the_host_side_of_the_mount(make):
    sandbox = make()
    sandbox.start()
    wrote = sandbox.runtime.execute("w", WriteFile(path="/workspace/d/f.txt", content="hi\n"),
                                    **LIMITS)
    assert wrote.status == "ok" and "/workspace/d/f.txt" in wrote.content
    assert (sandbox.workspace / "d" / "f.txt").read_text() == "hi\n"
    assert run(sandbox, "r", "cat d/f.txt").content.strip() == "hi"
    read = sandbox.runtime.execute("r2", ReadFile(path="d/f.txt"), **LIMITS)
    assert read.content.split() == ["1", "hi"]
    outside = sandbox.runtime.execute("r3", ReadFile(path="/etc/passwd"), **LIMITS)
    assert outside.status == "error" and "outside the workspace /workspace" in outside.content
    assert str(sandbox.workspace) not in outside.content


def test_a_killed_container_leaves_the_action_unknown_and_is_replaced(make, docker_client):
    sandbox = make()
    sandbox.start()
    run(sandbox, "a1", "echo kept > kept.txt")
    first = sandbox.container_id
    errors: list[BaseException] = []

    def slow() -> None:
        try:
            run(sandbox, "a2", "touch started; sleep 30; echo late > late.txt")
        except BaseException as e:  # noqa: BLE001 - the server goes away under it
            errors.append(e)

    worker = threading.Thread(target=slow)
    worker.start()
    wait_until(lambda: (sandbox.workspace / "started").exists(), 20, "the command to start")
    docker_client.containers.get(first).kill()
    health = wait_until(lambda: (lambda h: h if not h.alive else None)(sandbox.alive()), 10,
                        "the death to be seen")
    assert health.cause == RuntimeFailure.EXITED and "exit code 137" in health.detail
    worker.join(30)
    assert not worker.is_alive() and errors and isinstance(errors[0], RuntimeUnavailable)
    again = make()  # a restarted proxy
    assert again.start() is False
    assert again.container_id != first
    assert again.runtime.resolve("a2").state == "unknown"
    assert again.runtime.resolve("a1").state == "finished"
    assert (sandbox.workspace / "kept.txt").read_text() == "kept\n"
    assert not (sandbox.workspace / "late.txt").exists()
    assert [c.id for c in list_containers(docker_client, [
        f"{LABEL_SESSION}=s-1", f"{LABEL_OWNER}={again.owner}"])] == [again.container_id]


def test_a_removed_container_is_seen_with_its_cause(make, docker_client):
    sandbox = make()
    sandbox.start()
    docker_client.containers.get(sandbox.container_id).remove(force=True)
    health = sandbox.alive()
    assert not health.alive and health.cause == RuntimeFailure.REMOVED


def test_an_image_that_is_nowhere_fails_with_the_cause(make):
    sandbox = make(image="trouper-test-no-such-image:never", start_timeout_s=20)
    with pytest.raises(RuntimeUnavailable, match="trouper-test-no-such-image:never"):
        sandbox.start()
    assert not sandbox.running()


def test_a_container_that_exits_at_once_fails_with_its_exit_code_and_log(make):
    sandbox = make(pids_limit=1)  # its init cannot even fork the keep-alive shell
    with pytest.raises(RuntimeUnavailable) as caught:
        sandbox.start()
    assert "exit code 1" in str(caught.value) and "fork failed" in str(caught.value)
    assert not sandbox.running()


def test_gc_removes_only_labelled_containers_of_finished_or_missing_sessions(
        home, docker_client):
    owner = owner_of_home(home)

    def container(labels: dict[str, str]) -> Any:
        return docker_client.containers.create(IMAGE, ["sh", "-c", "read _"], labels=labels)

    made = {
        "finished": container({LABEL_SESSION: "s-done", LABEL_OWNER: owner}),
        "missing": container({LABEL_SESSION: "s-gone", LABEL_OWNER: owner}),
        "running": container({LABEL_SESSION: "s-live", LABEL_OWNER: owner}),
        "kept": container({LABEL_SESSION: "s-kept", LABEL_OWNER: owner}),
        "other home": container({LABEL_SESSION: "s-done", LABEL_OWNER: "someone-else"}),
        "unlabelled": container({}),
    }
    try:
        keeper = session_keeper([("s-done", "finished", False), ("s-live", "running", False),
                                 ("s-kept", "stopped", True)])
        removed = gc_containers(home, keeper, docker_client)
        assert sorted(removed) == sorted([made["finished"].name, made["missing"].name])
        left = {row["Id"] for row in docker_client.api.containers(all=True)}
        assert {name for name, c in made.items() if c.id in left} == {
            "running", "kept", "other home", "unlabelled"}
    finally:
        for c in made.values():
            try:
                c.remove(force=True)
            except NotFound:
                pass
