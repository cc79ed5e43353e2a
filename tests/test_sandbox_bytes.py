"""Any bytes a command prints (I6 in docs/promises.md): valid text for the agent and the
journal, the raw bytes
(secrets masked) in the full-output file. Driven through a real sandbox server."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import pytest

from trouper.messages.actions import RunCommand
from trouper.messages.outcomes import Outcome
from trouper.runtimes.local import LocalSandbox

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

_ids = itertools.count(1)
ODD_PRINTF = r"printf '\xff\xfe\xed\xa0\x80abc\x00'"
ODD_BYTES = b"\xff\xfe\xed\xa0\x80abc\x00"
"""What it prints: two bytes no UTF-8 has, an encoded surrogate (a CESU-8 lone one), a NUL."""
TOKEN = "pässwörd-Tok42"


def run(sandbox: LocalSandbox, command: str) -> Outcome:
    action = RunCommand(command=command)
    return sandbox.runtime.execute(f"act-{next(_ids)}", action, timeout_s=30.0,
                                   no_output_timeout_s=20.0)


def assert_valid_everywhere(sandbox: LocalSandbox, outcome: Outcome) -> None:
    """The outcome is text any store takes, and so is every journal record."""
    outcome.content.encode("utf-8")  # strict: no lone surrogate got through
    records = [*sandbox.state_dir.rglob("*.json"), *sandbox.state_dir.glob("journal/*.log")]
    assert any(p.parent.name == "journal" for p in records)
    for record in records:
        text = record.read_bytes().decode("utf-8")  # strict
        for line in filter(None, text.splitlines()):  # a journal's records are JSON lines
            json.dumps(json.loads(line), ensure_ascii=False).encode("utf-8")


def test_binary_output_is_valid_text_and_its_raw_bytes_are_kept(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:
    sandbox = make_sandbox(max_output_chars=2000)
    assert run(sandbox, "head -c 200000 /dev/urandom > rand.bin").status == "ok"
    outcome = run(sandbox, f"cat rand.bin; {ODD_PRINTF}")
    assert (outcome.status, outcome.exit_code) == ("ok", 0)
    assert outcome.content.endswith("\ufffd" * 5 + "abc\x00")  # one U+FFFD per bad byte
    assert outcome.elided_chars > 0 and outcome.full_output_path
    assert_valid_everywhere(sandbox, outcome)
    full = (sandbox.workspace / outcome.full_output_path).read_bytes()
    random_bytes = (sandbox.workspace / "rand.bin").read_bytes()
    assert len(full) == 200_009 and full == random_bytes + ODD_BYTES


def test_a_storm_of_escapes_and_nuls_is_kept_as_it_came(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:
    sandbox = make_sandbox(max_output_chars=1000)
    outcome = run(sandbox, "head -c 300000 /dev/zero | tr '\\0' '\\033'; head -c 1000 /dev/zero")
    assert (outcome.status, outcome.exit_code) == ("ok", 0)
    assert outcome.content.startswith("\x1b" * 500) and outcome.content.endswith("\x00" * 500)
    assert outcome.elided_chars == 301_000 - 1000
    assert_valid_everywhere(sandbox, outcome)
    full = (sandbox.workspace / outcome.full_output_path).read_bytes()
    assert full == b"\x1b" * 300_000 + b"\x00" * 1000


def test_secrets_are_masked_in_the_raw_bytes_next_to_bad_ones(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:

    sandbox = make_sandbox(max_output_chars=200, env={"TOKEN": TOKEN})
    outcome = run(sandbox, (
        "head -c 3000 /dev/zero | tr '\\0' x; printf '\\xe2'; printf %s \"$TOKEN\"; "
        "printf '\\xff\\xc3'; printf %s \"$TOKEN\" | python3 -c 'import json, sys; "
        "print(json.dumps(sys.stdin.read()))'; head -c 3000 /dev/zero | tr '\\0' y"))
    assert outcome.status == "ok" and TOKEN not in outcome.content
    full = (sandbox.workspace / outcome.full_output_path).read_bytes()
    # the value's UTF-8 bytes after a truncated sequence, and its \\u-escaped spelling
    assert full == (b"x" * 3000 + b"\xe2<secret:TOKEN>\xff\xc3" + b'"<secret:TOKEN>"\n'
                    + b"y" * 3000)
    journal = b"".join(p.read_bytes() for p in sandbox.state_dir.rglob("*") if p.is_file())
    assert TOKEN.encode() not in journal and b"<secret:TOKEN>" in journal


def test_only_a_command_that_prints_gets_an_output_file(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:
    """The output file is made at the first byte: a silent command costs no file (a new
    inode per action is dear on some filesystems), and one that prints keeps it whole."""
    sandbox = make_sandbox(max_output_chars=100)
    before = set(sandbox.state_dir.rglob("*.out"))
    assert run(sandbox, "true > /dev/null").content == "(no output)"
    assert set(sandbox.state_dir.rglob("*.out")) == before
    outcome = run(sandbox, "seq 1 500")
    (made,) = set(sandbox.state_dir.rglob("*.out")) - before
    assert made.read_text().split() == [str(i) for i in range(1, 501)]
    full = (sandbox.workspace / outcome.full_output_path).read_text()
    assert full.split() == [str(i) for i in range(1, 501)]
