"""A confined shell's policy as a sandbox server builds it, and what of it applies here.

The local sandbox server and the runtime server confine their shells alike
(``confinement.py``): the workspace and the given folders writable, the given paths
unreadable, the network on or off, and, for a server running as root, the uid the shell
becomes. One thing needs care beyond the policy itself: a writable temporary folder that
an unreadable path splits (a trouper home under /tmp) can take no new entry in the shell,
so the shell gets a private temporary folder there, as ``TMPDIR``, that the server
removes when the shell's sandbox ends. A server killed before its end (SIGKILL) cannot;
so it holds a lock on that folder while it lives, and the next server that makes one in
the same place removes those no server holds: a folder split by the walk (a trouper home
in /tmp) would otherwise grow by one entry, and every later start's walk by one rule, per
killed server.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, replace

from . import shared_layer
from .confinement import Policy, Prepared, Resolver, prepare

logger = logging.getLogger(__name__)

TMPDIR_PREFIX = "trouper-tmp-"
"""The name of a shell's private temporary folder, a random suffix after it."""
STALE_AFTER_S = 60.0
"""A private temporary folder that no server holds and that changed no later than this
is one a killed server left: removed (a younger one may be a server's between making it
and locking it)."""


@dataclass
class ShellConfinement:
    """The policy every shell of a sandbox starts with, prepared once (its Landlock rule
    set serves each shell: a restart costs no walk), and what this machine applies."""

    policy: Policy
    prepared: Prepared
    """Applied in each shell's child; closed with ``close`` when the sandbox ends."""
    missing: tuple[str, ...]
    """What could not be applied here (``Prepared.missing``): said once, in the log and
    in ``report``."""
    split: tuple[str, ...]
    """Writable folders that take no new entry directly (``Prepared.split``)."""
    tmpdir: str | None
    """The shell's private temporary folder (its ``TMPDIR``), or None."""
    unreadable_real: tuple[str, ...]
    """``policy.unreadable`` resolved (``os.path.realpath``), in its order: what the file
    tools refuse as the shell would."""
    tmpdir_lock: int = -1
    """A descriptor of ``tmpdir`` with its lock (``flock``), held while this lives."""

    def report(self) -> dict[str, object]:
        """What a server says of it (``server.json``, a health answer)."""
        return {"missing": list(self.missing), "split": list(self.split),
                "network": self.policy.network, "tmpdir": self.tmpdir,
                "shared_layer": self.prepared.layered}

    def close(self) -> None:
        """Release the rule set and remove the private temporary folder (idempotent)."""
        self.prepared.close()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        lock, self.tmpdir_lock = self.tmpdir_lock, -1
        if lock >= 0:
            os.close(lock)


def confine_shell(workspace: str, temporary: tuple[str, ...], writable: tuple[str, ...],
                  unreadable: tuple[str, ...], network: bool,
                  drop_to: tuple[int, int] | None = None,
                  env: dict[str, str] | None = None) -> ShellConfinement:
    """Build the policy of a shell in ``workspace``: ``temporary`` and ``writable`` folders
    writable too, ``unreadable`` paths neither readable nor writable. Sets ``TMPDIR`` in
    ``env`` when the shell needs a private temporary folder (made here), and ``HOME`` too
    when the shell becomes ``drop_to`` (another user, whose home is not the server's).
    Logs what is missing on this machine."""
    policy = Policy(writable=(workspace, *temporary, *writable), unreadable=unreadable,
                    network=network, drop_to=drop_to)
    tmpdir, lock = None, -1
    resolver = Resolver()  # each path resolved once, for the split, the plan and the tools
    split_temp = _split(temporary, unreadable, resolver)
    dropped = drop_to is not None and os.geteuid() == 0
    if (split_temp or dropped) and temporary:
        tmpdir, lock = _private_tmpdir((split_temp or temporary)[0],
                                       drop_to if dropped else None)
        policy = replace(policy, writable=(*policy.writable, tmpdir))
        if env is not None:
            env["TMPDIR"] = tmpdir
            if dropped:
                env["HOME"] = tmpdir
    try:
        probe = prepare(policy, resolver, shared_layer.take())
    except BaseException:
        _remove_tmpdir(tmpdir, lock)
        raise
    for hole in probe.missing:
        logger.warning("the shell is confined without %s", hole)
    if probe.split:
        logger.info("the shell cannot add entries directly in %s (an unreadable path lies "
                    "beneath)%s", ", ".join(probe.split),
                    f"; its TMPDIR is {tmpdir}" if tmpdir else "")
    return ShellConfinement(policy, probe, probe.missing, probe.split, tmpdir,
                            tuple(map(resolver.real, unreadable)), lock)


