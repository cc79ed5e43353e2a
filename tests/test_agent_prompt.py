"""Building the model's messages from a session log, and AGENTS.md loading."""

from __future__ import annotations

import logging
import os

import pytest

from trouper.agent.prompt import (
    DEFAULT_SYSTEM_PROMPT,
    PromptBuilder,
    build_messages,
    load_workspace_instructions,
    render_outcome,
)
from trouper.messages.actions import RunCommand
from trouper.messages.events import (
    ActionEvent,
    AgentState,
    LLMCompleted,
    LLMRetry,
    MessageEvent,
    ObservationEvent,
    RuntimeEvent,
    StateChanged,
)
from trouper.messages.outcomes import Outcome


def user(text):
    return MessageEvent(source="user", text=text)


def action(action_id, turn_id="t1", thought="", command="ls"):
    return ActionEvent(
        action_id=action_id,
        turn_id=turn_id,
        tool_call_id=f"call-{action_id}",
        tool="run",
        arguments=f'{{"command": "{command}"}}',
        action=RunCommand(command=command),
        thought=thought,
    )


def observe(action_id, content="out", **fields):
    return ObservationEvent(
        action_id=action_id, outcome=Outcome(status="ok", content=content, **fields)
    )


STATUS_EVENTS = [
    StateChanged(state=AgentState.RUNNING),
    LLMCompleted(request_id="r", model="m"),
    LLMRetry(request_id="r", attempt=2, max_attempts=3, wait_s=1, error_class="x", message="y"),
    RuntimeEvent(phase="restarted", epoch=2),
]


def roles(messages):
    return [m["role"] for m in messages]


# ---- structure ----


def test_system_prompt_and_instructions():
    [system] = build_messages([])
    assert system == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    [system] = build_messages([], system_prompt="Be brief.", workspace_instructions="Use uv.")
    assert system["content"].startswith("Be brief.\n\n## ")
    assert "AGENTS.md" in system["content"] and system["content"].endswith("Use uv.")


def test_default_prompt_mentions_the_essentials():
    for word in ("workspace", "persistent", "truncated", "finish"):
        assert word in DEFAULT_SYSTEM_PROMPT


def test_user_and_agent_messages():
    events = [user("fix it"), MessageEvent(source="agent", text="Which test?"), user("foo")]
    assert build_messages(events)[1:] == [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "Which test?"},
        {"role": "user", "content": "foo"},
    ]


