"""No secret value is written anywhere by the sandbox: journal, outputs, outcomes, log.

The session's secret reaches the shell as an environment variable; commands print it
whole, in pieces across writes, across a soft timeout, at the head/tail cut, and an
action carries it revealed in its command. Afterwards every byte of every file under the
state folder and the workspace's ``.trouper`` is searched for it, in every spelling.
"""

from __future__ import annotations

import itertools
import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from trouper.messages.actions import ReadFile, RunCommand, WriteFile
from trouper.messages.outcomes import Outcome
from trouper.runtimes.local import LocalSandbox

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

SECRET = 's3cr3t-"tok"\\-ünï-4242'
"""Quotes, a backslash and non-ASCII: JSON spells it three different ways."""
SPELLINGS = {SECRET, json.dumps(SECRET)[1:-1], json.dumps(SECRET, ensure_ascii=False)[1:-1]}
PLACEHOLDER = "<secret:MY_TOKEN>"
_ids = itertools.count(1)


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[LocalSandbox]:
    sandbox = LocalSandbox("secrets", tmp_path / "ws", tmp_path / "rt",
                           env={"MY_TOKEN": SECRET, "NOT_SECRET": "plain-value"},
                           secret_names=("MY_TOKEN",), max_output_chars=200)
    try:
        sandbox.start(1)
        yield sandbox
    finally:
        sandbox.stop()


def run(sandbox: LocalSandbox, command: str, soft_s: float = 5.0) -> Outcome:
    return act(sandbox, RunCommand(command=command), soft_s)


def act(sandbox: LocalSandbox, action: object, soft_s: float = 5.0) -> Outcome:
    return sandbox.runtime.execute(
        f"act-{next(_ids)}", action, timeout_s=10, no_output_timeout_s=soft_s  # type: ignore[arg-type]
    )


def leaks(sandbox: LocalSandbox) -> list[str]:
    """Every file under the state folder and ``.trouper`` that holds a spelling of SECRET."""
    roots = [sandbox.state_dir, sandbox.workspace / ".trouper"]
    searched: set[str] = set()
    found = []
    for path in (p for root in roots for p in root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            searched.add(path.suffix or path.name)
            found += [f"{path}: {s!r}" for s in SPELLINGS if s.encode() in data]
    assert {".log", ".json", ".out", ".lock"} <= searched, "the search would prove nothing"
    return found


def fragments(text: str, size: int = 5) -> list[str]:
    """The pieces of SECRET (of ``size`` characters or more) that appear in ``text``."""
    return [SECRET[i : i + size] for i in range(len(SECRET) - size + 1)
            if SECRET[i : i + size] in text]


def test_secrets_in_output_commands_and_errors_are_masked(sandbox: LocalSandbox) -> None:
    assert run(sandbox, 'echo "$MY_TOKEN" "$NOT_SECRET"').content == (
        f"{PLACEHOLDER} plain-value\n"
    )
    revealed = act(sandbox, RunCommand(command=f"echo {shlex.quote(SECRET)} revealed"))
    assert revealed.content == f"{PLACEHOLDER} revealed\n"
    split = run(sandbox, 'printf %s "${MY_TOKEN:0:5}"; sleep 0.05; printf %s "${MY_TOKEN:5:6}"; '
                         'sleep 0.05; printf "%s\\n" "${MY_TOKEN:11}"')
    assert split.content == f"{PLACEHOLDER}\n"
    act(sandbox, WriteFile(path="creds.txt", content=f"token={SECRET}\n"))
    assert act(sandbox, ReadFile(path="creds.txt")).content == f"     1\ttoken={PLACEHOLDER}"
    missing = act(sandbox, ReadFile(path=f"missing-{SECRET}"))
    assert missing.content == f"No such file: missing-{PLACEHOLDER}."
    assert leaks(sandbox) == []
    records = [json.loads(line) for p in (sandbox.state_dir / "journal").glob("*.log")
               for line in p.read_text().splitlines() if line]
    commands = [r["action"].get("command") for r in records]
    assert f"echo '{PLACEHOLDER}' revealed" in commands
    assert (sandbox.workspace / "creds.txt").read_text() == f"token={SECRET}\n", "as written"


def test_a_secret_split_by_a_soft_timeout_is_held_back_then_masked_whole(
    sandbox: LocalSandbox,
) -> None:

    first = run(sandbox, 'printf "start %s" "${MY_TOKEN:0:8}"; sleep 1; '
                         'printf "%s end\\n" "${MY_TOKEN:8}"', soft_s=0.3)
    assert first.still_running and first.content.startswith("start ")
    assert SECRET[:4] not in first.content  # what might begin the secret waits for more
    rest = run(sandbox, "", soft_s=5)
    assert rest.content.startswith(f"{PLACEHOLDER} end\n") and rest.exit_code == 0
    assert leaks(sandbox) == []


def test_a_cut_never_leaves_half_a_secret(sandbox: LocalSandbox) -> None:
    # masked, each secret straddles a cut: the head's end (char 100) and the tail's start
    outcome = run(sandbox, 'printf "%097d" 0; printf %s "$MY_TOKEN"; seq 1 3000; '
                           'printf %s "$MY_TOKEN"; printf "%084d\\n" 0')
    assert outcome.elided_chars > 0 and outcome.full_output_path
    assert fragments(outcome.content) == [] and "<secret:" not in outcome.content
    full = (sandbox.workspace / outcome.full_output_path).read_text()
    assert full.count(PLACEHOLDER) == 2 and fragments(full) == []

    lines = ["x" * 90 + SECRET, *(f"line {i}" for i in range(300)), SECRET + "y" * 85]
    (sandbox.workspace / "long.txt").write_text("\n".join(lines) + "\n")
    read = act(sandbox, ReadFile(path="long.txt"))
    assert read.elided_chars > 0 and fragments(read.content) == []
    assert (sandbox.workspace / read.full_output_path).read_text().count(PLACEHOLDER) == 2
    assert leaks(sandbox) == []
