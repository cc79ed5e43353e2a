"""The ``trouper`` command, run as a real subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from accel import forkserver

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

def trouper_cmd(*args: str, home: Path, timeout: float = 120, fork: bool = True
                ) -> subprocess.CompletedProcess:
    """``python -m trouper ARGS``: forked from the suite's zygote unless ``fork`` is false
    (then started afresh, imports and all, as a user's shell starts it)."""
    env = {**os.environ, "TROUPER_HOME": str(home), "COLUMNS": "200"}
    env.pop("TROUPER_MODEL", None)
    return (forkserver.run if fork else subprocess.run)(
        [sys.executable, "-m", "trouper", *args], env=env, text=True, capture_output=True,
        timeout=timeout, stdin=subprocess.DEVNULL)


def readme_first_command() -> list[str]:
    """The trouper part of README's first command (the one that installs and runs)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n```", readme, re.S).group(1)
    command = first.split("&&")[-1].split()
    assert command[0] == ".venv/bin/trouper", first
    return command[1:]


def summary(stdout: str) -> dict[str, str]:
    """The run summary's ``key  value`` lines."""
    rows = stdout.split("── summary", 1)[1].strip().splitlines()
    return dict(line.split(None, 1) for line in rows)


def assert_demo_made_a_tested_program(result: subprocess.CompletedProcess, home: Path) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "state → finished" in result.stdout
    assert "run: mkdir -p wordcount" in result.stdout
    rows = summary(result.stdout)
    assert rows["state"] == "finished" and "resume" not in rows
    workspace = Path(rows["workspace"])
    assert workspace == home.resolve() / "sessions" / rows["session"] / "workspace"
    assert (workspace / "wordcount" / "wordcount.py").is_file()
    tests = subprocess.run([sys.executable, "-m", "unittest", "-q", "test_wordcount"],
                           cwd=workspace / "wordcount", capture_output=True, text=True)
    assert tests.returncode == 0, tests.stderr


def test_readmes_first_command_runs_the_demo_with_no_key_and_no_network(tmp_path):
    home = tmp_path / "home"
    result = trouper_cmd(*readme_first_command(), home=home, fork=False)  # as a shell does
    assert_demo_made_a_tested_program(result, home)
    log = home / "logs" / "trouper.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    # written by the CLI's own process (it closes the actor system), beside the actors'
    assert "trouper.client.actor_system: closed sandboxes of 1 session(s)" in log.read_text()


def test_run_with_no_task_and_no_model_is_the_demo(tmp_path):
    home = tmp_path / "home"
    assert_demo_made_a_tested_program(trouper_cmd("run", home=home), home)


@pytest.mark.parametrize("args", [["demo", "--workspace", "{ws}"], ["run", "--workspace", "{ws}"]])
def test_the_demo_never_works_in_a_folder_the_user_names(tmp_path, args):
    workspace = tmp_path / "mine"
    result = trouper_cmd(*[a.format(ws=workspace) for a in args], home=tmp_path / "home")
    assert result.returncode == 2
    assert "never in a folder you name" in result.stderr
    assert not workspace.exists()


def test_a_task_with_no_model_is_a_usage_error_saying_how_to_give_one(tmp_path):
    result = trouper_cmd("run", "fix the failing test", home=tmp_path / "home")
    assert result.returncode == 2
    line, = result.stderr.splitlines()
    for way in ("--model", "TROUPER_MODEL", "trouper demo"):
        assert way in line
    assert not (tmp_path / "home" / "sessions").exists()


def test_script_ending_without_finish_exits_non_zero_with_reason(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"tool": "run", "args": {"command": "echo hello > out.txt"}},
        {"say": "I need to ask you something."},
    ]))
    home = tmp_path / "home"
    result = trouper_cmd("run", "say hello", "--script", str(script),
                         "--workspace", str(tmp_path / "ws"), home=home)
    assert result.returncode == 1
    assert "awaiting_user_input" in result.stdout
    assert (tmp_path / "ws" / "out.txt").read_text() == "hello\n"
    rows = summary(result.stdout)
    assert rows["state"] == "awaiting_user_input"
    assert rows["steps"] == "2 model calls, 1 action"
    assert rows["workspace"] == str((tmp_path / "ws").resolve())
    assert rows["resume"] == (f"trouper resume {rows['session']} --script {script} "
                              "-m 'YOUR ANSWER'")

    listed = trouper_cmd("sessions", home=home)
    assert listed.returncode == 0 and "awaiting_user_input" in listed.stdout
    session_id = listed.stdout.split()[0]
    dumped = trouper_cmd("events", session_id, "--json", home=home)
    kinds = [json.loads(line)["kind"] for line in dumped.stdout.splitlines()]
    assert kinds[0] == "message" and "action" in kinds and "observation" in kinds
    missing = trouper_cmd("events", "s-missing", home=home)
    assert missing.returncode == 2 and "s-missing" in missing.stderr
    unknown = trouper_cmd("resume", "s-missing", home=home)
    assert unknown.returncode == 2 and "s-missing" in unknown.stderr
    unscripted = trouper_cmd("resume", session_id, "-m", "hi", home=home)
    assert unscripted.returncode == 2 and "--script" in unscripted.stderr