def test_one_turn_with_several_calls():
    events = [
        user("go"),
        action("a1", thought="Looking around."),
        action("a2", command="pwd"),
        observe("a1", "file.py"),
        observe("a2", "/ws"),
    ]
    assert build_messages(events)[2:] == [
        {
            "role": "assistant",
            "content": "Looking around.",
            "tool_calls": [
                {
                    "id": "call-a1",
                    "type": "function",
                    "function": {"name": "run", "arguments": '{"command": "ls"}'},
                },
                {
                    "id": "call-a2",
                    "type": "function",
                    "function": {"name": "run", "arguments": '{"command": "pwd"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call-a1", "content": "file.py"},
        {"role": "tool", "tool_call_id": "call-a2", "content": "/ws"},
    ]


def test_tool_messages_follow_call_order_not_outcome_order():
    events = [action("a1"), action("a2"), observe("a2", "second"), observe("a1", "first")]
    messages = build_messages(events)
    assert messages[1]["content"] is None
    assert [m["content"] for m in messages[2:]] == ["first", "second"]


def test_consecutive_turns():
    events = [user("go"), action("a1"), observe("a1"), action("a2", turn_id="t2"), observe("a2")]
    expected = ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert roles(build_messages(events)) == expected


def test_user_message_between_actions_and_outcomes_goes_after_tool_messages():
    events = [
        user("go"),
        action("a1"),
        action("a2"),
        observe("a1"),
        user("also check the docs"),
        observe("a2"),
        action("a3", turn_id="t2"),
        observe("a3"),
    ]
    messages = build_messages(events)
    assert roles(messages) == [
        "system", "user", "assistant", "tool", "tool", "user", "assistant", "tool",
    ]  # fmt: skip
    assert messages[5]["content"] == "also check the docs"


def test_action_of_the_same_turn_after_an_interleaved_message_joins_its_turn():
    events = [action("a1"), user("hey"), action("a2"), observe("a1"), observe("a2")]
    messages = build_messages(events)
    assert roles(messages) == ["system", "assistant", "tool", "tool", "user"]
    assert len(messages[1]["tool_calls"]) == 2


def test_status_events_never_appear():
    events = [STATUS_EVENTS[0], user("go"), *STATUS_EVENTS, action("a1"), *STATUS_EVENTS]
    events += [observe("a1"), *STATUS_EVENTS]
    clean = [e for e in events if not e.is_status]
    assert build_messages(events) == build_messages(clean)
    assert roles(build_messages(events)) == ["system", "user", "assistant", "tool"]


def test_action_without_outcome_is_left_out_with_its_call():
    events = [user("go"), action("a1", thought="two things"), action("a2"), observe("a2")]
    messages = build_messages(events)
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call-a2"]
    assert roles(messages) == ["system", "user", "assistant", "tool"]


def test_turn_without_any_outcome_keeps_only_its_thought():
    assert build_messages([user("go"), action("a1", thought="plan")])[2:] == [
        {"role": "assistant", "content": "plan"}
    ]
    assert roles(build_messages([user("go"), action("a1")])) == ["system", "user"]


def test_unknown_or_second_outcome_is_ignored(caplog):
    events = [action("a1"), observe("a1", "first"), observe("a1", "again"), observe("zz")]
    with caplog.at_level(logging.WARNING):
        messages = build_messages(events)
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["first"]
    assert "zz" in caplog.text


def test_empty_messages_are_skipped():
    assert roles(build_messages([user(""), MessageEvent(source="agent", text="")])) == ["system"]


# ---- incremental builder ----


def session_log():
    events = [user("task")]
    for turn in range(30):
        ids = [f"a{turn}-{i}" for i in range(turn % 3 + 1)]
        events += [action(i, turn_id=f"t{turn}", thought=f"step {turn}") for i in ids]
        events += STATUS_EVENTS[:2]
        if turn % 7 == 3:
            events.append(user(f"interjection {turn}"))
        events += [observe(i, f"out {i}") for i in reversed(ids)]
        if turn % 5 == 0:
            events.append(MessageEvent(source="agent", text=f"note {turn}"))
    return events


def test_incremental_builder_equals_one_shot_build_at_every_step():
    events = session_log()
    builder = PromptBuilder(system_prompt="sys")
    for count, event in enumerate(events, start=1):
        builder.add(event)
        assert builder.messages() == build_messages(events[:count], system_prompt="sys")


def test_builder_keeps_settled_messages_and_only_renders_the_tail():
    builder = PromptBuilder()
    builder.extend(session_log())
    messages = builder.messages()
    assert builder.messages() is messages
    assert len(builder._tail) <= 1  # everything before the latest turn is settled
    first_tool = next(m for m in messages if m["role"] == "tool")
    builder.add(user("more"))
    assert builder.messages() is messages and first_tool in messages


# ---- rendering outcomes ----


@pytest.mark.parametrize(
    ("outcome", "text"),
    [
        (Outcome(status="ok", content="hello"), "hello"),
        (Outcome(status="ok", content="", exit_code=0), "[no output]"),
        (Outcome(status="ok", content="boom\n[exit code 2]", exit_code=2), "boom\n[exit code 2]"),
        (
            Outcome(status="error", content="partial", timed_out="hard", exit_code=-9),
            "partial",
        ),
        (
            Outcome(status="ok", content="...", timed_out="soft", still_running=True),
            "...",
        ),
        (Outcome(status="ok", content="x", still_running=True), "x"),
        (Outcome(status="rejected", content="run: bad"), "[rejected]\nrun: bad"),
        (Outcome(status="interrupted", content=""), "[interrupted]"),
        (Outcome(status="error", content="no such file: a"), "[error]\nno such file: a"),
        (
            Outcome(status="ok", content="head\ntail", elided_chars=5000, full_output_path="o/1"),
            "head\ntail",
        ),
        (Outcome(status="ok", content="h", elided_chars=7), "h"),
    ],
)
def test_render_outcome(outcome, text):
    assert render_outcome(outcome) == text


def test_render_lost_outcome_in_prompt():
    events = [
        action("a1"),
        ObservationEvent(action_id="a1", outcome=Outcome(status="lost", content="")),
    ]
    content = build_messages(events)[2]["content"]
    assert content.startswith("[lost: ") and "not run again" in content


# ---- AGENTS.md ----


def test_no_agents_md(tmp_path):
    assert load_workspace_instructions(tmp_path) is None
    assert load_workspace_instructions(tmp_path / "missing") is None


def test_agents_md_is_read(tmp_path):
    (tmp_path / "AGENTS.md").write_text("Run `make test`.\n", encoding="utf-8")
    assert load_workspace_instructions(tmp_path) == "Run `make test`."


def test_long_agents_md_is_truncated_with_a_note(tmp_path):
    (tmp_path / "AGENTS.md").write_text("x" * 500, encoding="utf-8")
    text = load_workspace_instructions(tmp_path, max_chars=100)
    assert text.startswith("x" * 100 + "\n\n[AGENTS.md is longer than 100 characters")
    assert "x" * 101 not in text


def test_empty_agents_md_gives_none(tmp_path):
    (tmp_path / "AGENTS.md").write_text("  \n", encoding="utf-8")
    assert load_workspace_instructions(tmp_path) is None


def test_agents_md_that_is_a_folder_warns(tmp_path, caplog):
    (tmp_path / "AGENTS.md").mkdir()
    with caplog.at_level(logging.WARNING):
        assert load_workspace_instructions(tmp_path) is None
    assert "AGENTS.md" in caplog.text


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_agents_md_warns(tmp_path, caplog):
    path = tmp_path / "AGENTS.md"
    path.write_text("secret rules", encoding="utf-8")
    path.chmod(0)
    try:
        with caplog.at_level(logging.WARNING):
            assert load_workspace_instructions(tmp_path) is None
    finally:
        path.chmod(0o600)
    assert "cannot read" in caplog.text


def test_agents_md_with_bad_bytes_is_still_read(tmp_path):
    (tmp_path / "AGENTS.md").write_bytes(b"use \xff tabs")
    assert load_workspace_instructions(tmp_path) == "use \ufffd tabs"
