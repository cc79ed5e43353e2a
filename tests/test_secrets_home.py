"""I7 (docs/promises.md), the grep test: after a real session whose task, tool-call
arguments, outputs and model
errors carry secret values, no file under the home holds one but the secrets file.

Every byte of every file is read: the database with its WAL and SHM, the logs, the sandbox's
state (journal, outputs, its log) and the default workspace with the full outputs the
sandbox keeps there. Each value is looked for in every spelling a file could hold it in.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path

import pytest

from trouper import AgentState, ObservationEvent, Trouper
from trouper.testing import FakeLLMServer, load_script

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

FANCY = 'Zq"7/w\\é-Fancy-91'
"""A secret with characters JSON escapes: a quote, a slash, a backslash, a non-ASCII."""
PLAIN = "plainsecret-4f9d2c7b1a"
API_KEY = "sk-test-HOMEGREP-5e4d3c2b1a"
"""The LLM key (ASCII: it travels in an HTTP header)."""
MAX_OUTPUT = 2000
HEAD = MAX_OUTPUT // 2
"""Characters the sandbox keeps before the cut (its head is half of max_output_chars)."""


_ESCAPE = re.compile(r'\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|["\\/\'bfnrt])')
_SHORT = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _unescape_once(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        if code[0] in "ux" and len(code) > 1:
            return chr(int(code[1:], 16))
        return _SHORT.get(code, code)
    return _ESCAPE.sub(one, text)


def readings(data: bytes) -> list[str]:
    """The texts a file's bytes could hide a value in: as UTF-8 and UTF-16, then with
    JSON/Python string escapes undone, again and again (an event's raw arguments are JSON
    inside the event's JSON: two levels; a provider's error quoting them, three)."""
    texts = [data.decode("utf-8", "replace"), data.decode("utf-16-le", "replace")]
    text = texts[0]
    for _ in range(4):
        unescaped = _unescape_once(text)
        if unescaped == text:
            break
        texts.append(unescaped)
        text = unescaped
    return texts


def database_rows(db: Path) -> bytes:
    """Every text of every row, read through SQLite (a byte search could miss a value
    split across two pages)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        rows = [repr(row) for t in tables for row in conn.execute(f"SELECT * FROM {t}")]
    finally:
        conn.close()
    return "\n".join(rows).encode("utf-8")


def odd_json(value: str) -> str:
    """``value`` as a JSON string body as no ``json.dumps`` writes it: ``\\/``, and every
    other letter, the quote and non-ASCII as ``\\uXXXX`` in upper-case hex."""
    def one(i: int, c: str) -> str:
        if c == "/":
            return "\\/"
        if c == "\\":
            return "\\\\"
        if c == '"' or ord(c) > 127 or (c.isalpha() and i % 2):
            return f"\\u{ord(c):04X}"
        return c
    return "".join(one(i, c) for i, c in enumerate(value))


def script() -> list[dict]:
    quoted_fancy = "printf %s '" + FANCY + "' | wc -c"  # FANCY holds no single quote
    return [
        # the model's text beside a call, and an argument that quotes a secret in plain
        {"tool": "run", "args": {"command": f"printf %s '{PLAIN}' | wc -c"},
         "say": f"I will use {FANCY} and {PLAIN}"},
        # raw arguments: JSON escaped as json.dumps writes it, and every char as \uXXXX
        {"tool": "run", "raw_args": json.dumps({"command": quoted_fancy})},
        {"tool": "run", "raw_args": '{"command": "' + odd_json(quoted_fancy) + '"}'},
        # outputs: echo the secrets' env vars
        {"tool": "run", "args": {"command": 'printf "%s\\n" "$FANCY" "$PLAIN"'}},
        # a long output whose head/tail cut falls inside a secret, at both ends
        {"tool": "run", "args": {"command": f"printf '%0{HEAD - 3}d' 0; printf %s \"$PLAIN\"; "
                                            f"printf '%0{HEAD * 2}d' 0"}},
        {"tool": "run", "args": {"command": f"printf '%0{HEAD * 2}d' 0; printf %s \"$FANCY\"; "
                                            f"printf '%0{HEAD - len(FANCY) + 3}d' 0"}},
        # a provider error that echoes the key and a secret (retried: an LLMRetry event)
        {"tool": "think", "args": {"thought": f"thinking about {PLAIN}"},
         "fail": [{"status": 500, "message": f"bad key {API_KEY} near {FANCY}"}]},
        {"tool": "finish", "args": {"message": f"done with {FANCY}"}},
    ]


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def run_session(home: Path, steps: list[dict]) -> tuple[str, list, Path]:
    """Run a finished session under ``home``; its id, outcomes and workspace."""
    server = FakeLLMServer(load_script(steps)).start()
    llm = {"model": "hosted_vllm/scripted", "base_url": server.url, "api_key": API_KEY,
           "retry_min_wait_s": 0.05, "retry_max_wait_s": 0.05}
    try:
        with Trouper(home=home) as t:
            session = t.start_session(
                f"deploy with {FANCY} then {PLAIN}", llm=llm,
                secrets={"FANCY": FANCY, "PLAIN": PLAIN}, max_output_chars=MAX_OUTPUT)
            assert session.wait(timeout=90) == AgentState.FINISHED, session.record.state_reason
            outcomes = [e.outcome for e in session.events() if isinstance(e, ObservationEvent)]
            return session.id, outcomes, Path(session.record.config.workspace)
    finally:
        server.stop()