def test_no_network_cuts_the_local_shell_off_the_network(tmp_path):
    probe = ("python3 -c \"import socket; socket.socket(socket.AF_INET); print('open')\" "
             "> out.txt 2>&1; true")
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"tool": "run", "args": {"command": probe}},
                                  {"tool": "finish", "args": {"message": "done"}}]))
    for flag, shown in (("--no-network", "PermissionError"), (None, "open")):
        workspace = tmp_path / f"ws-{flag}"
        result = trouper_cmd("run", "probe", "--script", str(script), "--workspace",
                             str(workspace), *([flag] if flag else []), home=tmp_path / "home")
        assert result.returncode == 0, result.stderr
        assert shown in (workspace / "out.txt").read_text()


def test_timeout_pauses_the_session_and_says_how_to_resume_it(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"tool": "run", "args": {"command": "sleep 600"}}]))
    result = trouper_cmd("run", "wait", "--script", str(script), "--timeout", "3",
                         home=tmp_path / "home")
    assert result.returncode == 1, result.stdout + result.stderr
    rows = summary(result.stdout)
    assert rows["state"] == "paused"
    assert rows["reason"].endswith("when --timeout (3 s) passed; paused while trouper closed")
    assert rows["resume"] == f"trouper resume {rows['session']} --script {script}"


def test_resume_gives_a_stored_session_a_message_and_follows_it(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"say": "Which file?"},
        {"tool": "run", "args": {"command": "echo done > answer.txt"}},
        {"tool": "finish", "args": {"message": "answered"}},
    ]))
    home, workspace = tmp_path / "home", tmp_path / "ws"
    from trouper.testing import FakeLLMServer, load_script

    with FakeLLMServer(load_script(script)) as server:
        first = trouper_cmd("run", "answer", "--model", "hosted_vllm/x", "--base-url",
                            server.url, "--api-key", "k", "--workspace", str(workspace),
                            home=home)
        assert first.returncode == 1 and "awaiting_user_input" in first.stdout
        session_id = trouper_cmd("sessions", home=home).stdout.split()[0]
        again = trouper_cmd("resume", session_id, "-m", "answer.txt", home=home)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "user: answer.txt" in again.stdout and "state → finished" in again.stdout
    assert (workspace / "answer.txt").read_text() == "done\n"


def test_a_scripted_server_listens_where_the_kernel_hands_out_no_port():
    """So that ``resume --script`` can listen at the same address again."""
    from trouper.cli.scripted import scripted_port, serve
    from trouper.testing import load_script

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    with contextlib.ExitStack() as stack:
        url = serve(stack, load_script([{"say": "hi"}]))
        assert scripted_port(url) < low
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=10) as r:
            assert r.status == 200


