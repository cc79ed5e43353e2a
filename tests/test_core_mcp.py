"""MCP servers in the session core, on a fake clock: listed as the last setup step, their
tools offered from the log (a restored core offers the same without listing again), a
call sent with its server's spec revealed but recorded without it, a failed or lost
listing handled, and malformed calls of a server's tool rejected with what it expects."""

from __future__ import annotations

import json
from typing import Any

from test_core_session import Clock, S, _log_of, answer, appended, call, make, only

from trouper.agent.tools import tool_specs
from trouper.core.effects import AskModel, RunAction
from trouper.core.session import SessionCore
from trouper.core.states import Why
from trouper.messages.actions import ListMcpTools, McpCall
from trouper.messages.events import ActionEvent, McpToolsListed, ObservationEvent
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import Executed, RuntimeReady

SERVERS = [{"name": "t", "command": ["sh", "server.sh"], "env": {"KEY": "<secret:TOKEN>"},
            "timeout_s": 7},
           {"name": "extra", "url": "http://127.0.0.1:9/mcp", "required": False}]
SECRET: dict[str, Any] = {"secrets": {"TOKEN": "tok-0123456789"}, "secret_names": ("TOKEN",)}
ECHO = {"name": "echo", "description": "Say it back.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                        "required": ["text"]}}


def listing(**servers: Any) -> str:
    return json.dumps({"servers": servers})


def started(**options: Any) -> tuple[SessionCore, Clock, RunAction]:
    """A new session whose sandbox is up: its listing step is the action sent."""
    core, clock = make(**SECRET, mcp=SERVERS, **options)
    core.begin(clock.now)
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=1, attached=False), clock.tick())
    return core, clock, only(effects, RunAction)


def listed(core: SessionCore, clock: Clock, run: RunAction, content: str,
           status: str = "ok") -> list[Any]:
    return core.handle(Executed(session_id="s-1", action_id=run.request.action_id,
                                outcome=Outcome(status=status, content=content)), clock.tick())


def test_the_servers_are_listed_after_the_setup_script_and_their_tools_offered_after_ours():
    core, clock = make(**SECRET, mcp=SERVERS, setup="make deps")
    core.begin(clock.now)
    effects = core.handle(RuntimeReady(session_id="s-1", epoch=1, attached=False), clock.tick())
    script = only(effects, RunAction)
    assert script.request.action.kind == "run"
    effects = core.handle(Executed(session_id="s-1", action_id=script.request.action_id,
                                   outcome=Outcome(status="ok", content="ok", exit_code=0)),
                          clock.tick())
    run = only(effects, RunAction)
    assert isinstance(run.request.action, ListMcpTools)
    assert run.request.action.servers[0].env == {"KEY": "tok-0123456789"}  # revealed to it
    effects = listed(core, clock, run, listing(t={"tools": [ECHO]}, extra={"tools": []}))
    [observation, tools] = appended(effects)
    assert isinstance(observation, ObservationEvent) and isinstance(tools, McpToolsListed)
    assert "'t' offers 1 tool: mcp__t__echo" in observation.outcome.content
    ask = only(effects, AskModel)
    names = [spec["function"]["name"] for spec in ask.request.tools]
    assert names == [*(s["function"]["name"] for s in tool_specs()), "mcp__t__echo"]
    assert ask.request.tools[-1]["function"]["parameters"] == ECHO["inputSchema"]
    setup_note = ask.request.messages[-1]["content"]
    assert "it started the MCP servers" in setup_note and "tok-" not in setup_note