def leaks(home: Path, session_id: str) -> tuple[list[str], dict[str, bytes]]:
    """Where a value is under ``home`` (and in the process's Thespian log) but in the
    session's secrets file; and every source read, by name."""
    secrets_file = home / "sessions" / session_id / "secrets.json"
    thespian_log = os.environ.get("THESPLOG_FILE")  # the first Trouper of this process's
    scanned = files_under(home) + ([Path(thespian_log)] if thespian_log else [])
    sources = {str(p): p.read_bytes() for p in scanned if p != secrets_file}
    sources["rows of trouper.db"] = database_rows(home / "trouper.db")
    found = [f"{where}: {name}"
             for where, data in sources.items()
             for text in readings(data)
             for name, value in (("FANCY", FANCY), ("PLAIN", PLAIN), ("API_KEY", API_KEY))
             if value in text]
    return found, sources


def test_no_secret_value_outside_the_secrets_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    session_id, outcomes, workspace = run_session(home, script())

    # the session did what the test needs: ran the secrets (their lengths in bytes),
    # echoed both, cut two long outputs
    assert [o.content.strip() for o in outcomes[:3]] == ["22", "18", "18"]
    assert "<secret:FANCY>\n<secret:PLAIN>" in outcomes[3].content
    assert outcomes[4].elided_chars > 0 and outcomes[5].elided_chars > 0
    full_outputs = [workspace / o.full_output_path for o in outcomes[4:6] if o.full_output_path]
    assert len(full_outputs) == 2 and all(p.is_relative_to(home) for p in full_outputs)

    found, sources = leaks(home, session_id)
    assert found == []
    assert {str(home / "trouper.db"), *map(str, full_outputs)} <= set(sources)
    # the one file that holds them, and the store, are owner-only
    secrets_file = home / "sessions" / session_id / "secrets.json"
    store_files = [p for p in home.iterdir() if p.name.startswith("trouper.db")]
    modes = {p.name: p.stat().st_mode & 0o777 for p in [secrets_file, *store_files]}
    assert modes == dict.fromkeys(modes, 0o600)
    assert [d.stat().st_mode & 0o777 for d in secrets_file.parents[:2]] == [0o700, 0o700]
    # the search is real: the secrets file holds them, and the log holds placeholders
    assert all(s in secrets_file.read_bytes() for s in (PLAIN.encode(), API_KEY.encode()))
    everything = b"".join(sources.values())
    assert b"<secret:FANCY>" in everything and b"<secret:LLM_API_KEY>" in everything


ODD_OUTPUT = ("printf %s \"$FANCY\" | python3 -c 'import json, sys; "
              "print(json.dumps(sys.stdin.read()).replace(\"/\", \"\\\\/\"))'")
"""Prints FANCY as a JSON string with its slash escaped (``\\/``), as PHP or Go write it."""
UPPER_HEX_OUTPUT = (f"printf '%0{MAX_OUTPUT}d' 0; printf %s \"$FANCY\" | python3 -c 'import sys; "
                    "print(\"\".join(\"\\\\u%04X\" % ord(c) for c in sys.stdin.read()))'; "
                    f"printf '%0{MAX_OUTPUT}d' 0")
"""Prints FANCY as upper-case ``\\uXXXX`` escapes in the middle of an output that is cut."""


def test_an_output_with_an_oddly_escaped_secret_leaves_no_copy(tmp_path: Path) -> None:
    home = tmp_path / "home"
    steps = [{"tool": "run", "args": {"command": ODD_OUTPUT}},
             {"tool": "run", "args": {"command": UPPER_HEX_OUTPUT}},
             {"tool": "finish", "args": {"message": "done"}}]
    session_id, outcomes, workspace = run_session(home, steps)
    assert outcomes[0].content.strip() == '"<secret:FANCY>"'  # the log's copy is masked
    assert outcomes[1].elided_chars > 0 and outcomes[1].full_output_path
    full_output = (workspace / outcomes[1].full_output_path).read_bytes()
    assert b"<secret:FANCY>" in full_output  # the escaped spelling was there, masked
    found, _ = leaks(home, session_id)
    assert found == []


@pytest.fixture(autouse=True)
def _no_stray_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secrets reach the sandbox through the session, never through this process."""
    monkeypatch.delenv("FANCY", raising=False)
    monkeypatch.delenv("PLAIN", raising=False)
