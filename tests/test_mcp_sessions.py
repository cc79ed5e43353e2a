"""MCP servers in real sessions on the local runtime: the shipped stdio server (POSIX sh,
``testing/mcp_server.sh``) started inside the sandbox, and a streamable HTTP server (the
``mcp`` package's own) on loopback. A scripted model calls their tools; each call is
recorded once; a server killed mid-call gives ``lost`` and the session carries on."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from trouper import AgentState, Trouper
from trouper.host.processes import pid_alive
from trouper.messages.events import ActionEvent, McpToolsListed, ObservationEvent
from trouper.testing import check_log, wait_until
from trouper.testing.faults import sandbox_of
from trouper.testing.mcp_http import McpHttpServer

pytestmark = pytest.mark.slow  # real sessions

SERVER = Path(__file__).resolve().parents[1] / "testing" / "mcp_server.sh"
FINISH = {"tool": "finish", "args": {"message": "done"}}


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(SERVER, ws / "mcp_server.sh")
    return ws


def outcomes(events: list) -> dict[str, object]:
    """Tool name -> the outcome of each of its calls, in order."""
    tools = {e.action_id: e.tool for e in events if isinstance(e, ActionEvent)}
    found: dict[str, list] = {}
    for e in events:
        if isinstance(e, ObservationEvent):
            found.setdefault(tools[e.action_id], []).append(e.outcome)
    return found


def files_holding(root: Path, secret: str) -> list[Path]:
    """Files under ``root`` holding ``secret``, but the one meant to (its secrets file)."""
    return [path for path in root.rglob("*") if path.is_file()
            and path.name != "secrets.json" and secret.encode() in path.read_bytes()]


def calls_of(ws: Path) -> list[str]:
    """The server's own record: one ``<pid> <tool>`` line per call it received."""
    path = ws / "mcp-calls.log"
    return path.read_text().split("\n")[:-1] if path.exists() else []


def test_a_stdio_servers_tools_are_offered_called_once_each_and_masked(tmp_path, scripted):
    ws = workspace(tmp_path)
    steps = [{"tool": "mcp__t__echo", "args": {"text": "hello"}},
             {"tool": "mcp__t__env", "args": {"name": "MCP_KEY"}},
             {"tool": "mcp__t__fail", "args": {}}, FINISH]
    server, llm = scripted(steps)
    mcp = [{"name": "t", "command": ["sh", "mcp_server.sh"],
            "env": {"MCP_KEY": "<secret:API_TOKEN>"}}]
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("use the tools", llm=llm, workspace=ws, mcp=mcp,
                                  secrets={"API_TOKEN": "tok-1234567890"})
        assert session.wait(timeout=90) == AgentState.FINISHED
        events = list(session.events())
    offered = [tool["function"]["name"] for tool in server.requests[0].body["tools"]]
    assert offered[-4:] == ["mcp__t__echo", "mcp__t__env", "mcp__t__fail", "mcp__t__hang"]
    [listed] = [e for e in events if isinstance(e, McpToolsListed)]
    assert [tool.name for tool in listed.tools] == offered[-4:] and not listed.failed
    seen = outcomes(events)
    assert [o.content for o in seen["mcp__t__echo"]] == ["hello"]
    assert [o.content for o in seen["mcp__t__env"]] == ["<secret:API_TOKEN>"]
    assert [o.status for o in seen["mcp__t__fail"]] == ["error"]
    assert [line.split()[1] for line in calls_of(ws)] == ["echo", "env", "fail"]
    text = "".join(e.model_dump_json() for e in events)
    assert "tok-1234567890" not in text
    assert "tok-1234567890" not in str([r.body for r in server.requests])
    assert files_holding(tmp_path / "home", "tok-1234567890") == []  # store, journal, logs


def test_a_server_killed_mid_call_is_lost_never_called_again_and_the_session_goes_on(
        tmp_path, scripted):
    ws = workspace(tmp_path)
    steps = [{"tool": "mcp__t__hang", "args": {}},
             {"tool": "mcp__t__echo", "args": {"text": "after"}}, FINISH]
    _, llm = scripted(steps)
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("hang, then echo", llm=llm, workspace=ws,
                                  mcp=[{"name": "t", "command": ["sh", "mcp_server.sh"]}])
        wait_until(lambda: (ws / "mcp-hang").exists(), timeout_s=60, what="the hang call")
        first = int((ws / "mcp-server.pid").read_text())
        os.kill(first, signal.SIGKILL)
        assert session.wait(timeout=90) == AgentState.FINISHED
        events = list(session.events())
    seen = outcomes(events)
    [lost] = seen["mcp__t__hang"]
    assert lost.status == "lost" and "signal 9" in lost.content
    assert [o.content for o in seen["mcp__t__echo"]] == ["after"]
    calls = calls_of(ws)
    assert [line.split()[1] for line in calls] == ["hang", "echo"]  # hang never sent again
    assert check_log(events) == []
    assert int(calls[1].split()[0]) != first  # a fresh server took the next call


def test_a_required_server_that_fails_to_start_fails_the_setup_naming_it(
        tmp_path, scripted):
    ws = workspace(tmp_path)
    server, llm = scripted([FINISH])
    mcp = [{"name": "broken", "command": ["sh", "mcp_server.sh", "fail"]}]
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("never starts", llm=llm, workspace=ws, mcp=mcp)
        assert session.wait(timeout=60) == AgentState.ERROR
        info = session.info()
    assert "MCP server 'broken' did not start" in info.reason
    assert "exited with status 3" in info.reason and "cannot open its configuration" in (
        info.reason)
    assert not server.requests  # the model was never asked


