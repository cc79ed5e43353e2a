"""The Docker shell's input: commands travel through the FIFO as octal text that POSIX sh
decodes with builtins (``encode_line``), never as a file, in busybox ash, dash and bash as
sh (each where installed).

The shell is driven exactly as in a container (``ContainerShell``/``ContainerProcess``, a
pty, the FIFO) with ``docker exec`` replaced by a script that runs the command here, so
every shell of this machine can stand in for an image's ``sh``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from trouper.runtimes.sandbox.container import ContainerShell, encode_line
from trouper.runtimes.sandbox.shell import Shell

pytestmark = pytest.mark.slow  # starts shells

FAKE_DOCKER = """#!/bin/sh
# docker exec [-i] [-t] [-u U] [-w W] [-e NAME]... CONTAINER CMD...: CMD here, in W
shift
while :; do
  case $1 in
    -i|-t) shift;;
    -u|-e) shift 2;;
    -w) cd "$2" || exit 1; shift 2;;
    *) break;;
  esac
done
shift
exec "$@"
"""
SHELLS = {"busybox ash": "busybox", "dash": "dash", "bash as sh": "bash"}
USER = (4321, 4322) if os.geteuid() == 0 else (os.getuid(), os.getgid())
"""The container's user: never root (as root, the FIFO is given to it)."""
FANCY = 'Zq"7/w\\é-Fancy-91%s\'`$(x)'
"""A value with every character the encoding treats specially."""


def _shell_names() -> list[str]:
    return [name for name, program in SHELLS.items() if shutil.which(program)]


@pytest.fixture(params=_shell_names())
def sh_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A folder whose ``sh`` is the shell under test (first on the PATH)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "sh").symlink_to(shutil.which(SHELLS[request.param]))
    return folder


@pytest.fixture
def shell(sh_dir: Path, tmp_path: Path) -> Iterator[tuple[Shell, Path]]:
    """A started ``Shell`` whose ``sh -i`` runs through the fake docker, and its io folder."""
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    io_dir, workspace = tmp_path / "io", tmp_path / "ws"
    io_dir.mkdir(mode=0o700)
    workspace.mkdir()
    where = ContainerShell(str(docker), "c", str(workspace), str(io_dir), str(io_dir),
                           f"{USER[0]}:{USER[1]}")
    env = {"PATH": f"{sh_dir}:/usr/bin:/bin", "TERM": "dumb", "HOME": "/nonexistent"}
    shell = Shell(str(workspace), env, 200_000, spawn=where.spawn,
                  shown_workspace=str(workspace))
    shell.start()
    try:
        yield shell, io_dir
    finally:
        shell.close()


def run(shell: Shell, command: str, out: Path) -> tuple[int | None, str]:
    result = shell.run(command, 30, 30, str(out))
    pending = result.pending
    return result.exit_code, (pending.head + pending.tail) if pending else ""


def test_every_byte_decodes_to_itself(sh_dir):
    text = bytes(range(1, 256)).decode("latin-1")
    line = encode_line(7, text)
    head = b"__trouper_line=7; \\eval \"$(\\command printf '"
    tail = b"')\" </dev/null\n"
    assert line.startswith(head) and line.endswith(tail)
    quoted = line[len(head):-len(tail)]
    assert quoted.isascii() and b"'" not in quoted and b"\n" not in quoted
    script = b"printf %s \"$(printf '" + quoted + b"')\""
    got = subprocess.run([str(sh_dir / "sh"), "-c", script], capture_output=True,
                         check=True).stdout
    assert got == text.encode("utf-8", "surrogateescape").rstrip(b"\n")


def test_commands_run_whole_with_one_prompt_each(shell, tmp_path):
    sh, io_dir = shell
    out = tmp_path / "out"
    assert run(sh, "echo one", out) == (0, "one\n")
    code, text = run(sh, "echo (", out)  # a syntax error stays inside the eval
    assert code == 2 and "syntax error" in text.lower()
    assert run(sh, "false", out) == (1, "")
    assert run(sh, "printf '%s|' \"it's\" 'a \"b\"' \\\\ 100%; echo", out) == (
        0, "it's|a \"b\"|\\|100%|\n")
    assert run(sh, "cat <<EOF\nhere\nEOF", out) == (0, "here\n")
    assert run(sh, "for i in 1 2; do\n  echo $i\ndone", out) == (0, "1\n2\n")
    assert run(sh, "read x; echo \"[$x]\"", out) == (0, "[]\n")  # stdin is /dev/null
    long = "echo " + "x" * 100_000 + " | wc -c"  # past a pipe's 64 KiB: the writer waits
    assert run(sh, long, out)[1].strip() == "100001"
    assert run(sh, "if true; then", out)[0] == 2
    assert run(sh, "echo after", out) == (0, "after\n")


def test_an_agents_alias_or_function_cannot_take_the_protocols_names(shell, tmp_path):
    sh, _ = shell
    out = tmp_path / "out"
    run(sh, "printf() { echo HIJACK; }; eval() { echo E; }; command() { echo C; }; "
            "alias eval='echo A' command='echo B' printf='echo P' 2>/dev/null; true", out)
    assert run(sh, "echo still mine", out) == (0, "still mine\n")


def test_the_text_rests_in_no_file_and_is_never_echoed(shell, tmp_path):
    sh, io_dir = shell
    out = tmp_path / "out"
    code, text = run(sh, f"printf '%s' '{FANCY.replace(chr(39), '')}' | wc -c", out)
    assert code == 0 and int(text) == len(FANCY.replace("'", "").encode())
    code, text = run(sh, f"X='{FANCY.replace(chr(39), '')}'; echo ok", out)
    assert (code, text) == (0, "ok\n")  # no echo of the line (bash's readline is off)
    assert "\\" not in text and "printf" not in out.read_text()
    (fifo,) = io_dir.iterdir()
    info = fifo.lstat()
    assert stat.S_ISFIFO(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert (info.st_uid, info.st_gid) == USER


def test_home_is_writable_for_the_shell(shell, tmp_path):
    sh, _ = shell
    check = 'echo "$HOME"; t="$HOME/.trouper-test-$$"; touch "$t" && rm "$t" && echo w'
    assert run(sh, check, tmp_path / "out")[1] == "/tmp\nw\n"
