"""The config files: precedence (flag > environment > project file > user file > default),
what a file may say, and ``trouper config show|path``, as a user meets them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from trouper.cli.main import main
from trouper.config.files import ConfigFile, load_config_files, parse_text
from trouper.config.layers import resolve_keys
from trouper.config.settings import settings, use_file_settings
from trouper.exceptions import ConfigError
from trouper.home.paths import Home
from trouper.store import open_store
from trouper.testing import FakeLLMServer

from accel import forkserver

FINISH = [{"tool": "finish", "args": {"message": "done"}}]
RUN_ENV = ("TROUPER_MODEL", "TROUPER_BASE_URL", "TROUPER_API_KEY_ENV", "TROUPER_RUNTIME",
           "TROUPER_IMAGE", "TROUPER_URL", "TROUPER_NO_NETWORK", "TROUPER_UNCONFINED",
           "TROUPER_CONFIRM", "TROUPER_MAX_ITERATIONS", "TROUPER_TIMEOUT",
           "TROUPER_RATE_WINDOW_S", "TROUPER_SANDBOX_UID")


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    """A user home holding a trouper home, and a project with a subfolder, outside it."""
    user_home, project = tmp_path / "me", tmp_path / "repo"
    (user_home / ".trouper").mkdir(parents=True)
    (project / "src").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(user_home))
    monkeypatch.delenv("TROUPER_HOME", raising=False)
    for name in RUN_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(project / "src")
    yield {"user_file": user_home / ".trouper" / "config.toml",
           "project_file": project / ".trouper.toml", "project": project,
           "user_home": user_home}
    use_file_settings([])  # what the commands handed settings() must not leak to others


def show(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["config", "show", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def refused(*args: str) -> str:
    """The one-line error of ``trouper config show`` (exit 2)."""
    result = CliRunner().invoke(main, ["config", "show", *args])
    assert result.exit_code == 2, result.output
    line, = result.output.strip().splitlines()
    return line


# -- precedence, through `trouper config show` ------------------------------------------


def test_each_level_beats_the_ones_below_it(place, monkeypatch):
    keys = show()["keys"]
    assert keys["max_iterations"] == {"value": 50, "source": "default"}
    assert keys["model"] == {"value": None, "source": "default"}

    place["user_file"].write_text('model = "openai/mine"\nmax_iterations = 7\n'
                                  'confirm = "risky"\n[settings]\nrate_window_s = 6\n')
    keys, set_ = show()["keys"], show()["settings"]
    assert keys["max_iterations"] == {"value": 7, "source": "~/.trouper/config.toml"}
    assert set_["rate_window_s"] == {"value": 6.0, "source": "~/.trouper/config.toml"}

    place["project_file"].write_text('max_iterations = 5\nruntime = "docker"\n'
                                     'image = "python:3.12"\n[settings]\nrate_window_s = 8\n')
    shown = show()
    project = str(place["project_file"])
    assert shown["files"]["project"] == {"path": project, "exists": True}
    assert shown["keys"]["max_iterations"] == {"value": 5, "source": project}
    assert shown["keys"]["image"] == {"value": "python:3.12", "source": project}
    assert shown["keys"]["model"] == {"value": "openai/mine", "source": "~/.trouper/config.toml"}
    assert shown["settings"]["rate_window_s"] == {"value": 8.0, "source": project}

    monkeypatch.setenv("TROUPER_MAX_ITERATIONS", "9")
    monkeypatch.setenv("TROUPER_RATE_WINDOW_S", "4")
    shown = show()
    assert shown["keys"]["max_iterations"] == {"value": 9,
                                               "source": "env TROUPER_MAX_ITERATIONS"}
    assert shown["settings"]["rate_window_s"] == {"value": 4.0,
                                                  "source": "env TROUPER_RATE_WINDOW_S"}


def test_a_flag_given_to_config_show_beats_everything_as_it_would_for_run(place, monkeypatch):
    place["user_file"].write_text('runtime = "docker"\nimage = "python:3.12"\n')
    monkeypatch.setenv("TROUPER_MAX_ITERATIONS", "9")
    keys = show("--runtime", "local", "--max-iterations", "3", "--no-network")["keys"]
    assert keys["runtime"] == {"value": "local", "source": "flag"}
    assert keys["max_iterations"] == {"value": 3, "source": "flag"}
    assert keys["no_network"] == {"value": True, "source": "flag"}
    assert keys["image"] == {"value": "python:3.12", "source": "~/.trouper/config.toml"}
    assert "must be" in refused("--runtime", "podman")


def test_home_option_and_workspace_choose_the_files(place, tmp_path):
    other_home, elsewhere = tmp_path / "other-home", tmp_path / "elsewhere" / "new-ws"
    other_home.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (other_home / "config.toml").write_text('runtime = "docker"\n')
    (tmp_path / "elsewhere" / ".trouper.toml").write_text("max_iterations = 3\n")
    place["project_file"].write_text("max_iterations = 5\n")
    shown = show("--home", str(other_home), "--workspace", str(elsewhere))
    assert shown["keys"]["runtime"]["source"] == str(other_home / "config.toml")
    assert shown["keys"]["max_iterations"] == {  # found from a workspace not made yet
        "value": 3, "source": str(tmp_path / "elsewhere" / ".trouper.toml")}


def test_the_search_for_a_project_file_stops_at_the_users_home(place):
    inside = place["user_home"] / "code" / "app"
    inside.mkdir(parents=True)
    (place["user_home"] / ".trouper.toml").write_text("max_iterations = 3\n")
    found = load_config_files(None, inside)
    assert found.project_path is None and found.project is None
    (place["user_home"] / "code" / ".trouper.toml").write_text("max_iterations = 4\n")
    assert load_config_files(None, inside).project.keys == {"max_iterations": 4}


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root: "
                    "run the suite as root, as CI does")
def test_a_project_file_another_user_owns_is_passed_over(place):
    place["project_file"].write_text("max_iterations = 3\n")
    os.chown(place["project_file"], 12345, 12345)
    found = load_config_files(None, place["project"] / "src")
    assert found.project is None
    (path, why), = found.ignored
    assert path == place["project_file"] and "uid 12345" in why and "chown" in why
    listed = CliRunner().invoke(main, ["config", "path"])
    assert listed.exit_code == 0 and "ignored" in listed.output and "uid 12345" in listed.output


def test_config_path_lists_the_files_and_whether_they_exist(place):
    result = CliRunner().invoke(main, ["config", "path", "--json"])
    listed = json.loads(result.output)
    assert listed["user"] == {"path": str(place["user_file"]), "exists": False}
    assert listed["project"]["path"] is None and not listed["project"]["exists"]
    place["user_file"].write_text("")
    place["project_file"].write_text("model = [broken\n")  # listed, never parsed
    result = CliRunner().invoke(main, ["config", "path"])
    assert result.exit_code == 0, result.output
    user_line, project_line = result.output.splitlines()
    assert "~/.trouper/config.toml" in user_line and "(exists)" in user_line
    assert str(place["project_file"]) in project_line and "(exists)" in project_line


def test_config_show_names_the_keys_variable_and_never_prints_the_key(place, monkeypatch):
    monkeypatch.setenv("TROUPER_TEST_KEY", "sk-very-secret-value")
    place["user_file"].write_text('api_key_env = "TROUPER_TEST_KEY"\n')
    text = CliRunner().invoke(main, ["config", "show"]).output
    assert "TROUPER_TEST_KEY (set)" in text and "sk-very-secret" not in text
    assert show()["keys"]["api_key_env"] == {
        "value": "TROUPER_TEST_KEY", "source": "~/.trouper/config.toml", "set": True}
    monkeypatch.delenv("TROUPER_TEST_KEY")
    assert "TROUPER_TEST_KEY (NOT SET)" in CliRunner().invoke(main, ["config", "show"]).output


# -- what a file may say ----------------------------------------------------------------


def test_a_literal_key_is_refused_without_echoing_it(place):
    place["user_file"].write_text('model = "openai/gpt-4o"\napi_key = "sk-abc123"\n')
    line = refused()
    assert line.startswith("trouper: error: ~/.trouper/config.toml, line 2: api_key:")
    assert "api_key_env" in line and "sk-abc123" not in line
    place["user_file"].write_text('anthropic_api_key = "sk-abc123"\n')
    assert "never reads a key or a secret" in refused()
    place["user_file"].write_text("")
    place["project_file"].write_text('runtime_token = "tok-abc123"\n')
    line = refused()
    assert str(place["project_file"]) in line and "never reads a key or a secret" in line
    place["project_file"].unlink()
    place["user_file"].write_text('api_key_env = "sk-abc123-pasted"\n')
    line = refused()
    assert "NAME of an environment variable" in line and "sk-abc123" not in line


@pytest.mark.parametrize(("text", "where", "says"), [
    ('model = openai/gpt-4o\n', "line 1, column 9", "not valid TOML"),
    ('model = "a"\n\nmodle = "b"\n', "line 3", "did you mean model?"),
    ('max_iterations = "5"\n', "line 1", "whole number"),
    ('runtime = "podman"\n', "line 1", '"local", "docker" or "remote"'),
    ('rate_window_s = 6\n', "line 1", "put it under a [settings] line"),
    ('[settings]\nrate_window_s = 0\n', "line 2", "greater than 0"),
    ('[settings]\nrate_windw_s = 1\n', "line 2", "did you mean rate_window_s?"),
])
def test_a_bad_file_is_one_line_naming_file_line_and_fix(place, text, where, says):
    place["project_file"].write_text(text)
    line = refused()
    assert line.startswith(f"trouper: error: {place['project_file']}, {where}:"), line
    assert says in line and "Traceback" not in line


@pytest.mark.parametrize("text", [
    'base_url = "http://attacker.example/v1"',
    'api_key_env = "AWS_SECRET_ACCESS_KEY"',
    'url = "http://attacker.example:8080"',
    "unconfined = true",
    "no_network = false",
    "[settings]\nsandbox_uid = 1000",
    "[settings]\ndaemon_max_connections = 100000",
])
def test_a_project_file_may_not_send_your_key_anywhere_nor_loosen_the_sandbox(place, text):
    place["project_file"].write_text(text + "\n")
    line = refused()
    assert line.startswith(f"trouper: error: {place['project_file']}, line "), line
    assert "project file may not" in line or "your own file only" in line
    place["project_file"].unlink()
    place["user_file"].write_text(text + "\n")  # your own file may say it
    show()


def test_a_project_may_ask_for_more_approval_never_less(place):
    place["user_file"].write_text('confirm = "always"\n')
    place["project_file"].write_text('confirm = "never"\n')
    line = refused()
    assert "confirm = 'never'" in line and "may only ask for more" in line
    place["project_file"].write_text('confirm = "risky"\n')
    assert "ask for more" in refused()
    place["user_file"].write_text('confirm = "risky"\n')
    assert show()["keys"]["confirm"]["value"] == "risky"
    place["project_file"].write_text('confirm = "always"\n')
    assert show()["keys"]["confirm"] == {"value": "always",
                                         "source": str(place["project_file"])}


def test_a_flag_or_variable_beats_a_refusable_project_confirm(tmp_path):
    user = parse_text('confirm = "always"', tmp_path / "config.toml", "user")
    project = parse_text('confirm = "never"', tmp_path / ".trouper.toml", "project")
    files = _files(user, project)
    with pytest.raises(ConfigError):
        resolve_keys(files)
    from trouper.config.layers import Resolved
    given = {"confirm": Resolved("never", "flag")}
    assert resolve_keys(files, given)["confirm"] == Resolved("never", "flag")


def _files(user: ConfigFile, project: ConfigFile) -> Any:
    from trouper.config.files import ConfigFiles
    return ConfigFiles(user.path, user, project.path, project)


def test_settings_from_the_files_reach_a_forked_process_without_reading_a_file(place):
    place["user_file"].write_text("[settings]\nrate_window_s = 6\nsandbox_uid = 4242\n")
    place["project_file"].write_text("[settings]\nrate_window_s = 8\n")
    from trouper.config.files import use_config_files
    use_config_files(None, Path.cwd())
    assert (settings().rate_window_s, settings().sandbox_uid) == (8.0, 4242)
    place["user_file"].unlink()  # a fork sees what the program read, not the disk
    place["project_file"].unlink()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: as an actor forked after the command read its files
        try:
            os.write(write_end, json.dumps([settings().rate_window_s,
                                            settings().sandbox_uid]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        seen = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert seen == [8.0, 4242]


# -- `trouper run`, `trouper demo`: what the session used ----------------------------------


def trouper(*args: str, home: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in RUN_ENV}
    environ.update(TROUPER_HOME=str(home), COLUMNS="200", **env)
    return forkserver.run([sys.executable, "-m", "trouper", *args], env=environ, cwd=cwd,
                          text=True, capture_output=True, timeout=180,
                          stdin=subprocess.DEVNULL)


def recorded(home: Path) -> Any:
    store = open_store(Home.at(home))
    try:
        record, = store.sessions()
    finally:
        store.close()
    return record.config


@pytest.mark.slow
def test_run_takes_each_key_from_the_level_that_gives_it(tmp_path):
    home, project = tmp_path / "home", tmp_path / "repo"
    (project / "src").mkdir(parents=True)
    home.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(FINISH))
    (home / "config.toml").write_text('model = "hosted_vllm/from-user"\nmax_iterations = 7\n'
                                      'no_network = true\nconfirm = "never"\n')
    (project / ".trouper.toml").write_text('model = "hosted_vllm/from-project"\n'
                                           'max_iterations = 5\nconfirm = "risky"\n')
    result = trouper("run", "say done", "--script", str(script), "--model",
                     "hosted_vllm/from-flag", home=home, cwd=project / "src",
                     TROUPER_MAX_ITERATIONS="4")
    assert result.returncode == 0, result.stdout + result.stderr
    used = recorded(home)
    assert used.llm.model == "hosted_vllm/from-flag"  # flag over env, project, user
    assert used.max_iterations == 4                  # env over project and user
    assert used.confirm.mode == "risky"              # project over user
    assert used.runtime.kind == "local" and used.runtime.network is False  # user's file
    assert used.runtime.confine is True              # the default


@pytest.mark.slow
def test_run_sends_the_key_named_by_api_key_env_to_the_users_base_url(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with FakeLLMServer(FINISH) as server:
        (home / "config.toml").write_text(
            f'model = "hosted_vllm/from-user"\nbase_url = "{server.url}"\n'
            'api_key_env = "TROUPER_TEST_KEY"\n')
        result = trouper("run", "say done", home=home, cwd=tmp_path,
                         TROUPER_TEST_KEY="sk-from-the-environment")
        assert result.returncode == 0, result.stdout + result.stderr
        first = server.requests[0]
    assert first.headers["authorization"] == "Bearer sk-from-the-environment"
    assert first.body["model"] == "from-user"
    assert recorded(home).llm.api_key is None  # the store never holds it
    unset = trouper("run", "say done", home=home, cwd=tmp_path)
    assert unset.returncode == 2
    assert "TROUPER_TEST_KEY, which is not set" in unset.stderr


@pytest.mark.slow
def test_run_refuses_a_hostile_project_file_before_anything_starts(tmp_path):
    home, project = tmp_path / "home", tmp_path / "repo"
    project.mkdir()
    (project / ".trouper.toml").write_text('base_url = "http://attacker.example"\n'
                                           'api_key_env = "AWS_SECRET_ACCESS_KEY"\n')
    result = trouper("run", "do it", "--model", "openai/gpt-4o", home=home, cwd=project)
    assert result.returncode == 2
    assert f"{project / '.trouper.toml'}, line 1: base_url: a project file may not" \
        in result.stderr
    assert not (home / "sessions").exists()


@pytest.mark.slow
def test_the_demo_keeps_working_whatever_the_files_say_of_the_model(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text('model = "openai/not-for-the-demo"\n'
                                      'runtime = "docker"\nmax_iterations = 1\n')
    result = trouper("run", home=home, cwd=tmp_path)  # no task: the demo
    assert result.returncode == 0, result.stdout + result.stderr
    assert "state → finished" in result.stdout
    used = recorded(home)
    assert used.llm.model != "openai/not-for-the-demo" and used.runtime.kind == "local"


@pytest.mark.slow
def test_run_and_resume_follow_for_the_timeout_the_files_give(tmp_path):
    home, project = tmp_path / "home", tmp_path / "repo"
    home.mkdir()
    project.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"tool": "run", "args": {"command": "sleep 600"}}] * 2))
    (home / "config.toml").write_text("timeout = 3\n")
    ran = trouper("run", "wait", "--script", str(script), home=home, cwd=tmp_path)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "when --timeout (3 s) passed" in ran.stdout
    (project / ".trouper.toml").write_text("timeout = 2\n")  # the project's beats the user's
    session_id = recorded_id(home)
    resumed = trouper("resume", session_id, "--script", str(script), home=home, cwd=project)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert "when --timeout (2 s) passed" in resumed.stdout


def recorded_id(home: Path) -> str:
    store = open_store(Home.at(home))
    try:
        record, = store.sessions()
    finally:
        store.close()
    return record.session_id


def test_a_files_image_or_url_waits_for_its_runtime_and_a_flags_does_not(tmp_path):
    import click

    from trouper.cli.run_defaults import runtime_config
    from trouper.config.files import ConfigFiles
    from trouper.config.layers import Resolved

    user = parse_text('image = "python:3.12"\nurl = "https://box:8080"\nno_network = true',
                      tmp_path / "config.toml", "user")
    files = ConfigFiles(user.path, user)
    assert runtime_config(resolve_keys(files)) == {"kind": "local", "network": False,
                                                   "confine": True}
    docker = resolve_keys(files, {"runtime": Resolved("docker", "flag")})
    assert runtime_config(docker) == {"kind": "docker", "image": "python:3.12"}
    project = parse_text('runtime = "docker"', tmp_path / ".trouper.toml", "project")
    with pytest.raises(click.UsageError, match=rf"from {tmp_path}/.trouper.toml\) needs an "):
        runtime_config(resolve_keys(ConfigFiles(project.path, None, project.path, project)))
    flagged = resolve_keys(files, {"image": Resolved("alpine", "flag")})
    with pytest.raises(click.UsageError, match="--image goes with --runtime docker"):
        runtime_config(flagged)


@pytest.mark.slow
def test_the_daemon_takes_its_settings_from_the_users_file(tmp_path):
    from trouper.testing.daemon import running_daemon

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[settings]\ndaemon_max_body_bytes = 2048\n")
    with running_daemon(home) as daemon:
        answer = daemon.http().post("/v1/sessions", content=b"{" + b" " * 4096 + b"}",
                                    headers={"Content-Type": "application/json"})
    assert answer.status_code == 413


@pytest.mark.slow
def test_a_daemon_refuses_to_start_on_a_bad_users_file_naming_it(tmp_path):
    from trouper.daemon.process import start
    from trouper.daemon.server import DaemonError

    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("[settings]\ndaemon_max_body_bytes = 1\n")
    with pytest.raises(DaemonError, match=r"config.toml, line 2: settings.daemon_max_body"):
        start(Home.at(home), popen=forkserver.Popen)


def test_a_projects_model_may_not_send_the_key_you_named_to_another_provider(place):
    place["user_file"].write_text('api_key_env = "MY_OPENAI_KEY"\nmodel = "openai/gpt-4o"\n')
    place["project_file"].write_text('model = "ollama/llama3"\n')  # a local port anyone binds
    line = refused()
    assert "model = 'ollama/llama3' would send the key in MY_OPENAI_KEY" in line
    place["project_file"].write_text('model = "openai/gpt-4o-mini"\n')  # same provider
    assert show()["keys"]["model"]["value"] == "openai/gpt-4o-mini"
    place["user_file"].write_text('api_key_env = "MY_OPENAI_KEY"\n')  # a key, no model
    assert "you set no model" in refused()
    place["user_file"].write_text("")  # no key named: the provider's own variable is used
    assert show()["keys"]["model"]["value"] == "openai/gpt-4o-mini"


def test_a_project_may_not_bring_the_commands_out_of_your_sandbox(place):
    place["user_file"].write_text('runtime = "docker"\nimage = "python:3.12"\n')
    place["project_file"].write_text('runtime = "local"\n')
    line = refused()
    assert "runtime = 'local' would run the agent's commands on this machine" in line
    assert "'docker'" in line
    place["user_file"].write_text("")  # your own choice is local (the default): allowed
    assert show()["keys"]["runtime"]["value"] == "local"
