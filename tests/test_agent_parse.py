"""The default agent's tool specs and the parsing of model responses into actions."""

from __future__ import annotations

import itertools
import json

import pytest

from trouper.agent.parse import ParsedCall, parse_response
from trouper.agent.tools import TOOL_MODELS, argument_summary, tool_specs
from trouper.messages.actions import EditFile, Finish, ReadFile, RunCommand, Think, WriteFile
from trouper.messages.protocol import ToolCall

RUN_EXPECTED = (
    "Expected arguments: command (string), timeout_s (number, optional), "
    "interrupt (boolean, optional)."
)


def ids():
    counter = itertools.count(1)
    return lambda: f"a{next(counter)}"


def parse_one(name: str, arguments: str, call_id: str = "c1") -> ParsedCall:
    [parsed] = parse_response(
        "t1", "", [ToolCall(id=call_id, name=name, arguments=arguments)], ids()
    )
    return parsed


def rejection_of(name: str, arguments: str) -> str:
    parsed = parse_one(name, arguments)
    assert parsed.event.action is None
    assert parsed.rejection is not None and parsed.rejection.status == "rejected"
    return parsed.rejection.content


# ---- tool specs ----


def test_specs_name_every_tool_in_order():
    names = [spec["function"]["name"] for spec in tool_specs()]
    assert names == ["run", "read_file", "write_file", "edit_file", "think", "finish"]
    assert all(spec["type"] == "function" for spec in tool_specs())


def test_specs_are_cached():
    assert tool_specs() is tool_specs()


def test_run_spec_is_exact_and_described():
    [run] = [s["function"] for s in tool_specs() if s["function"]["name"] == "run"]
    params = run["parameters"]
    assert params["required"] == ["command"]
    assert params["additionalProperties"] is False
    assert {k: v["type"] for k, v in params["properties"].items()} == {
        "command": "string",
        "timeout_s": "number",
        "interrupt": "boolean",
    }
    assert params["properties"]["interrupt"]["default"] is False
    assert "empty" in params["properties"]["command"]["description"]
    for word in ("Soft", "Hard", "persist", "full text"):
        assert word in run["description"]


@pytest.mark.parametrize("spec", tool_specs(), ids=lambda s: s["function"]["name"])
def test_spec_matches_its_model(spec):
    function = spec["function"]
    model = TOOL_MODELS[function["name"]]
    fields = {name for name in model.model_fields if name != "kind"}
    params = function["parameters"]
    assert set(params["properties"]) == fields
    assert "kind" not in params["required"]
    assert function["description"]
    for prop in params["properties"].values():
        assert prop["description"] and "title" not in prop and "anyOf" not in prop
    json.dumps(spec)  # serialisable as sent to litellm


def test_argument_summary():
    assert argument_summary("edit_file") == "path (string), old (string), new (string)"
    assert argument_summary("read_file") == (
        "path (string), start_line (integer, optional), end_line (integer, optional)"
    )


# ---- valid calls ----


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("run", {"command": "ls"}, RunCommand(command="ls")),
        (
            "run",
            {"command": "", "timeout_s": 5, "interrupt": True},
            RunCommand(command="", timeout_s=5.0, interrupt=True),
        ),
        ("read_file", {"path": "a.py", "start_line": 2}, ReadFile(path="a.py", start_line=2)),
        ("write_file", {"path": "a", "content": "x"}, WriteFile(path="a", content="x")),
        ("edit_file", {"path": "a", "old": "x", "new": ""}, EditFile(path="a", old="x", new="")),
        ("think", {"thought": "hmm"}, Think(thought="hmm")),
        ("finish", {"message": "done"}, Finish(message="done")),
    ],
)
def test_valid_call_gives_action(name, arguments, expected):
    parsed = parse_one(name, json.dumps(arguments))
    assert parsed.rejection is None
    assert parsed.event.action == expected


def test_null_for_optional_argument_is_accepted():
    parsed = parse_one("run", '{"command": "ls", "timeout_s": null}')
    assert parsed.event.action == RunCommand(command="ls")


def test_multi_tool_turn():
    calls = [
        ToolCall(id="c1", name="run", arguments='{"command": "ls"}'),
        ToolCall(id="c2", name="nope", arguments="{}"),
        ToolCall(id="c3", name="think", arguments='{"thought": "x"}'),
    ]
    parsed = parse_response("turn-9", "Let me look.", calls, ids())
    events = [p.event for p in parsed]
    assert [e.action_id for e in events] == ["a1", "a2", "a3"]
    assert [e.tool_call_id for e in events] == ["c1", "c2", "c3"]
    assert {e.turn_id for e in events} == {"turn-9"}
    assert [e.thought for e in events] == ["Let me look.", "", ""]
    assert [e.tool for e in events] == ["run", "nope", "think"]
    assert [p.rejection is None for p in parsed] == [True, False, True]
    assert events[1].arguments == "{}"


def test_missing_and_duplicate_call_ids_are_generated():
    calls = [
        ToolCall(id="", name="think", arguments='{"thought": "a"}'),
        ToolCall(id="same", name="think", arguments='{"thought": "b"}'),
        ToolCall(id="same", name="think", arguments='{"thought": "c"}'),
    ]
    parsed = parse_response("t", "", calls, ids())
    assert [p.event.tool_call_id for p in parsed] == ["call_a1", "same", "call_a3"]


