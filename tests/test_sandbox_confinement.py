"""File tools cannot hang or escape: FIFOs, devices, symlink swaps, output symlinks,
hard links, modes, deadlines. Every test runs on openat2 and on the component walk."""

from __future__ import annotations

import ctypes
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trouper.runtimes.sandbox import files, safefs
from trouper.runtimes.sandbox.files import FileError
from trouper.runtimes.sandbox.service import Service

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

OUTSIDE_TEXT = "OUTSIDE-SECRET\n"


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with openat2 (where the kernel has it) and with the component walk."""
    fresh = safefs._Openat2()
    if request.param == "walk":
        fresh.state = False
    elif fresh(os.open("/", os.O_RDONLY | os.O_DIRECTORY), "tmp", safefs.DIR_FLAGS) is None:
        pytest.skip("this kernel refuses openat2")
    monkeypatch.setattr(safefs, "_openat2", fresh)
    return request.param


@pytest.fixture
def ws(tmp_path: Path, resolver: str) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside.txt"
    path.write_text(OUTSIDE_TEXT)
    return path


def quick(call: Callable[[], str], within_s: float = 5.0) -> str:
    """``call()``, failing the test (not hanging it) if it takes ``within_s``."""
    started = time.monotonic()
    try:
        return files.call_with_deadline(call, within_s, "test call")
    finally:
        assert time.monotonic() - started < within_s


def test_a_fifo_is_refused_without_blocking(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    for call in (
        lambda: files.read_file(str(ws), "pipe"),
        lambda: files.write_file(str(ws), "pipe", "data"),
        lambda: files.edit_file(str(ws), "pipe", "a", "b"),
    ):
        with pytest.raises(FileError, match=r"pipe is a named pipe \(FIFO\), not a regular"):
            quick(call)
    assert stat.S_ISFIFO((ws / "pipe").lstat().st_mode), "the FIFO was not replaced"


def test_a_device_is_refused_without_reading_it(ws: Path) -> None:
    try:
        os.mknod(ws / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero
    except PermissionError:
        pytest.skip("mknod is not permitted here")
    for call in (
        lambda: files.read_file(str(ws), "zero"),
        lambda: files.write_file(str(ws), "zero", "data"),
    ):
        with pytest.raises(FileError, match="zero is a character device, not a regular file"):
            quick(call)


def test_a_socket_is_refused(ws: Path) -> None:
    import socket

    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(ws / "sock"))
        with pytest.raises(FileError, match="sock is a socket"):
            quick(lambda: files.read_file(str(ws), "sock"))


def test_an_output_symlink_to_outside_is_refused(ws: Path, outside: Path) -> None:
    (ws / "out.txt").symlink_to(outside)
    (ws / "dir-link").symlink_to(outside.parent)
    with pytest.raises(FileError, match="out.txt goes through a symlink"):
        files.write_file(str(ws), "out.txt", "pwned")
    with pytest.raises(FileError, match="through a symlink"):
        files.edit_file(str(ws), "out.txt", "OUTSIDE", "pwned")
    with pytest.raises(FileError, match=r"dir-link/outside.txt goes through a symlink \(dir-link"):
        files.write_file(str(ws), "dir-link/outside.txt", "pwned")
    assert outside.read_text() == OUTSIDE_TEXT
    assert (ws / "out.txt").is_symlink()


def test_a_hard_link_is_never_written(ws: Path, outside: Path) -> None:
    os.link(outside, ws / "hard.txt")
    with pytest.raises(FileError, match="hard.txt has 2 hard links"):
        files.write_file(str(ws), "hard.txt", "pwned")
    with pytest.raises(FileError, match="hard.txt has 2 hard links"):
        files.edit_file(str(ws), "hard.txt", "OUTSIDE", "pwned")
    assert outside.read_text() == OUTSIDE_TEXT
    assert os.stat(ws / "hard.txt").st_ino == os.stat(outside).st_ino


def _in_thread(step: Callable[[], None], stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.is_set():
            step()

    return threading.Thread(target=loop, daemon=True)


def _flip_file(path: Path, outside: Path) -> Callable[[], None]:
    """One step: ``path`` becomes a fresh regular file, then a symlink to ``outside``
    (each put in place atomically with a rename)."""
    tmp = path.with_name(path.name + ".swap")

    def step() -> None:
        tmp.write_text("inside\n")
        os.replace(tmp, path)
        os.symlink(outside, tmp)
        os.replace(tmp, path)

    return step


def _exchanger(a: Path, b: Path) -> Callable[[], None]:
    """One step: atomically exchange the entries ``a`` and ``b`` (renameat2 with
    RENAME_EXCHANGE: a folder and a symlink trade places, with no moment between)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 in this libc")
    at_fdcwd, rename_exchange = -100, 2

    def step() -> None:
        if libc.renameat2(at_fdcwd, bytes(a), at_fdcwd, bytes(b), rename_exchange) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")

    return step


@pytest.fixture
def swapping(ws: Path, outside: Path) -> Iterator[Path]:
    """``ws/flip`` swaps between a file inside and a symlink to ``outside``, until the end."""
    stop = threading.Event()
    thread = _in_thread(_flip_file(ws / "flip", outside), stop)
    thread.start()
    try:
        yield ws / "flip"
    finally:
        stop.set()
        thread.join(5)