def _private_tmpdir(folder: str, owner: tuple[int, int] | None) -> tuple[str, int]:
    """A new private temporary folder in ``folder`` (``owner``'s when set), and the locked
    descriptor that says a server holds it; first removes those killed servers left."""
    _sweep(folder, {os.geteuid(), *((owner[0],) if owner else ())})
    path, lock = tempfile.mkdtemp(prefix=TMPDIR_PREFIX, dir=folder), -1
    try:
        lock = _lock(path)
        if lock < 0:
            raise OSError(f"cannot lock the new folder {path}")
        if owner is not None:
            os.chown(path, *owner)
    except BaseException:
        _remove_tmpdir(path, lock)
        raise
    return path, lock


def _sweep(folder: str, owners: set[int]) -> None:
    """Remove the private temporary folders in ``folder`` that belong to ``owners``, that
    no server holds (their lock is free) and that changed over ``STALE_AFTER_S`` ago.
    Never follows a symlink."""
    try:
        with os.scandir(folder) as entries:
            found = [e.path for e in entries if e.name.startswith(TMPDIR_PREFIX)]
    except OSError:
        return
    removed, now = 0, time.time()
    for path in found:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if (not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners
                or now - max(st.st_mtime, st.st_ctime) < STALE_AFTER_S):
            continue
        lock = _lock(path)
        if lock >= 0:  # held by nobody: its server is gone; removed while this holds it
            _remove_tmpdir(path, lock)
            removed += 1
    if removed:
        logger.info("removed %d private temporary folders that killed servers left in %s",
                    removed, folder)


def _lock(path: str) -> int:
    """A descriptor of the folder ``path`` holding its lock; -1 when another holds it (or
    it is gone, or not a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return -1
    return fd


def _remove_tmpdir(path: str | None, lock: int) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
    if lock >= 0:
        os.close(lock)


def _split(folders: tuple[str, ...], unreadable: tuple[str, ...],
           resolver: Resolver) -> list[str]:
    """The ``folders`` Landlock will split: an existing unreadable path lies beneath (as
    ``landlock.plan`` finds, known before the walk, so that it is walked once)."""
    denied = resolver.existing(unreadable)
    return [f for f in folders
            if any(d.startswith(resolver.real(f).rstrip("/") + "/") for d in denied)]


def unreadable_refusal(workspace: str, path: str, unreadable: tuple[str, ...]) -> str | None:
    """Why the file tools refuse ``path`` (relative to ``workspace``, or absolute): it lies
    in a path the confined shell may not read (a credential store inside the workspace,
    such as ``~/.ssh`` when the workspace is a home folder). None when they may go on.
    ``workspace`` and ``unreadable`` are real paths; the tools refuse every symlink, so
    the path's text is where it leads."""
    full = os.path.normpath(os.path.join(workspace, path))
    if not full.startswith(workspace.rstrip("/") + "/"):
        return None  # outside the workspace: the tools refuse it themselves, and say so
    inside = [d for d in unreadable if d.startswith(workspace.rstrip("/") + "/")]
    for denied in inside:  # one around the workspace does not count: it is granted whole
        if full == denied or full.startswith(denied.rstrip("/") + "/"):
            return f"{path}: permission denied: the sandbox may not read or write it"
    return None