def test_no_content_no_calls_gives_empty_list():
    assert parse_response("t", "", [], ids()) == []
    assert parse_response("t", "just text", [], ids()) == []


def test_raw_arguments_are_kept_as_sent():
    raw = '{ "command" : "echo hi" }'
    assert parse_one("run", raw).event.arguments == raw


# ---- malformed calls ----


def test_missing_argument():
    assert rejection_of("edit_file", '{"path": "x.py", "new": "y"}') == (
        "edit_file: missing required argument 'old'. "
        "Expected arguments: path (string), old (string), new (string)."
    )


def test_extra_argument():
    assert rejection_of("run", '{"command": "ls", "cwd": "/"}') == (
        f"run: unexpected argument 'cwd'. {RUN_EXPECTED}"
    )


def test_kind_is_not_an_argument():
    content = rejection_of("run", '{"command": "ls", "kind": "run"}')
    assert "unexpected argument 'kind'" in content


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ('{"command": 5}', "argument 'command' must be a string, got a number 5"),
        ('{"command": null}', "argument 'command' must be a string, got null"),
        ('{"command": ["ls"]}', "argument 'command' must be a string, got an array [\"ls\"]"),
        ('{"command": "ls", "timeout_s": "abc"}', "argument 'timeout_s' must be a number"),
        ('{"command": "ls", "interrupt": "maybe"}', "argument 'interrupt' must be a boolean"),
        ('{"command": "ls", "timeout_s": 0}', "argument 'timeout_s' must be a positive number"),
        ('{"command": "ls", "timeout_s": -3}', "argument 'timeout_s' must be a positive number"),
    ],
)
def test_wrong_type_or_value(arguments, problem):
    content = rejection_of("run", arguments)
    assert content.startswith(f"run: {problem}")
    assert content.endswith(RUN_EXPECTED)


def test_wrong_integer():
    content = rejection_of("read_file", '{"path": "a", "start_line": 1.5}')
    assert "argument 'start_line' must be an integer, got a number 1.5" in content


def test_several_problems_are_all_reported():
    content = rejection_of("edit_file", '{"path": 1, "extra": true}')
    for problem in (
        "unexpected argument 'extra'",
        "argument 'path' must be a string",
        "missing required argument 'old'",
        "missing required argument 'new'",
    ):
        assert problem in content


@pytest.mark.parametrize("arguments", ["{bad json", '{"command": "ls"', "ls -la", "{'a': 1}"])
def test_not_json(arguments):
    content = rejection_of("run", arguments)
    assert content.startswith("run: the arguments are not valid JSON (")
    assert content.endswith(RUN_EXPECTED)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_not_json(constant):
    content = rejection_of("run", f'{{"command": "ls", "timeout_s": {constant}}}')
    assert "not valid JSON" in content


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [("[1, 2]", "an array"), ('"ls"', "a string"), ("3", "a number"), ("null", "null")],
)
def test_not_an_object(arguments, kind):
    assert rejection_of("run", arguments) == (
        f"run: the arguments must be a JSON object, got {kind}. {RUN_EXPECTED}"
    )


def test_empty_arguments_count_as_no_arguments():
    assert rejection_of("finish", "  ") == (
        "finish: missing required argument 'message'. Expected arguments: message (string)."
    )


def test_unknown_tool():
    assert rejection_of("bash", '{"command": "ls"}') == (
        "unknown tool 'bash'. Available tools: run, read_file, write_file, edit_file, "
        "think, finish."
    )


def test_missing_tool_name():
    assert rejection_of("", "{}").startswith("the tool call has no tool name. Available tools:")


def test_rejected_call_keeps_raw_input_and_thought():
    [parsed] = parse_response("t", "thinking", [ToolCall(id="c", name="x y", arguments="{")], ids())
    assert parsed.event.tool == "x y"
    assert parsed.event.arguments == "{"
    assert parsed.event.thought == "thinking"
    assert parsed.event.action is None


def test_long_values_are_shortened_in_errors():
    content = rejection_of("run", json.dumps({"command": ["x" * 500]}))
    assert "..." in content and len(content) < 300


def test_deeply_nested_arguments_never_raise():
    content = rejection_of("run", "[" * 100_000 + "]" * 100_000)
    assert content.startswith("run: the arguments")


def test_one_registry_of_tools_and_the_unions_agree():
    """``messages/actions.py`` is the one place a tool is defined: its unions, the tool
    specs and the runtime kinds all follow ``ACTIONS``."""
    import typing

    from trouper.messages.actions import (
        ACTIONS,
        OFFERED_ACTIONS,
        RUNTIME_KINDS,
        SETUP_ACTIONS,
        Action,
        RuntimeAction,
        kind_of,
    )

    def members(union: object) -> set[type]:
        return set(typing.get_args(typing.get_args(union)[0]))

    every = (*ACTIONS, *SETUP_ACTIONS, *OFFERED_ACTIONS)
    assert members(Action) == set(every)
    assert members(RuntimeAction) == {m for m in every if m.in_sandbox}
    assert RUNTIME_KINDS == {kind_of(m) for m in members(RuntimeAction)}
    assert [s["function"]["name"] for s in tool_specs()] == [kind_of(m) for m in ACTIONS]
    assert all(s["function"]["description"] for s in tool_specs())


def test_the_model_cannot_call_a_setup_action():
    content = rejection_of("clone", '{"url": "https://example.test/r.git"}')
    assert "clone" in content and "unknown" in content.lower()
