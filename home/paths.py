"""Where trouper keeps things under its home folder.

    <home>/trouper.db                      the event store (SQLite, WAL)
    <home>/sessions/<id>/                  one folder per session
    <home>/sessions/<id>/workspace/        the default workspace
    <home>/sessions/<id>/runtime/          the local sandbox: socket, pid, journal
    <home>/sessions/<id>/secrets.json      the session's secrets and API key (mode 0600)
    <home>/sessions/<id>/actors/<role>.pid the pid of the session's live actors
    <home>/actors/<role>.pid               the pid of the shared actors (root, broker)
    <home>/logs/                           trouper.log (actors), thespian.log

Everything trouper creates here, outside the workspaces, is owner-only: folders 0700, files
0600, whatever the caller's umask (I7 in docs/promises.md). trouper's own processes
(the actor system's) run
with umask 077; the sandbox's shell gets the umask of the program that started trouper
back (``creator_umask``), so the agent's files in a workspace keep their usual modes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

HOME_ENV = "TROUPER_HOME"
DIR_MODE = 0o700
FILE_MODE = 0o600
PRIVATE_UMASK = 0o077
_LOOSE = stat.S_IRWXG | stat.S_IRWXO
_creator_umask: int | None = None


def default_home() -> Path:
    """``$TROUPER_HOME``, else ``~/.trouper``."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".trouper")


@dataclass(frozen=True)
class Home:
    """The layout of one trouper home folder."""

    root: Path

    @classmethod
    def at(cls, path: str | os.PathLike[str] | None = None) -> Home:
        root = Path(path) if path is not None else default_home()
        root = root.expanduser().resolve()
        private_dir(root)
        return cls(root)

    def tighten(self) -> int:
        """Make what trouper keeps here owner-only again (workspaces excepted); returns
        how many modes it changed, and logs them: a home made by an older trouper or
        copied with loose modes must not stay readable by others."""
        changed = []
        for folder, dirs, files in os.walk(self.root):
            here = Path(folder)
            if here.parent == self.root / "sessions":
                dirs[:] = [d for d in dirs if d != "workspace"]  # the agent's files, not ours
            for name in [*dirs, *files]:
                if _make_owner_only(here / name):
                    changed.append(str(here / name))
        if _make_owner_only(self.root):
            changed.append(str(self.root))
        if changed:
            logger.warning("tightened %d path(s) under %s to owner-only (%s%s)", len(changed),
                           self.root, ", ".join(changed[:5]), ", ..." if len(changed) > 5 else "")
        return len(changed)

    @property
    def db_path(self) -> Path:
        return self.root / "trouper.db"

    def session_dir(self, session_id: str) -> Path:
        return self.root / "sessions" / session_id

    def default_workspace(self, session_id: str) -> Path:
        return self.session_dir(session_id) / "workspace"

    def runtime_dir(self, session_id: str) -> Path:
        return self.session_dir(session_id) / "runtime"

    def secrets_path(self, session_id: str) -> Path:
        return self.session_dir(session_id) / "secrets.json"

    def actor_pid_path(self, role: str, session_id: str | None = None) -> Path:
        """Where a live actor publishes its pid (for the harness's ``kill_actor``)."""
        folder = self.session_dir(session_id) / "actors" if session_id else self.root / "actors"
        return folder / f"{role}.pid"


def private_dir(path: Path) -> Path:
    """Create ``path`` and any missing parents with mode 0700 (``Path.mkdir`` gives the
    parents the umask's mode); an existing folder is left as it is."""
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(folder, DIR_MODE)  # mkdir's mode is masked by the umask; be exact
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` (and its folder) owner-only if missing; tighten it if it exists."""
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & _LOOSE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path


def write_private(path: Path, text: str, durable: bool = False) -> None:
    """Replace ``path`` atomically with ``text``, owner-only (never through a symlink);
    with ``durable``, the file is fsynced before the rename and its folder after, so a
    host crash leaves it whole or absent. A temporary that cannot be written is removed."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # a leftover temporary keeps its old mode
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def enter_private_process() -> None:
    """In a process of trouper's own: whatever it creates is owner-only by default.

    Remembers the umask it replaces, for ``creator_umask``. Idempotent.
    """
    global _creator_umask
    old = os.umask(PRIVATE_UMASK)
    if _creator_umask is None:
        _creator_umask = old


def creator_umask() -> int:
    """The umask of the program that started trouper (for the sandbox's shell)."""
    if _creator_umask is not None:
        return _creator_umask
    current = os.umask(PRIVATE_UMASK)
    os.umask(current)
    return current


def _make_owner_only(path: Path) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    if stat.S_ISLNK(info.st_mode) or not stat.S_IMODE(info.st_mode) & _LOOSE:
        return False
    mode = DIR_MODE if stat.S_ISDIR(info.st_mode) else stat.S_IMODE(info.st_mode) & 0o700
    try:
        os.chmod(path, mode)
    except OSError:
        return False
    return True
