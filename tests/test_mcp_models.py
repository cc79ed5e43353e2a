"""The MCP server models: what a server may be given, its name, its tools' names for the
model, the secrets it may name, and how confirmation mode shows and holds a call."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trouper.config.confirmation import ConfirmationPolicy, needs_confirmation, summary
from trouper.config.models import LLMConfig, SessionConfig
from trouper.messages.actions import McpCall
from trouper.messages.mcp import MAX_TOOL_NAME, McpServer, named, offered_name, tools_of


@pytest.mark.parametrize(("given", "error"), [
    ({}, "give either command"),
    ({"command": ["x"], "url": "http://h/mcp"}, "give either command"),
    ({"command": []}, "must name a program"),
    ({"url": "ftp://h/mcp"}, "http:// or https://"),
    ({"url": "http://h/mcp", "env": {"A": "b"}}, "env and cwd are for a stdio server"),
    ({"command": ["x"], "headers": {"A": "b"}}, "headers are for an HTTP server"),
    ({"command": ["x"], "cwd": "../up"}, "inside the workspace"),
    ({"command": ["x"], "name": "has space"}, "should match pattern"),
    ({"command": ["x"], "timeout_s": 0}, "greater than 0"),
])
def test_a_server_given_wrongly_is_refused_saying_why(given, error):
    with pytest.raises(ValidationError, match=error):
        McpServer.model_validate(given)


def test_servers_without_names_take_one_from_their_program_or_host_made_unique():
    servers = named((McpServer(command=("npx", "-y", "@modelcontextprotocol/server-github")),
                     McpServer(command=("python", "tools/server.py", "--verbose")),
                     McpServer(command=("python", "other/server.py")),
                     McpServer(url="https://mcp.example.test:8443/mcp")))
    assert [s.name for s in servers] == ["server-github", "server", "server_2",
                                         "mcp_example_test"]
    with pytest.raises(ValueError, match="two MCP servers are named a"):
        named((McpServer(name="a", command=("x",)), McpServer(name="a", url="http://h/")))


def test_tool_names_are_what_providers_take_and_unique():
    assert offered_name("fs", "read.file/v2") == "mcp__fs__read_file_v2"
    long = offered_name("server", "t" * 100)
    assert len(long) == MAX_TOOL_NAME
    again = offered_name("server", "t" * 100, {long})
    assert again != long and len(again) == MAX_TOOL_NAME and again.endswith("_2")


def test_a_servers_allow_list_and_a_schema_that_is_no_object():
    server = McpServer(name="s", command=("x",), tools=("keep", "odd"))
    listed = [{"name": "keep", "inputSchema": {"type": "object", "properties": {}}},
              {"name": "drop", "inputSchema": {"type": "object"}},
              {"name": "odd", "inputSchema": {"type": "string"}}, {"description": "no name"}]
    tools = tools_of(server, listed, set())
    assert [t.name for t in tools] == ["mcp__s__keep", "mcp__s__odd"]
    assert tools[1].parameters == {"type": "object", "properties": {}}


def test_a_server_may_name_only_the_sessions_secrets():
    llm = LLMConfig(model="hosted_vllm/x")
    server = {"name": "gh", "command": ["gh-mcp"], "env": {"GH": "<secret:GITHUB_TOKEN>"},
              }
    config = SessionConfig(task="t", llm=llm, workspace="/w", secret_names=("GITHUB_TOKEN",),
                           mcp=[server])
    assert config.mcp[0].secret_names() == {"GITHUB_TOKEN"}
    with pytest.raises(ValidationError, match="names secrets the session is not given: "
                                              "GITHUB_TOKEN"):
        SessionConfig(task="t", llm=llm, workspace="/w", mcp=[server])


def test_confirmation_mode_holds_mcp_calls_when_asked_and_shows_them_in_one_line():
    action = McpCall(server="gh", tool="create_issue", arguments={"title": "x" * 300})
    assert needs_confirmation(ConfirmationPolicy(), action) is None
    assert needs_confirmation(ConfirmationPolicy.model_validate(["mcp"]), action)
    assert needs_confirmation(ConfirmationPolicy.model_validate("always"), action)
    assert needs_confirmation(ConfirmationPolicy.model_validate(["run"]), action) is None
    shown = summary(action)
    assert shown.startswith('mcp: gh.create_issue {"title": "xxx') and shown.endswith("…")
    assert len(shown) < 240


def test_a_secret_pasted_in_where_a_placeholder_belongs_is_refused_from_every_face():
    with pytest.raises(ValidationError, match="headers.Authorization looks like a secret"):
        McpServer(url="https://h/mcp", headers={"Authorization": "Bearer ghp_abcdef123456"})
    with pytest.raises(ValidationError, match="env.GITHUB_TOKEN"):
        McpServer(command=("gh-mcp",), env={"GITHUB_TOKEN": "ghp_abcdef123456"})
    assert McpServer(command=("x",), env={"GITHUB_TOKEN": "<secret:GH>", "DEBUG": "1"})