def test_a_symlink_swapped_in_never_leads_a_read_outside(ws: Path, swapping: Path) -> None:
    seen = {"inside": 0, "refused": 0}
    deadline = time.monotonic() + 60
    # at least 1500 reads, and on until both states were met: on a loaded machine the
    # swapping thread may not get the GIL during the first 1500
    while sum(seen.values()) < 1500 or not all(seen.values()):
        if time.monotonic() > deadline:
            break
        try:
            text = files.read_file(str(ws), "flip")
        except FileError as e:
            assert "symlink" in str(e) or "No such file" in str(e), e
            seen["refused"] += 1
            continue
        assert "OUTSIDE" not in text
        seen["inside"] += 1
    assert seen["inside"] and seen["refused"], seen  # both states were met


def test_a_symlink_swapped_in_never_leads_a_write_outside(
    ws: Path, swapping: Path, outside: Path
) -> None:
    done = {"written": 0, "refused": 0}
    deadline = time.monotonic() + 60
    i = 0
    while (i < 600 or not all(done.values())) and time.monotonic() < deadline:
        i += 1  # at least 600, and on until both were met (see the read test)
        try:
            files.write_file(str(ws), "flip", f"write {i}\n")
            done["written"] += 1
        except FileError as e:
            assert "symlink" in str(e), e
            done["refused"] += 1
        try:
            files.edit_file(str(ws), "flip", "inside", "edited")
        except FileError:
            pass
    assert outside.read_text() == OUTSIDE_TEXT
    assert done["written"] and done["refused"], done


def test_a_folder_swapped_for_a_symlink_never_leads_outside(ws: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f.txt").write_text(OUTSIDE_TEXT)
    real = ws / "real-dir"
    real.mkdir()
    (real / "f.txt").write_text("inside\n")
    (ws / "d").symlink_to(elsewhere)
    stop = threading.Event()
    swapper = _in_thread(_exchanger(ws / "d", real), stop)
    swapper.start()
    try:
        for i in range(800):
            for call in (
                lambda: files.read_file(str(ws), "d/f.txt"),
                lambda i=i: files.write_file(str(ws), f"d/new{i % 3}.txt", "x"),
            ):
                try:
                    assert "OUTSIDE" not in call()
                except FileError:
                    pass
    finally:
        stop.set()
        swapper.join(5)
    assert sorted(os.listdir(elsewhere)) == ["f.txt"]
    assert (elsewhere / "f.txt").read_text() == OUTSIDE_TEXT
    folder = real if real.is_dir() and not real.is_symlink() else ws / "d"
    assert {p.name for p in folder.iterdir()} > {"f.txt"}, "some writes went through, inside"


def test_write_keeps_modes_and_leaves_no_temporary_file(ws: Path) -> None:
    script = ws / "run.sh"
    script.write_text("echo old\n")
    script.chmod(0o750)
    files.write_file(str(ws), "run.sh", "echo new\n", umask=0o022)
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    files.edit_file(str(ws), "run.sh", "new", "newer")
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    assert script.read_text() == "echo newer\n"
    files.write_file(str(ws), "a/b/new.txt", "x", umask=0o027)
    assert stat.S_IMODE((ws / "a/b/new.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE((ws / "a/b").stat().st_mode) == 0o750
    files.write_file(str(ws), "open.txt", "x", umask=0)
    assert stat.S_IMODE((ws / "open.txt").stat().st_mode) == 0o666
    leftovers = [p for p in ws.rglob("*") if p.name.endswith(".trouper-tmp")]
    assert leftovers == []


def test_paths_are_normalised_by_name_and_the_workspace_is_not_a_file(ws: Path) -> None:
    (ws / "sub").mkdir()
    files.write_file(str(ws), "sub/../top.txt", "t")
    assert (ws / "top.txt").read_text() == "t"
    assert files.read_file(str(ws), f"{ws}/./sub/../top.txt") == "     1\tt"
    for path in (".", str(ws), "sub/.."):
        with pytest.raises(FileError, match="is a directory"):
            files.read_file(str(ws), path)
    with pytest.raises(FileError, match="a part of its path is a file"):
        files.write_file(str(ws), "top.txt/x", "no")


def test_a_file_action_past_its_deadline_is_an_error_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    release = threading.Event()

    def hang(*args: object) -> str:
        release.wait(30)
        return "too late"

    monkeypatch.setattr(files, "read_file", hang)
    service = Service(str(tmp_path / "state"), str(tmp_path), {}, "boot", file_timeout_s=0.2)
    try:
        started = time.monotonic()
        outcome = service.perform("r1", {"kind": "read_file", "path": "x"}, 60.0, 0.0)
        elapsed = time.monotonic() - started
        short = service.perform("r2", {"kind": "read_file", "path": "x"}, 0.1, 0.0)
    finally:
        release.set()
    assert outcome["status"] == "error" and 0.2 <= elapsed < 2
    assert "did not finish within its deadline of 0.2 s" in outcome["content"]
    assert "deadline of 0.1 s" in short["content"]  # the action's own timeout, when shorter


def test_a_vanished_workspace_is_a_clear_refusal(tmp_path: Path) -> None:
    with pytest.raises(FileError, match="Cannot open the workspace .*gone: No such file"):
        files.read_file(str(tmp_path / "gone"), "a.txt")