def test_a_call_goes_with_its_servers_spec_revealed_and_is_recorded_without_it():
    core, clock, run = started()
    ask = only(listed(core, clock, run, listing(t={"tools": [ECHO]}, extra={"tools": []})),
               AskModel)
    effects = answer(core, ask, clock, call("mcp__t__echo", text="hi <secret:TOKEN>"))
    sent = only(effects, RunAction).request
    assert isinstance(sent.action, McpCall) and sent.timeout_s == 7
    assert sent.action.spec is not None and sent.action.spec.env == {"KEY": "tok-0123456789"}
    assert sent.action.arguments == {"text": "hi tok-0123456789"}
    [recorded] = [e for e in appended(effects) if isinstance(e, ActionEvent)]
    assert recorded.action == McpCall(server="t", tool="echo",
                                      arguments={"text": "hi <secret:TOKEN>"})
    assert "tok-0123456789" not in recorded.model_dump_json()


def test_a_restored_core_offers_the_same_tools_without_listing_again():
    core, clock, run = started()
    first = only(listed(core, clock, run, listing(t={"tools": [ECHO]}, extra={"tools": []})),
                 AskModel)
    fresh, _ = make(**SECRET, mcp=SERVERS)
    fresh.restore(_log_of(core))
    effects = fresh.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True),
                           clock.tick())
    assert not [e for e in effects if isinstance(e, RunAction)]
    assert only(effects, AskModel).request.tools == first.request.tools


def test_a_required_server_that_did_not_start_fails_the_setup_naming_it():
    core, clock, run = started()
    effects = listed(core, clock, run, listing(
        t={"error": "its process exited with status 3; its stderr ends: no config"},
        extra={"tools": []}))
    assert core.view.state == S.ERROR and core.view.cause == Why.SETUP_FAILED
    assert "The MCP server 't' did not start: its process exited with status 3" in (
        core.view.reason)
    assert not [e for e in effects if isinstance(e, AskModel)]


def test_an_optional_server_that_did_not_start_is_named_and_the_session_goes_on():
    core, clock, run = started()
    effects = listed(core, clock, run, listing(t={"tools": [ECHO]},
                                               extra={"error": "cannot connect"}))
    assert core.view.state == S.RUNNING
    tools = next(e for e in appended(effects) if isinstance(e, McpToolsListed))
    assert tools.failed == {"extra": "cannot connect"}
    assert "optional" in appended(effects)[0].outcome.content
    only(effects, AskModel)


def test_a_listing_lost_with_its_sandbox_is_asked_again_under_a_new_id():
    core, clock, run = started()
    effects = listed(core, clock, run, "", status="lost")
    again = only(effects, RunAction)
    assert isinstance(again.request.action, ListMcpTools)
    assert again.request.action_id != run.request.action_id and core.view.state == S.RUNNING
    effects = listed(core, clock, again, listing(t={"tools": [ECHO]}, extra={"tools": []}))
    only(effects, AskModel)


def test_malformed_calls_of_a_servers_tool_are_rejected_saying_what_it_expects():
    core, clock, run = started()
    ask = only(listed(core, clock, run, listing(t={"tools": [ECHO]}, extra={"tools": []})),
               AskModel)
    effects = answer(core, ask, clock, call("mcp__t__echo"), call("mcp__t__nope"))
    rejected = [e.outcome for e in appended(effects) if isinstance(e, ObservationEvent)]
    assert [o.status for o in rejected] == ["rejected", "rejected"]
    assert "missing required argument 'text'" in rejected[0].content
    assert "unknown tool 'mcp__t__nope'" in rejected[1].content
    assert "mcp__t__echo" in rejected[1].content  # the tools it may call
    assert not [e for e in effects if isinstance(e, RunAction)]


def test_listings_lost_again_and_again_fail_the_setup_instead_of_looping():
    core, clock, run = started()
    for _ in range(2):  # asked again twice
        run = only(listed(core, clock, run, "", status="lost"), RunAction)
        assert isinstance(run.request.action, ListMcpTools)
    effects = listed(core, clock, run, "", status="lost")
    assert not [e for e in effects if isinstance(e, RunAction)]
    assert core.view.state == S.ERROR and core.view.cause == Why.SETUP_FAILED
    assert "the start of the MCP servers (lost)" in core.view.reason
