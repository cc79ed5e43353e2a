"""git, run on a session's shadow repository: never on a repository of the user's.

Every call names its own ``GIT_DIR`` (the shadow repository under the session's folder in
the trouper home) and ``GIT_WORK_TREE`` (the workspace), and reads no configuration but
its own: no system or global file, so a user's filters, hooks or ``core.*`` settings never
run on the workspace. A workspace's own ``.git`` is never a ``GIT_DIR`` here: git skips
any path named ``.git`` in a work tree, and the objects of a cloned repository are read
through ``GIT_ALTERNATE_OBJECT_DIRECTORIES`` (read only: nothing is written there).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..exceptions import TrouperError

GIT_TIMEOUT_S = 120.0
"""Longest one git call may take (listing or hashing a large workspace) before it is killed."""
IDENTITY = {"GIT_AUTHOR_NAME": "trouper", "GIT_AUTHOR_EMAIL": "trouper@localhost",
            "GIT_COMMITTER_NAME": "trouper", "GIT_COMMITTER_EMAIL": "trouper@localhost"}
"""Who makes the baseline's commit (git needs a name; no configuration gives it one)."""
NO_GIT = ("git is not installed on this machine (looked for it on PATH and at /usr/bin/git);"
          " install it (apt-get install git) to see what a session changed")


class GitFailed(TrouperError):
    """A git call failed or did not finish; its message says which and why."""


def find_git() -> str | None:
    """The git program's path, or None when this machine has none."""
    found = shutil.which("git")
    if found is None and os.access("/usr/bin/git", os.X_OK):
        found = "/usr/bin/git"
    return found


@dataclass(frozen=True)
class ShadowGit:
    """git on the shadow repository ``git_dir`` with the workspace as its work tree."""

    program: str
    git_dir: Path
    work_tree: Path
    index_file: Path | None = None
    """An index of its own (a copy, for a diff); None: the shadow repository's."""
    alternates: tuple[Path, ...] = ()
    """Object folders read (never written) besides the shadow's: a cloned repository's."""
    excludes_file: Path | None = None
    """More ignore patterns: the workspace repository's ``.git/info/exclude``."""
    extra_env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, stdin: bytes | None = None, literal: bool = True) -> bytes:
        """git ``args``; its stdout. ``literal``: paths are paths, never patterns or
        magic (``:(exclude)`` needs it off). Raises GitFailed (naming the call)."""
        try:
            done = subprocess.run(self._argv(args), input=stdin, capture_output=True,
                                  env=self._env(literal), cwd=self.work_tree,
                                  timeout=GIT_TIMEOUT_S, umask=0o077)
        except subprocess.TimeoutExpired:
            raise GitFailed(_too_slow(args)) from None
        except OSError as e:
            raise GitFailed(f"git {args[0]} could not run: {e}") from e
        if done.returncode != 0:
            raise GitFailed(_failed(args, done.returncode, done.stderr))
        return done.stdout

    def run_capped(self, *args: str, max_bytes: int, literal: bool = True
                   ) -> tuple[bytes, bool]:
        """git ``args``; at most ``max_bytes`` of its stdout, and whether it had more (it
        is then stopped): a diff of a huge workspace never sits whole in memory."""
        with tempfile.TemporaryFile() as errors:
            try:
                process = subprocess.Popen(
                    self._argv(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=errors, env=self._env(literal), cwd=self.work_tree, umask=0o077)
            except OSError as e:
                raise GitFailed(f"git {args[0]} could not run: {e}") from e
            timer = threading.Timer(GIT_TIMEOUT_S, process.kill)
            timer.start()
            try:
                out, more = _read_at_most(process.stdout, max_bytes)  # type: ignore[arg-type]
            finally:
                timer.cancel()
                process.kill()  # done already, or cut short: it has nothing more to say
                process.stdout.close()  # type: ignore[union-attr]
                code = process.wait()
            if not more and code != 0:
                errors.seek(0)
                said = errors.read()
                raise GitFailed(_too_slow(args) if code == -9 else _failed(args, code, said))
        return out, more

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        config = ["-c", "core.quotePath=false", "-c", "core.autocrlf=false",
                  "-c", "gc.auto=0", "-c", "advice.addEmbeddedRepo=false"]
        if self.excludes_file is not None:
            config += ["-c", f"core.excludesFile={self.excludes_file}"]
        return [self.program, *config, *args]

    def _env(self, literal: bool) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("GIT_")}  # the caller's GIT_DIR & co. never apply
        env.update(IDENTITY, GIT_DIR=str(self.git_dir), GIT_WORK_TREE=str(self.work_tree),
                   GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
                   GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", LC_ALL="C")
        if literal:
            env["GIT_LITERAL_PATHSPECS"] = "1"
        if self.index_file is not None:
            env["GIT_INDEX_FILE"] = str(self.index_file)
        if self.alternates:
            env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = os.pathsep.join(map(str, self.alternates))
        env.update(self.extra_env)
        return env


def _read_at_most(stream: BinaryIO, max_bytes: int) -> tuple[bytes, bool]:
    chunks, size = [], 0
    while chunk := stream.read(64 * 1024):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            return b"".join(chunks)[:max_bytes], True
    return b"".join(chunks), False


def _too_slow(args: tuple[str, ...]) -> str:
    return f"git {args[0]} did not finish within {GIT_TIMEOUT_S:g} s (a very large workspace?)"


def _failed(args: tuple[str, ...], code: int, stderr: bytes) -> str:
    said = stderr.decode("utf-8", "replace").strip().splitlines()
    return f"git {args[0]} failed (exit status {code}): {said[-1] if said else 'no message'}"


def workspace_excludes(workspace: Path) -> Path | None:
    """The workspace repository's own ignore file (``.git/info/exclude``), if it has one."""
    path = workspace / ".git" / "info" / "exclude"
    return path if path.is_file() else None


def nul_list(raw: bytes) -> list[str]:
    """git's ``-z`` output as paths (bytes that are no UTF-8 kept, as the file system does)."""
    return [os.fsdecode(part) for part in raw.split(b"\0") if part]


def nul_input(paths: list[str]) -> bytes:
    """Paths as ``--pathspec-from-file=- --pathspec-file-nul`` reads them."""
    return b"".join(os.fsencode(p) + b"\0" for p in paths)


def shown(path: str) -> str:
    """A path as text anyone can store and show (bytes that are no UTF-8 replaced)."""
    return os.fsencode(path).decode("utf-8", "replace")


__all__ = ["GitFailed", "NO_GIT", "ShadowGit", "find_git", "nul_input", "nul_list", "shown",
           "workspace_excludes"]
