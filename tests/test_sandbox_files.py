"""File tools of the sandbox: confinement to the workspace, precise errors, truncation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trouper.messages.actions import EditFile, ReadFile, WriteFile
from trouper.runtimes.local import LocalSandbox
from trouper.runtimes.sandbox import files
from trouper.runtimes.sandbox.files import FileError

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


def test_read_file_numbers_lines_and_reads_ranges(ws: Path) -> None:
    (ws / "a.txt").write_text("one\ntwo\nthree\n")
    assert files.read_file(str(ws), "a.txt") == "     1\tone\n     2\ttwo\n     3\tthree"
    assert (
        files.read_file(str(ws), str(ws / "a.txt"), 2, 2)
        == "     2\ttwo\n[lines 2-2 of 3 in " + str(ws / "a.txt") + "]"
    )
    assert files.read_file(str(ws), "a.txt", start_line=3, end_line=99).startswith("     3\tthree")
    with pytest.raises(FileError, match="past the end of a.txt \\(3 lines\\)"):
        files.read_file(str(ws), "a.txt", start_line=4)
    with pytest.raises(FileError, match="before start_line"):
        files.read_file(str(ws), "a.txt", start_line=2, end_line=1)
    with pytest.raises(FileError, match="1 or more"):
        files.read_file(str(ws), "a.txt", start_line=0)
    (ws / "empty.txt").write_text("")
    assert files.read_file(str(ws), "empty.txt") == "(empty.txt is empty)"


def test_read_file_errors_are_precise(ws: Path) -> None:
    (ws / "dir").mkdir()
    (ws / "blob.bin").write_bytes(b"\x7fELF\x00\x01\x02")
    (ws / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(FileError, match="No such file: nope.txt"):
        files.read_file(str(ws), "nope.txt")
    with pytest.raises(FileError, match="dir is a directory"):
        files.read_file(str(ws), "dir")
    with pytest.raises(FileError, match="binary"):
        files.read_file(str(ws), "blob.bin")
    with pytest.raises(FileError, match="not UTF-8 text \\(invalid byte 0xe9 at offset 3\\)"):
        files.read_file(str(ws), "latin1.txt")


def test_write_file_creates_parents_and_overwrites(ws: Path) -> None:
    assert files.write_file(str(ws), "deep/er/new.py", "x = 1\n").startswith("Created deep/er")
    assert (ws / "deep/er/new.py").read_text() == "x = 1\n"
    assert files.write_file(str(ws), "deep/er/new.py", "x = 2").startswith("Overwrote")
    assert (ws / "deep/er/new.py").read_text() == "x = 2"
    with pytest.raises(FileError, match="is a directory"):
        files.write_file(str(ws), "deep", "no")


def test_edit_file_replaces_exactly_one_occurrence(ws: Path) -> None:
    target = ws / "m.py"
    target.write_text("a = 1\nb = 2\nb = 2\n")
    assert files.edit_file(str(ws), "m.py", "a = 1", "a = 10") == (
        "Edited m.py: replaced 1 occurrence starting at line 1."
    )
    assert target.read_text() == "a = 10\nb = 2\nb = 2\n"
    with pytest.raises(FileError, match="Found 0 occurrences"):
        files.edit_file(str(ws), "m.py", "c = 3", "c = 4")
    with pytest.raises(FileError, match="Found 2 occurrences"):
        files.edit_file(str(ws), "m.py", "b = 2", "b = 3")
    with pytest.raises(FileError, match="must not be empty"):
        files.edit_file(str(ws), "m.py", "", "x")
    assert target.read_text() == "a = 10\nb = 2\nb = 2\n"


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "sub/../../outside.txt"])
def test_paths_outside_the_workspace_are_refused(ws: Path, path: str) -> None:
    (ws.parent / "outside.txt").write_text("secret")
    for call in (
        lambda: files.read_file(str(ws), path),
        lambda: files.write_file(str(ws), path, "pwned"),
        lambda: files.edit_file(str(ws), path, "secret", "pwned"),
    ):
        with pytest.raises(FileError, match="outside the workspace"):
            call()
    assert (ws.parent / "outside.txt").read_text() == "secret"


def test_symlinks_are_refused_even_inside_the_workspace(ws: Path) -> None:
    outside = ws.parent / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("secret")
    (ws / "link.txt").symlink_to(outside / "f.txt")
    (ws / "linkdir").symlink_to(outside)
    with pytest.raises(FileError, match="through a symlink"):
        files.read_file(str(ws), "link.txt")
    with pytest.raises(FileError, match="through a symlink"):
        files.write_file(str(ws), "linkdir/new.txt", "pwned")
    assert not (outside / "new.txt").exists()
    # Policy: no symlink is followed, not even one that stays inside (simplest and safe).
    (ws / "inner.txt").write_text("fine\n")
    (ws / "ok-link").symlink_to(ws / "inner.txt")
    with pytest.raises(FileError, match="even ones that stay inside the workspace"):
        files.read_file(str(ws), "ok-link")
    assert files.read_file(str(ws), "inner.txt") == "     1\tfine"


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[LocalSandbox]:
    sandbox = LocalSandbox("files-test", tmp_path / "ws", tmp_path / "rt", max_output_chars=200)
    try:
        sandbox.start(1)
        yield sandbox
    finally:
        sandbox.stop()


def test_file_actions_through_the_runtime(sandbox: LocalSandbox) -> None:
    runtime = sandbox.runtime
    limits = {"timeout_s": 10.0, "no_output_timeout_s": 5.0}
    wrote = runtime.execute("w1", WriteFile(path="src/x.py", content="v = 1\n"), **limits)
    assert wrote.status == "ok" and wrote.exit_code is None
    edited = runtime.execute("e1", EditFile(path="src/x.py", old="v = 1", new="v = 2"), **limits)
    assert edited.status == "ok"
    read = runtime.execute("r1", ReadFile(path="src/x.py"), **limits)
    assert (read.status, read.content) == ("ok", "     1\tv = 2")
    escape = runtime.execute("r2", ReadFile(path="../rt/server.json"), **limits)
    assert escape.status == "error" and "outside the workspace" in escape.content
    missing = runtime.execute("r3", ReadFile(path="nope"), **limits)
    assert (missing.status, missing.content) == ("error", "No such file: nope.")
    twice = runtime.execute("e2", EditFile(path="src/x.py", old="", new="y"), **limits)
    assert twice.status == "error"


def test_long_file_reads_are_cut_with_the_full_text_kept(sandbox: LocalSandbox) -> None:
    text = "".join(f"line {i}\n" for i in range(1, 301))
    (sandbox.workspace / "long.txt").write_text(text)
    outcome = sandbox.runtime.execute(
        "long", ReadFile(path="long.txt"), timeout_s=10, no_output_timeout_s=5
    )
    assert outcome.elided_chars > 0 and outcome.full_output_path
    assert outcome.content.startswith("     1\tline 1\n")
    assert outcome.content.endswith("   300\tline 300")
    full = (sandbox.workspace / outcome.full_output_path).read_text()
    assert full.splitlines()[-1] == "   300\tline 300" and len(full.splitlines()) == 300
