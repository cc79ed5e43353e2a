"""MCP servers in real sessions on the Docker runtime (busybox image, scripted model): the
shipped stdio server (POSIX sh, ``testing/mcp_server.sh``) started inside the session's
container through ``docker exec -i``. Its tools are offered and each call reaches it once;
a secret in its ``env`` reaches it by name, never in a docker CLI's argv; a server killed
mid-call (inside the container) gives ``lost`` and a fresh one takes the next call; a
required server that cannot start fails the setup, naming it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_mcp_sessions import calls_of, outcomes, workspace  # the same server, the same reading

from trouper import AgentState
from trouper.config.models import DockerRuntime
from trouper.messages.events import McpToolsListed
from trouper.runtimes.docker_support import LABEL_SESSION, list_containers
from trouper.testing import check_log, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.docker]

RUNTIME = DockerRuntime(image="trouper-test-busybox:latest")
FINISH = {"tool": "finish", "args": {"message": "done"}}
TOOLS = ["mcp__t__echo", "mcp__t__env", "mcp__t__fail", "mcp__t__hang"]
TOKEN = "tok-dock-5f1e9a7c3b"
"""The secret's value: distinctive, so that finding it anywhere is a leak."""


@pytest.fixture(scope="module")
def trouper(trouper_home: Path, docker_homes: Callable[[Path], Path]) -> Iterator[Any]:
    from trouper import Trouper

    docker_homes(trouper_home)
    with Trouper(home=trouper_home) as t:
        yield t


def argvs() -> list[list[str]]:
    """The argv of every process this machine shows (the containers' included)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:  # it ended meanwhile
            continue
        if raw:
            found.append(raw.decode("utf-8", "replace").split("\0")[:-1])
    return found


def server_clis() -> list[list[str]]:
    """The docker CLIs running an MCP server (``docker exec -i ... mcp_server.sh``)."""
    return [argv for argv in argvs() if argv and argv[0].endswith("docker")
            and "exec" in argv and "mcp_server.sh" in argv]


def container_of(client: Any, session: Any) -> Any:
    [container] = list_containers(client, [f"{LABEL_SESSION}={session.id}"])
    return container


def test_a_servers_tools_are_offered_called_once_each_and_its_secret_stays_out_of_argv(
        trouper, scripted, tmp_path):
    ws = workspace(tmp_path)
    steps = [{"tool": "mcp__t__echo", "args": {"text": "hello"}},
             {"tool": "mcp__t__env", "args": {"name": "MCP_KEY"}},
             {"tool": "mcp__t__fail", "args": {}}, FINISH]
    server, llm = scripted(steps)
    mcp = [{"name": "t", "command": ["sh", "mcp_server.sh"],
            "env": {"MCP_KEY": "<secret:API_TOKEN>"}}]
    session = trouper.start_session("use the tools", llm=llm, runtime=RUNTIME, workspace=ws,
                                    mcp=mcp, secrets={"API_TOKEN": TOKEN})
    assert session.wait(timeout=120) == AgentState.FINISHED
    # the server still runs: the sandbox keeps it until the settled session stands down
    # (settled_stand_down_s, minutes) or Trouper closes. Its docker CLI is there to look
    # at, and the value the server was given is in no process's argv, that CLI's included
    clis = wait_until(server_clis, 30, "the docker CLI of the MCP server")
    assert all(argv[argv.index("-e") + 1] == "MCP_KEY" for argv in clis), clis
    leaked = [argv for argv in argvs() if any(TOKEN in part for part in argv)]
    assert not leaked, leaked
    events = list(session.events())
    offered = [tool["function"]["name"] for tool in server.requests[0].body["tools"]]
    assert offered[-4:] == TOOLS
    [listed] = [e for e in events if isinstance(e, McpToolsListed)]
    assert [tool.name for tool in listed.tools] == TOOLS and not listed.failed
    seen = outcomes(events)
    assert [o.content for o in seen["mcp__t__echo"]] == ["hello"]
    # the server read the value inside the container; outcomes are masked
    assert [o.content for o in seen["mcp__t__env"]] == ["<secret:API_TOKEN>"]
    assert [o.status for o in seen["mcp__t__fail"]] == ["error"]
    assert [line.split()[1] for line in calls_of(ws)] == ["echo", "env", "fail"]
    assert TOKEN not in "".join(e.model_dump_json() for e in events)
    assert TOKEN not in str([r.body for r in server.requests])
    assert check_log(events) == []


def test_a_server_killed_mid_call_in_the_container_is_lost_and_a_fresh_one_goes_on(
        trouper, scripted, tmp_path, docker_client):
    ws = workspace(tmp_path)
    steps = [{"tool": "mcp__t__hang", "args": {}},
             {"tool": "mcp__t__echo", "args": {"text": "after"}}, FINISH]
    _, llm = scripted(steps)
    session = trouper.start_session("hang, then echo", llm=llm, runtime=RUNTIME, workspace=ws,
                                    mcp=[{"name": "t", "command": ["sh", "mcp_server.sh"]}])
    wait_until(lambda: (ws / "mcp-hang").exists(), 90, "the hang call")
    first = (ws / "mcp-server.pid").read_text().strip()
    # its pid is the container's (a pid namespace of its own): killed there, as its user
    killed = container_of(docker_client, session).exec_run(["kill", "-9", first])
    assert killed.exit_code == 0, killed.output
    assert session.wait(timeout=120) == AgentState.FINISHED
    events = list(session.events())
    seen = outcomes(events)
    [lost] = seen["mcp__t__hang"]
    assert lost.status == "lost" and "went away while the tool 'hang' ran" in lost.content
    assert "exited with status 137" in lost.content  # docker exec relays 128 + SIGKILL
    assert [o.content for o in seen["mcp__t__echo"]] == ["after"]
    calls = calls_of(ws)
    assert [line.split()[1] for line in calls] == ["hang", "echo"]  # hang never sent again
    assert calls[0].split()[0] == first and calls[1].split()[0] != first  # a fresh server
    assert check_log(events) == []


def test_a_required_server_that_fails_to_start_fails_the_setup_naming_it(
        trouper, scripted, tmp_path):
    ws = workspace(tmp_path)
    server, llm = scripted([FINISH])
    mcp = [{"name": "broken", "command": ["sh", "mcp_server.sh", "fail"]}]
    session = trouper.start_session("never starts", llm=llm, runtime=RUNTIME, workspace=ws,
                                    mcp=mcp)
    assert session.wait(timeout=120) == AgentState.ERROR
    reason = session.info().reason
    assert "MCP server 'broken' did not start" in reason, reason
    assert "exited with status 3" in reason, reason
    assert "cannot open its configuration" in reason, reason  # its stderr, from the container
    assert not server.requests  # the model was never asked
