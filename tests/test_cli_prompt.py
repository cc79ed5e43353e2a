"""The approval prompt's rules, without processes: what each answer means, what is shown
above it, and that reading it ends on a signal or at the end of input."""

from __future__ import annotations

import io
import os
import pty
import select
import threading

import pytest
from rich.console import Console

from trouper.cli import approval_prompt, console
from trouper.cli.approval_prompt import WHY_PROMPT, Answer, TerminalLines, ask, body_of, parse
from trouper.messages.actions import EditFile, RunCommand, WriteFile
from trouper.messages.events import ActionEvent
from trouper.testing import wait_until


def held(action, thought: str = "") -> ActionEvent:
    return ActionEvent(action_id="a-1", turn_id="t-1", tool_call_id="c-1", tool=action.kind,
                       arguments="{}", action=action, thought=thought)


@pytest.mark.parametrize(("line", "meant"), [
    ("y", Answer(True)), ("YES", Answer(True)), ("  y  ", Answer(True)),
    ("n not on main", Answer(False, "not on main")), ("no  keep it ", Answer(False, "keep it")),
    ("n", WHY_PROMPT), ("no", WHY_PROMPT),
    ("", None), ("maybe", None), ("y please", None), ("yes no", None),
])
def test_each_answer_means_one_thing_and_anything_else_is_asked_again(line, meant):
    assert parse(line) == meant


def test_a_file_action_shows_what_it_would_write_cut_to_a_screen():
    written = body_of(held(WriteFile(path="a.py", content="\n".join(f"l{i}" for i in range(20)))))
    assert [t.plain for t in written[:2]] == ["+ l0", "+ l1"]
    assert len(written) == approval_prompt.SHOWN_LINES + 1
    assert written[-1].plain.strip() == "… 8 more lines"
    edited = body_of(held(EditFile(path="a.py", old="x = 1", new="x = 2")))
    assert [t.plain for t in edited] == ["- x = 1", "+ x = 2"]
    assert body_of(held(RunCommand(command="ls"))) == []


@pytest.fixture
def shown(monkeypatch) -> io.StringIO:
    """What the prompt prints, as plain text."""
    out = io.StringIO()
    monkeypatch.setattr(console.FirstUseConsole, "_console", Console(file=out, width=200))
    return out


@pytest.fixture
def typed():
    """``(lines, write)``: a TerminalLines on a pipe, and typing into it."""
    read_end, write_end = os.pipe()
    yield TerminalLines(read_end), lambda text: os.write(write_end, text.encode())
    for fd in (read_end, write_end):
        try:
            os.close(fd)
        except OSError:
            pass


def test_a_bare_no_asks_why_after_a_line_that_is_no_answer(shown, typed):
    lines, write = typed
    write("maybe\nn\nit deletes the cache\n")
    answer = ask(held(RunCommand(command="rm -rf cache"), "The cache is\nstale."),
                 "deletes recursively", lines, threading.Event())
    assert answer == Answer(False, "it deletes the cache")
    text = shown.getvalue()
    assert "action  run: rm -rf cache" in text and "held    deletes recursively" in text
    assert "thought The cache is stale." in text
    assert text.count("Run it?") == 2 and approval_prompt.AGAIN in text
    assert WHY_PROMPT in text


def test_a_signal_or_the_end_of_input_leaves_the_question_unanswered(shown, typed):
    lines, write = typed
    stop = threading.Event()
    stop.set()  # what Ctrl-C sets
    write("y\n")
    assert ask(held(RunCommand(command="ls")), None, lines, stop) is None
    read_end, write_end = os.pipe()
    os.write(write_end, b"y")  # no newline: no answer yet, and then Ctrl-D
    os.close(write_end)
    try:
        assert ask(held(RunCommand(command="ls")), None, TerminalLines(read_end),
                   threading.Event()) is None
    finally:
        os.close(read_end)


def test_what_was_typed_before_the_question_never_answers_it(shown):
    master, terminal = pty.openpty()
    try:
        os.write(master, b"y\n")  # pressed while the session ran
        wait_until(lambda: select.select([terminal], [], [], 0)[0], 10, "the line typed")
        lines = TerminalLines(terminal)
        lines.drop_typed_ahead()
        os.write(master, b"n too risky\n")
        assert lines.readline(threading.Event()) == "n too risky"
    finally:
        os.close(master)
        os.close(terminal)


def test_a_terminal_that_closed_under_the_question_ends_it():
    master, terminal = pty.openpty()
    os.close(master)  # the window closed: its terminal reads as ended
    try:
        assert TerminalLines(terminal).readline(threading.Event()) is None
    finally:
        os.close(terminal)