def test_fake_llm_command_serves_a_script(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"say": "hello from the script"}]))
    proc = forkserver.Popen([sys.executable, "-m", "trouper", "fake-llm", "--script",
                             str(script), "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        url = first.split(" at ")[-1].strip()
        assert url.startswith("http://127.0.0.1:"), first
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        request = urllib.request.Request(f"{url}/chat/completions", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read())
        assert answer["choices"][0]["message"]["content"] == "hello from the script"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("args", [["run", "--runtime", "nope"], ["run", "--script", "/nope"]])
def test_bad_options_are_usage_errors(tmp_path, args):
    result = trouper_cmd(*args, home=tmp_path)
    assert result.returncode == 2


def test_run_from_a_repository_waits_for_approval_and_resume_answers_it(tmp_path):
    origin = tmp_path / "origin"
    origin.mkdir()
    git_env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "x"]):
        if args[0] == "add":
            (origin / "hello.txt").write_text("from the repo\n")
        subprocess.run(["git", *args], cwd=origin, env=git_env, check=True)
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"tool": "run", "args": {"command": "rm -rf hello.txt"}},
        {"tool": "run", "args": {"command": "cat hello.txt setup.txt"}},
        {"tool": "finish", "args": {"message": "kept it"}},
    ]))
    home, workspace = tmp_path / "home", tmp_path / "ws"
    result = trouper_cmd("run", "tidy", "--script", str(script), "--workspace", str(workspace),
                         "--repo", str(origin), "--setup", "echo prepared > setup.txt",
                         "--confirm", "risky", home=home)
    rows = summary(result.stdout)
    assert result.returncode == 1 and rows["state"] == "awaiting_user_confirmation"
    assert "rm -rf hello.txt" in rows["reason"]
    assert rows["approve"] == f"trouper approve {rows['session']} --script {script}"
    assert rows["reject"] == f"trouper reject {rows['session']} 'WHY' --script {script}"
    assert (workspace / "hello.txt").read_text() == "from the repo\n"
    rejected = trouper_cmd("resume", rows["session"], "--script", str(script),
                           "--reject", "keep the file", home=home)
    assert rejected.returncode == 0, rejected.stdout + rejected.stderr
    assert "user rejected the action" in rejected.stdout and "keep the file" in rejected.stdout
    assert "from the repo" in rejected.stdout and "prepared" in rejected.stdout
    assert (workspace / "hello.txt").exists()


def test_a_looping_agent_is_paused_and_the_summary_asks_for_a_hint(tmp_path):
    script = tmp_path / "script.json"
    loop = {"tool": "run", "args": {"command": "echo still waiting"}}
    script.write_text(json.dumps([loop] * 4 + [{"tool": "finish",
                                                "args": {"message": "done"}}]))
    home = tmp_path / "home"
    result = trouper_cmd("run", "wait for it", "--script", str(script),
                         "--workspace", str(tmp_path / "ws"), home=home)
    assert result.returncode == 1
    rows = summary(result.stdout)
    assert rows["state"] == "paused"
    assert "stuck: the same action gave the same result 4 times" in result.stdout
    assert rows["resume"] == (f"trouper resume {rows['session']} --script {script} "
                              "-m 'YOUR HINT'")
    resumed = trouper_cmd("resume", rows["session"], "--script", str(script), "-m",
                          "it is up already: finish", home=home)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert summary(resumed.stdout)["state"] == "finished"


def test_a_budget_that_asks_pauses_and_trouper_budget_carries_the_session_on(tmp_path):
    script = tmp_path / "script.json"
    steps = [{"tool": "run", "args": {"command": f"echo {i} >> count.txt"}} for i in range(4)]
    script.write_text(json.dumps([*steps, {"tool": "finish", "args": {"message": "done"}}]))
    home = tmp_path / "home"
    result = trouper_cmd("run", "count", "--script", str(script), "--max-iterations", "2",
                         "--on-budget", "ask", "--workspace", str(tmp_path / "ws"),
                         home=home)
    assert result.returncode == 1
    rows = summary(result.stdout)
    assert rows["state"] == "paused"
    assert "reached max_iterations (2 model calls)" in result.stdout
    assert rows["budget"].startswith(f"trouper budget {rows['session']} ")
    still = trouper_cmd("budget", rows["session"], "--max-iterations", "2", "--script",
                        str(script), home=home)
    assert still.returncode == 2 and "would still be spent" in still.stderr
    raised = trouper_cmd("budget", rows["session"], "--max-iterations", "10", "--script",
                         str(script), home=home)
    assert raised.returncode == 0, raised.stdout + raised.stderr
    assert summary(raised.stdout)["state"] == "finished"
    assert (tmp_path / "ws" / "count.txt").read_text().split() == ["0", "1", "2", "3"]