def test_an_optional_server_that_fails_is_named_and_the_session_goes_on(tmp_path, scripted):
    ws = workspace(tmp_path)
    server, llm = scripted([{"tool": "mcp__ok__echo", "args": {"text": "hi"}}, FINISH])
    mcp = [{"name": "ok", "command": ["sh", "mcp_server.sh"]},
           {"name": "gone", "command": ["no-such-mcp-server"], "required": False}]
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("one of two", llm=llm, workspace=ws, mcp=mcp)
        assert session.wait(timeout=60) == AgentState.FINISHED
        events = list(session.events())
    [listed] = [e for e in events if isinstance(e, McpToolsListed)]
    assert "no such program" in listed.failed["gone"]
    offered = [tool["function"]["name"] for tool in server.requests[0].body["tools"]]
    assert "mcp__ok__echo" in offered and not [n for n in offered if "gone" in n]
    setup = next(e for e in events if isinstance(e, ObservationEvent))
    assert "'gone' did not start" in setup.outcome.content
    assert "[trouper ran a setup step before you started: it started the MCP servers]" in (
        str(server.requests[0].body["messages"]))


@pytest.fixture
def http_server(tmp_path: Path):
    server = McpHttpServer(tmp_path / "http", "tok-http-98765").start()
    yield server
    server.stop()


def test_an_http_server_gets_its_token_from_the_sessions_secrets(
        tmp_path, scripted, http_server):
    server, llm = scripted([{"tool": "mcp__web__echo", "args": {"text": "over http"}},
                            FINISH])
    mcp = [{"name": "web", "url": http_server.url,
            "headers": {"Authorization": "Bearer <secret:WEB_TOKEN>"}}]
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("call over http", llm=llm, workspace=tmp_path / "ws",
                                  mcp=mcp, secrets={"WEB_TOKEN": http_server.token})
        assert session.wait(timeout=90) == AgentState.FINISHED
        events = list(session.events())
        config = t.session(session.id).info()
    assert [o.content for o in outcomes(events)["mcp__web__echo"]] == ["over http"]
    assert http_server.calls() == ["echo"] and http_server.refused() == 0
    assert http_server.token not in "".join(e.model_dump_json() for e in events)
    assert http_server.token not in str(config)
    assert files_holding(tmp_path / "home", http_server.token) == []  # store, journal, logs
    offered = [tool["function"]["name"] for tool in server.requests[0].body["tools"]]
    assert offered[-2:] == ["mcp__web__echo", "mcp__web__hang"]


def test_an_http_server_that_refuses_the_token_fails_the_setup_naming_it(
        tmp_path, scripted, http_server):
    _, llm = scripted([FINISH])
    mcp = [{"name": "web", "url": http_server.url,
            "headers": {"Authorization": "Bearer <secret:WEB_TOKEN>"}}]
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("wrong token", llm=llm, workspace=tmp_path / "ws",
                                  mcp=mcp, secrets={"WEB_TOKEN": "not-the-token-123"})
        assert session.wait(timeout=60) == AgentState.ERROR
        reason = session.info().reason
    assert "MCP server 'web' did not start" in reason and "401" in reason
    assert http_server.refused() >= 1 and http_server.calls() == []


def test_an_http_server_killed_mid_call_is_lost_and_the_next_call_is_not_sent(
        tmp_path, scripted, http_server):
    _, llm = scripted([{"tool": "mcp__web__hang", "args": {}},
                       {"tool": "mcp__web__echo", "args": {"text": "x"}}, FINISH])
    mcp = [{"name": "web", "url": http_server.url,
            "headers": {"Authorization": "Bearer <secret:WEB_TOKEN>"}}]
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("hang over http", llm=llm, workspace=tmp_path / "ws",
                                  mcp=mcp, secrets={"WEB_TOKEN": http_server.token})
        wait_until(lambda: (http_server.folder / "hanging").exists(), 60, "the hang call")
        http_server.kill()
        assert session.wait(timeout=90) == AgentState.FINISHED
        events = list(session.events())
    seen = outcomes(events)
    assert [o.status for o in seen["mcp__web__hang"]] == ["lost"]
    [echo] = seen["mcp__web__echo"]
    assert echo.status == "error" and "the call was not sent" in echo.content
    assert http_server.calls() == ["hang"]
    assert check_log(events) == []


def test_a_stdio_server_dies_with_its_sandbox_server_even_when_it_ignores_its_stdin(
        tmp_path, scripted):
    ws = workspace(tmp_path)
    _, llm = scripted([{"tool": "mcp__t__echo", "args": {"text": "hi"}}, FINISH])
    mcp = [{"name": "t", "command": ["sh", "mcp_server.sh"], "env": {"MCP_LINGER": "1"}}]
    with Trouper(home=tmp_path / "home") as t:
        session = t.start_session("echo", llm=llm, workspace=ws, mcp=mcp)
        assert session.wait(timeout=60) == AgentState.FINISHED
        server = int((ws / "mcp-server.pid").read_text())
        assert pid_alive(server)
        try:
            os.kill(sandbox_of(session).server_pid(), signal.SIGKILL)  # the server alone
            wait_until(lambda: not pid_alive(server), 10, "the MCP server to die with it")
        finally:
            if pid_alive(server):
                os.kill(server, signal.SIGKILL)
