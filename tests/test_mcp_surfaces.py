"""MCP servers from every face: ``trouper run --mcp/--secret``, ``[mcp.NAME]`` tables of the
config files, ``POST /v1/sessions`` with ``mcp``, and how the CLI and the web page show the
servers' tools, a server that did not start, a call and a lost outcome. The sessions are
real, with the shipped stdio server (``testing/mcp_server.sh``) in their workspace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from rich.console import Console

from trouper.cli.mcp_options import given_servers, parse_mcp_flag, session_secrets
from trouper.cli.render import describe_action, render
from trouper.config.files import ConfigFiles, parse_text
from trouper.exceptions import ConfigError
from trouper.messages.actions import McpCall
from trouper.messages.events import ActionEvent, McpToolsListed, ObservationEvent
from trouper.messages.mcp import McpTool
from trouper.messages.outcomes import Outcome
from trouper.testing.daemon import running_daemon

from accel import forkserver

SERVER = Path(__file__).resolve().parents[1] / "testing" / "mcp_server.sh"
FINISH = {"tool": "finish", "args": {"message": "done"}}
SECRET = "tok-never-shown-1234567890"
CHROMIUM = "/usr/bin/chromium"
LONG_MS = 60_000


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(SERVER, ws / "mcp_server.sh")
    return ws


def calls_of(ws: Path) -> list[str]:
    """The tools the shipped server was called with, in order (its own record)."""
    path = ws / "mcp-calls.log"
    return [line.split()[1] for line in path.read_text().splitlines()] if path.exists() else []


def shown(text: object) -> str:
    console = Console(width=200, color_system=None)
    with console.capture() as captured:
        console.print(text)
    return captured.get()


def usage_error(call, *args) -> str:
    with pytest.raises(click.UsageError) as caught:
        call(*args)
    return caught.value.format_message()


# -- the --mcp and --secret options --------------------------------------------------------

def test_mcp_flags_read_a_stdio_command_with_its_environment_a_url_and_json():
    assert parse_mcp_flag("gh=GH_TOKEN=<secret:GH> npx -y '@scope/server github'") == {
        "name": "gh", "command": ["npx", "-y", "@scope/server github"],
        "env": {"GH_TOKEN": "<secret:GH>"}}
    assert parse_mcp_flag("docs=https://example.com/mcp") == {
        "name": "docs", "url": "https://example.com/mcp"}
    spec = {"name": "d", "url": "https://e.com/mcp", "tools": ["search"],
            "headers": {"Authorization": "Bearer <secret:DOCS>"}}
    assert parse_mcp_flag(json.dumps(spec)) == spec


@pytest.mark.parametrize(("spec", "says"), [
    ("no name here", "--mcp takes NAME=COMMAND"),
    ("bad name!=sh x", "NAME: 1 to 32 letters"),
    ("t=", "give the server's program"),
    ("t=sh 'unclosed", "quote as in a shell"),
    ('{"name": "t"', "not valid JSON"),
    ('{"name": "t", "command": ["sh"], "url": "https://e.com"}', "either command"),
    ('{"name": "t", "command": ["sh"], "bogus": 1}', "bogus"),
    ("t=ftp://e.com/x", None),  # not a URL trouper reaches: a program named so
])
def test_a_bad_mcp_flag_is_a_usage_error_saying_what_is_wrong(spec, says):
    if says is None:
        assert parse_mcp_flag(spec)["command"] == ["ftp://e.com/x"]
        return
    assert says in usage_error(parse_mcp_flag, spec)


def test_a_secret_value_on_the_command_line_is_refused_and_never_quoted():
    said = usage_error(parse_mcp_flag, f"gh=GITHUB_TOKEN={SECRET} npx server")
    assert "env.GITHUB_TOKEN" in said and "--secret NAME" in said and SECRET not in said
    said = usage_error(parse_mcp_flag, json.dumps(
        {"name": "d", "url": "https://e.com", "headers": {"Authorization": SECRET}}))
    assert "headers.Authorization" in said and SECRET not in said
    said = usage_error(session_secrets, [], (f"TOKEN={SECRET}",))
    assert "NAME only" in said and SECRET not in said


def test_secrets_come_from_the_environment_by_name_and_a_projects_server_needs_them_given(
        tmp_path):
    env = {"GH": SECRET, "OTHER": "other-value"}
    mine = given_servers(ConfigFiles(tmp_path / "config.toml"),
                         ("gh=GH_TOKEN=<secret:GH> npx server",))
    assert session_secrets(mine, ("OTHER",), env) == {"OTHER": "other-value", "GH": SECRET}
    said = usage_error(session_secrets, mine, (), {})
    assert "'gh' (given as a flag) names <secret:GH>" in said and "export GH=" in said

    project_file = tmp_path / ".trouper.toml"
    project = parse_text('[mcp.p]\ncommand = "sh s.sh"\nenv = { KEY = "<secret:GH>" }\n',
                         project_file, "project")
    theirs = given_servers(ConfigFiles(tmp_path / "config.toml", project=project,
                                       project_path=project_file), ())
    said = usage_error(session_secrets, theirs, (), env)
    assert "project file's server gets a secret only when you give it: --secret GH" in said
    assert session_secrets(theirs, ("GH",), env) == {"GH": SECRET}


# -- the config files ---------------------------------------------------------------------

def test_config_files_list_servers_as_mcp_tables_and_a_project_replaces_yours_by_name(
        tmp_path):
    user_path, project_path = tmp_path / "config.toml", tmp_path / ".trouper.toml"
    user = parse_text('model = "openai/gpt-4o"\n\n[mcp.docs]\nurl = "https://e.com/mcp"\n'
                      'headers = { Authorization = "Bearer <secret:DOCS>" }\n\n'
                      '[mcp.t]\ncommand = ["sh", "old.sh"]\n', user_path, "user")
    project = parse_text('[mcp.t]\ncommand = "sh mcp_server.sh --flag"\nrequired = false\n'
                         'tools = ["echo"]\n', project_path, "project")
    assert user.keys == {"model": "openai/gpt-4o"}
    files = ConfigFiles(user_path, user, project_path, project)
    servers = given_servers(files, ())
    assert [(s.name, s.source, s.yours) for s in servers] == [
        ("docs", str(user_path), True), ("t", str(project_path), False)]
    assert servers[1].entry == {"name": "t", "command": ["sh", "mcp_server.sh", "--flag"],
                                "required": False, "tools": ["echo"]}
    flagged = given_servers(files, ("t=sh mine.sh",))  # a flag beats the files
    assert [(s.name, s.source) for s in flagged] == [("docs", str(user_path)), ("t", "flag")]


@pytest.mark.parametrize(("text", "kind", "says"), [
    ('[mcp.t]\ncommand = ["sh"]\ntimeout_s = -1\n', "user",
     "line 3: mcp.t.timeout_s: must be greater than 0"),
    ('[mcp.t]\ncommand = ["sh"]\nbogus = 1\n', "user", "line 3: mcp.t.bogus: unknown field"),
    ('[mcp.t]\nenv = { A = "1" }\n', "user", "line 1: mcp.t: give either command"),
    ('\n[mcp.t]\ncommand = ["sh"]\nenv = { GITHUB_TOKEN = "' + SECRET + '" }\n', "user",
     "line 4: mcp.t.env.GITHUB_TOKEN: trouper never reads a secret from a file"),
    ('[mcp.d]\nurl = "https://e.com/mcp"\n', "project",
     "line 2: mcp.d.url: a project file may not choose an HTTP MCP server"),
    ('[[mcp]]\ncommand = ["sh"]\n', "user", "mcp: give each server its own table"),
    ('[mcp."no good"]\ncommand = ["sh"]\n', "user", "a server's name is 1 to 32"),
])
def test_a_bad_server_in_a_file_is_an_error_naming_the_file_the_line_and_the_field(
        tmp_path, text, kind, says):
    path = tmp_path / "config.toml"
    with pytest.raises(ConfigError) as caught:
        parse_text(text, path, kind)
    message = str(caught.value)
    assert message.startswith(str(path)) and says in message
    assert SECRET not in message


# -- how the CLI shows them ---------------------------------------------------------------

def test_the_cli_shows_a_call_the_tools_a_failed_server_as_a_warning_and_a_lost_outcome():
    call = ActionEvent(seq=8, action_id="a-1", turn_id="t", tool_call_id="c", tool="mcp__t__echo",
                       arguments='{"text": "hi"}',
                       action=McpCall(server="t", tool="echo", arguments={"text": "hi"}))
    assert describe_action(call) == 'mcp t.echo {"text": "hi"}'
    assert shown(render(call)).strip() == '8 ▶ mcp t.echo {"text": "hi"}'
    listed = McpToolsListed(seq=6, action_id="a-0", tools=[
        McpTool(name="mcp__t__echo", server="t", tool="echo"),
        McpTool(name="mcp__t__env", server="t", tool="env")],
        failed={"gone": "no such program: 'nope'"})
    lines = shown(render(listed)).splitlines()
    assert [line.strip() for line in lines] == [
        "6 mcp t: 2 tools (echo, env)",
        "6 warning: mcp gone did not start: no such program: 'nope'"]
    lost = ObservationEvent(seq=9, action_id="a-1", outcome=Outcome(
        status="lost", content="the MCP server died (signal 9) during the call"))
    assert shown(render(lost)).split()[:2] == ["9", "↳"]
    assert "lost" in shown(render(lost)) and "signal 9" in shown(render(lost))


# -- real sessions: the command, the daemon, the page -------------------------------------

def trouper_run(*args: str, home: Path, cwd: Path, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess:
    full = {**os.environ, "TROUPER_HOME": str(home), "COLUMNS": "200", **(env or {})}
    full.pop("TROUPER_MODEL", None)
    return forkserver.run([sys.executable, "-m", "trouper", "run", *args], env=full,
                          text=True, capture_output=True, timeout=120,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def script_file(tmp_path: Path, steps: list[dict]) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(steps))
    return path


@pytest.mark.slow
def test_trouper_run_gives_mcp_servers_and_secrets_by_name_and_shows_their_calls(tmp_path):
    ws = workspace(tmp_path)
    script = script_file(tmp_path, [{"tool": "mcp__t__echo", "args": {"text": "hi"}},
                                    {"tool": "mcp__t__env", "args": {"name": "MCP_KEY"}},
                                    FINISH])
    result = trouper_run(
        "use the tools", "--script", str(script), "--workspace", str(ws),
        "--mcp", "t=MCP_KEY=<secret:TOK> sh mcp_server.sh",
        "--mcp", '{"name": "gone", "command": ["no-such-mcp-server"], "required": false}',
        home=tmp_path / "home", cwd=tmp_path, env={"TOK": SECRET})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "mcp t: 4 tools (echo, env, fail, hang)" in out
    assert "warning: mcp gone did not start: no such program" in out
    assert '▶ mcp t.echo {"text": "hi"}' in out and '▶ mcp t.env {"name": "MCP_KEY"}' in out
    assert "<secret:TOK>" in out and SECRET not in out + result.stderr  # masked
    assert calls_of(ws) == ["echo", "env"]


@pytest.mark.slow
def test_a_project_files_server_reaches_the_session_and_its_secret_only_when_given(tmp_path):
    ws = workspace(tmp_path)
    (ws / ".trouper.toml").write_text(
        '[mcp.t]\ncommand = "sh mcp_server.sh"\nenv = { MCP_KEY = "<secret:TOK>" }\n')
    script = script_file(tmp_path, [{"tool": "mcp__t__env", "args": {"name": "MCP_KEY"}},
                                    FINISH])
    args = ("read the key", "--script", str(script), "--workspace", str(ws))
    refused = trouper_run(*args, home=tmp_path / "home", cwd=ws, env={"TOK": SECRET})
    assert refused.returncode == 2 and "--secret TOK" in refused.stderr
    assert not calls_of(ws)
    result = trouper_run(*args, "--secret", "TOK", home=tmp_path / "home", cwd=ws,
                         env={"TOK": SECRET})
    assert result.returncode == 0, result.stdout + result.stderr
    assert '▶ mcp t.env {"name": "MCP_KEY"}' in result.stdout
    assert "<secret:TOK>" in result.stdout and SECRET not in result.stdout
    assert calls_of(ws) == ["env"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with running_daemon(tmp_path_factory.mktemp("mhome")) as d:
        yield d


@pytest.mark.slow
@pytest.mark.parametrize(("mcp", "field"), [
    ([{"name": "t"}], "mcp.0"),
    ([{"name": "t", "command": ["sh"], "timeout_s": 0}], "mcp.0.timeout_s"),
    ([{"name": "t", "command": ["sh"], "bogus": 1}], "mcp.0.bogus"),
    ([{"name": "t", "url": "https://e.com", "headers": {"A": "<secret:NOPE>"}}], "mcp"),
    ({"name": "t"}, "mcp"),
])
def test_a_bad_mcp_entry_in_a_create_is_a_422_naming_the_field(daemon, mcp, field):
    answer = daemon.http().post("/v1/sessions", json={
        "task": "t", "llm": {"model": "openai/gpt-4o"}, "mcp": mcp})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["field"] == field


@pytest.mark.slow
def test_a_create_with_mcp_runs_the_servers_and_the_page_shows_them(daemon, scripted,
                                                                    tmp_path):
    ws = workspace(tmp_path)
    _, llm = scripted([{"tool": "mcp__t__echo", "args": {"text": "hi"}}, FINISH])
    http = daemon.http()
    made = http.post("/v1/sessions", json={
        "task": "echo over http", "llm": llm, "workspace": str(ws),
        "secrets": {"TOK": SECRET},
        "mcp": [{"name": "t", "command": ["sh", "mcp_server.sh"],
                 "env": {"MCP_KEY": "<secret:TOK>"}},
                {"name": "gone", "command": ["no-such-mcp-server"], "required": False}]})
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    session = daemon.client().session(sid)
    assert session.wait(timeout=90).value == "finished"
    events = http.get(f"/v1/sessions/{sid}/events").json()["events"]
    [listed] = [e for e in events if e["kind"] == "mcp_tools"]
    assert [t["name"] for t in listed["tools"]][:1] == ["mcp__t__echo"]
    assert list(listed["failed"]) == ["gone"]
    assert calls_of(ws) == ["echo"]
    config = http.get(f"/v1/sessions/{sid}").json()["config"]
    assert [s["name"] for s in config["mcp"]] == ["t", "gone"]
    assert SECRET not in json.dumps(events) + json.dumps(config)
    page_shows(daemon, sid)


def page_shows(daemon, sid: str) -> None:
    """The page lists the servers' tools, the failed one as a warning, the call readably."""
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing (bash scripts/browser installs it)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{daemon.url}/#token={daemon.token}")
            page.locator(f"#sessions li[data-id='{sid}']").click()
            expect(page.locator("#state")).to_have_text("finished", timeout=LONG_MS)
            expect(page.locator("#events li.mcp-tools")).to_have_text(
                "MCP t: 4 tools (echo, env, fail, hang)", timeout=LONG_MS)
            warning = page.locator("#events li.warning")
            expect(warning).to_contain_text("MCP server gone did not start: no such program")
            assert warning.get_attribute("data-server") == "gone"
            expect(page.locator("#events .tool").nth(1)).to_have_text(
                'mcp t.echo {"text": "hi"}')
            expect(page.locator("#events .tool").first).to_have_text(
                "start MCP servers: t, gone")
            assert errors == []
        finally:
            browser.close()


def test_config_show_lists_the_files_servers_and_where_each_came_from(tmp_path):
    from click.testing import CliRunner

    from trouper.cli.main import main

    home, ws = tmp_path / "home", tmp_path / "ws"
    home.mkdir()
    ws.mkdir()
    (home / "config.toml").write_text('[mcp.docs]\nurl = "https://e.com/mcp"\n')
    (ws / ".trouper.toml").write_text('[mcp.t]\ncommand = "sh mcp_server.sh"\n')
    args = ["config", "show", "--home", str(home), "--workspace", str(ws)]
    shown_text = CliRunner().invoke(main, args)
    assert shown_text.exit_code == 0, shown_text.output
    rows = shown_text.output.split("mcp servers", 1)[1].splitlines()[1:]
    assert [row.split() for row in rows] == [
        ["docs", "https://e.com/mcp", str(home / "config.toml")],
        ["t", "sh", "mcp_server.sh", str(ws / ".trouper.toml")]]
    as_json = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert as_json["mcp"]["t"] == {"value": {"command": ["sh", "mcp_server.sh"], "name": "t"},
                                   "source": str(ws / ".trouper.toml")}
