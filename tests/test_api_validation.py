"""Bad input to the Python API is refused at once, names the field, and creates nothing."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState, ConfigError, Trouper, UnknownSession
from trouper.client.session import Session

LLM = {"model": "hosted_vllm/scripted", "base_url": "http://127.0.0.1:9/v1", "api_key": "k"}
"""Never called: every session below is refused before it could be."""
SECRET = "s3cret-value-8812"
REFUSAL_S = 1.0
"""A refusal touches no network and no actor: well under this."""


def tree(root: Path) -> set[str]:
    """Every path under ``root``, but the shared actors' logs and pid files, which they
    write when they please (the broker publishes its pid once it has booted)."""
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.relative_to(root).parts[:1] not in {("logs",), ("actors",)}}


@pytest.fixture
def refused(trouper: Trouper, trouper_home: Path, tmp_path: Path
            ) -> Callable[..., ConfigError]:
    """``refused(task, **kwargs)``: start_session must raise ConfigError within
    REFUSAL_S and leave the home, ``tmp_path`` and the store as they were."""

    def attempt(task: str = "t", **kwargs: Any) -> ConfigError:
        kwargs.setdefault("llm", LLM)
        before = (tree(trouper_home), tree(tmp_path), len(trouper.sessions()))
        started = time.monotonic()
        with pytest.raises(ConfigError) as caught:
            trouper.start_session(task, **kwargs)
        assert time.monotonic() - started < REFUSAL_S
        assert (tree(trouper_home), tree(tmp_path), len(trouper.sessions())) == before
        return caught.value

    return attempt


@pytest.mark.parametrize("task", ["", "   ", "\n\t "])
def test_an_empty_task(refused, task):
    error = refused(task)
    assert error.field == "task" and str(error) == "task: must not be empty"


@pytest.mark.parametrize("option, value", [
    ("max_iterations", 0), ("max_iterations", -3), ("max_cost_usd", 0.0),
    ("command_timeout_s", 0), ("no_output_timeout_s", -1.0), ("max_output_chars", 0),
    ("max_consecutive_timeouts", -1),
])
def test_a_limit_that_is_not_positive(refused, option, value):
    error = refused(**{option: value})
    assert error.field == option and "must be greater than" in str(error)


@pytest.mark.parametrize("field, value", [
    ("timeout_s", 0), ("num_retries", -1), ("max_output_tokens", 0), ("rpm", 0),
    ("retry_total_s", -5),
])
def test_an_llm_limit_that_is_not_positive(refused, field, value):
    error = refused(llm={**LLM, field: value})
    assert error.field == f"llm.{field}" and "must be greater than" in str(error)


def test_several_problems_are_named_at_once(refused):
    error = refused(" ", max_iterations=0, command_timeout_s=-1)
    assert error.field == "task"
    assert all(name in str(error) for name in ("task:", "max_iterations:",
                                               "command_timeout_s:"))


@pytest.mark.parametrize("url", ["http://user:pw-8812@127.0.0.1:9/v1",
                                 "https://tok-8812@proxy.example.test/v1"])
def test_credentials_in_a_base_url_are_refused_unechoed(refused, url):
    """The base URL is stored with the session: a key in it would be a secret in the log."""
    error = refused(llm={**LLM, "base_url": url})
    assert error.field == "llm.base_url" and "must not carry credentials" in str(error)
    assert "8812" not in str(error)


def test_credentials_in_a_remote_runtime_url_are_refused_unechoed(refused):
    error = refused(runtime={"kind": "remote", "url": "https://me:pw-8812@box.test:8800",
                             "token": "t" * 32})
    assert error.field == "runtime.remote.url" and "must not carry credentials" in str(error)
    assert "8812" not in str(error)


def test_an_unknown_option_suggests_the_close_one(refused):
    error = refused(max_iteration=5)
    assert error.field == "max_iteration"
    assert "unknown option" in str(error) and "did you mean max_iterations?" in str(error)


def test_an_unknown_llm_field_suggests_the_close_one(refused):
    error = refused(llm={"modle": "hosted_vllm/x"})
    assert "llm.modle: unknown field; did you mean model?" in str(error)
    assert "llm.model: is required" in str(error)


def test_an_unknown_runtime_lists_the_known_ones(refused):
    error = refused(runtime="kubernetes")
    assert error.field == "runtime"
    assert "unknown runtime 'kubernetes'" in str(error)
    assert "known runtimes: docker, local, remote" in str(error)


def test_a_docker_runtime_by_name_alone_needs_its_image(refused):
    error = refused(runtime="docker")
    assert error.field == "runtime.docker.image" and "is required" in str(error)


@pytest.mark.parametrize("runtime", [{"kind": "docker", "image": "debian"},
                                     {"kind": "docker", "image": "debian", "network": "bridge",
                                      "user": "1000:1000", "keep": True}])
def test_a_docker_runtime_with_an_image_is_accepted(runtime, tmp_path):
    from trouper.config.checks import runtime_problems, session_config
    from trouper.config.models import DockerRuntime

    assert runtime_problems(runtime) == []
    assert runtime_problems(DockerRuntime(image="x")) == []
    config = session_config("t", LLM, runtime, tmp_path, {}, {})
    assert config.runtime == DockerRuntime(**runtime)
    assert config.runtime.network == runtime.get("network", "none")


def test_the_remote_runtime_is_accepted_and_its_url_checked(refused, tmp_path):
    from trouper.config.checks import session_config
    from trouper.config.models import RemoteRuntime

    runtime = {"kind": "remote", "url": "http://127.0.0.1:9", "token": SECRET}
    config = session_config("t", LLM, runtime, tmp_path, {}, {})
    assert isinstance(config.runtime, RemoteRuntime)
    assert config.runtime.token.get_secret_value() == SECRET
    error = refused(runtime={"kind": "remote", "url": "127.0.0.1:9", "token": SECRET})
    assert error.field == "runtime.remote.url" and "http" in str(error)
    assert SECRET not in str(error)


def test_the_runtime_is_stored_typed_and_read_by_name_too():
    from trouper.config.models import LocalRuntime, SessionConfig

    named = SessionConfig(task="t", llm={"model": "m"}, workspace="/w", runtime="local")
    assert named.runtime == LocalRuntime()
    assert SessionConfig.model_validate_json(named.model_dump_json()).runtime == LocalRuntime()
    assert '"runtime":{"kind":"local","confine":true,' in named.model_dump_json()


@pytest.mark.parametrize("llm, field", [
    ({}, "llm.model"), ({"model": "  "}, "llm.model"), ("openai/gpt-4o", "llm"),
    ({**LLM, "model": "no-such-provider-model"}, "llm.model"),
    ({**LLM, "base_url": "127.0.0.1:9/v1"}, "llm.base_url"),
    ({**LLM, "fallbacks": ["hosted_vllm/b", ""]}, "llm.fallbacks.1"),
])
def test_an_llm_config_without_a_usable_model(refused, llm, field):
    assert refused(llm=llm).field == field


def test_a_workspace_that_is_a_file(refused, tmp_path):
    (tmp_path / "file").write_text("x")
    error = refused(workspace=tmp_path / "file")
    assert error.field == "workspace" and "is not a folder" in str(error)


@pytest.mark.parametrize("where", ["the home", "its parent"])
def test_a_workspace_that_holds_the_trouper_home_is_refused(refused, trouper_home, where):
    """The agent's shell and file tools would reach every session's secrets.json."""
    workspace = trouper_home if where == "the home" else trouper_home.parent
    error = refused(workspace=workspace)
    assert error.field == "workspace" and "holds the trouper home" in str(error)


def test_a_workspace_whose_parent_is_missing_names_it_and_makes_nothing(refused, tmp_path):
    workspace = tmp_path / "missing" / "deeper" / "ws"
    error = refused(workspace=workspace)
    assert error.field == "workspace"
    assert f"{tmp_path / 'missing' / 'deeper'} does not exist" in str(error)
    assert not (tmp_path / "missing").exists()


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody may write: a read-only tmpfs as root (who ignores modes), else a
    folder without the write bit."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs",
                              str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"root, and cannot mount a read-only tmpfs: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.parametrize("inside", [False, True])
def test_a_workspace_that_is_not_writable(refused, read_only_dir, inside):
    workspace = read_only_dir / "ws" if inside else read_only_dir
    error = refused(workspace=workspace)
    assert error.field == "workspace" and "is not writable" in str(error)


@pytest.mark.parametrize("name", ["A-B", "", "1ABC", "X=Y"])
def test_a_secret_name_that_is_no_variable_name(refused, name):
    error = refused(secrets={name: SECRET})
    assert error.field == f"secrets[{name!r}]" and "environment variable name" in str(error)
    assert SECRET not in str(error)


@pytest.mark.parametrize("value", [12345678, "has a \0 NUL " + SECRET])
def test_a_secret_value_that_is_no_variable_value_is_not_echoed(refused, value):
    error = refused(secrets={"TOKEN": value})
    assert error.field == "secrets.TOKEN"
    assert SECRET not in str(error) and "12345678" not in str(error)


def test_refusals_stay_masked(refused):
    error = refused(secrets={"TOKEN": SECRET}, runtime=SECRET)
    assert SECRET not in str(error) and "<secret:TOKEN>" in str(error)
    key_error = refused(llm={**LLM, "api_key": SECRET}, runtime=SECRET)
    assert SECRET not in str(key_error) and "<secret:LLM_API_KEY>" in str(key_error)


def test_secret_names_cannot_be_set_as_an_option(refused):
    assert refused(secret_names=("A",)).field == "secret_names"


def test_a_named_workspace_is_made_without_parents(trouper, scripted, tmp_path):
    _, llm = scripted([{"tool": "finish", "args": {"message": "done"}}])
    session = trouper.start_session("t", llm=llm, workspace=tmp_path / "new")
    assert (tmp_path / "new").is_dir()
    assert session.wait(timeout=60) == AgentState.FINISHED


@pytest.mark.parametrize("call", [
    lambda s: s.send("hi"), lambda s: s.pause(), lambda s: s.resume(), lambda s: s.stop(),
    lambda s: s.events(), lambda s: s.events(follow=True), lambda s: s.wait(timeout=5),
    lambda s: s.view(), lambda s: s.record, lambda s: s.state, lambda s: s.workspace,
])
def test_every_session_method_on_an_unknown_id_raises_unknown_session(trouper, call):
    started = time.monotonic()
    with pytest.raises(UnknownSession, match="s-nope"):
        call(Session(trouper, "s-nope"))
    assert time.monotonic() - started < 5.0


def test_trouper_session_on_an_unknown_id(trouper):
    with pytest.raises(UnknownSession, match="s-nope"):
        trouper.session("s-nope")


def test_a_home_that_is_a_file_is_refused_and_nothing_made(tmp_path):
    (tmp_path / "home").write_text("not a folder")
    with pytest.raises(ConfigError, match="home: .* is not a folder") as caught:
        Trouper(home=tmp_path / "home")
    assert caught.value.field == "home" and tree(tmp_path) == {"home"}


def test_a_non_positive_ask_timeout_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="ask_timeout_s") as caught:
        Trouper(home=tmp_path / "home", ask_timeout_s=0)
    assert caught.value.field == "ask_timeout_s" and tree(tmp_path) == set()


@pytest.mark.parametrize("network", ["host", "container:abc"])
def test_a_docker_network_that_reaches_loopback_is_refused(network):
    from pydantic import ValidationError

    from trouper.config.models import DockerRuntime

    with pytest.raises(ValidationError, match="loopback"):
        DockerRuntime(image="busybox", network=network)
    assert DockerRuntime(image="busybox").network == "none"


def test_a_remote_runtime_url_needs_a_scheme():
    from pydantic import ValidationError

    from trouper.config.models import RemoteRuntime

    with pytest.raises(ValidationError, match="http"):
        RemoteRuntime(url="127.0.0.1:8000")


@pytest.mark.parametrize("options, field, words", [
    ({"repo": "https://user:pw@example.test/r.git"}, "repo", "credentials"),
    ({"repo": "https://ghp_token@example.test/r.git"}, "repo", "credentials"),
    ({"repo": "   "}, "repo", "blank"),
    ({"branch": "main"}, "", "branch is given without repo"),
    ({"repo": "/srv/r", "branch": "--upload-pack=x"}, "branch", "branch or tag"),
])
def test_a_repository_session_is_checked_before_anything_starts(options, field, words):
    from pydantic import ValidationError

    from trouper.config.models import SessionConfig

    with pytest.raises(ValidationError, match=words) as caught:
        SessionConfig(task="t", llm={"model": "m"}, workspace="/w", **options)
    assert [".".join(map(str, e["loc"])) for e in caught.value.errors()] == [field] or not field
    fine = SessionConfig(task="t", llm={"model": "m"}, workspace="/w",
                         repo="git@example.test:team/r.git", branch="dev", setup="make")
    assert (fine.repo, fine.branch, fine.setup) == ("git@example.test:team/r.git", "dev", "make")
