"""The part of the shells' Landlock rules that every session of a program shares, built
once by the sandbox zygote instead of by every server it forks.

Landlock cannot take back part of a granted folder, so "readable but ``/etc/shadow``,
``~/.ssh``, the trouper home..." is granted child by child along the way to each denied
path: a rule for each entry of ``/``, ``/etc``, the home, made again by every server. But
Landlock stacks rule sets (a process restricted twice may do only what both allow), so
the one rule set ``T = plan(grants, D)`` is applied as two:

- ``S = plan([("/", every right)], D_S)``: everything but the *shared* denied paths
  ``D_S``, those at or beneath which no grant lies and which lie beneath no writable
  folder (``/etc/shadow``, the credential stores of the home): the same for every
  session, built here once;
- ``B = plan(grants, D \\ D_S)``: the session's own (its workspace, the trouper home it
  lies in), built by its server as before, along fewer paths.

Whatever both allow, ``T`` allows, for any split of ``D`` (a right reaches a path through
a grant in ``B`` with no denied path on the way, and ``S`` puts none of ``D_S`` on the
way either); with the split above, whatever ``T`` allows, both allow. A denied path
beneath another with no grant between them (a session's state folder in the trouper
home) changes no rule of ``T``, and is in neither.

``S`` binds to the files that were there when it was built, so it is used only while
nothing it was built from has changed: an inotify watch on every folder ``S`` split (all
on file systems of this machine, where inotify sees every change) reports an entry made,
removed, renamed or written there (a file may have grown past the pinning limit), and
the mount table is compared. The zygote drops ``S`` at the first event and builds it
again for the next confined request; the server checks both again when it prepares (as
of then, as its own walk would), and that its ``D_S`` is the one ``S`` was built for
(else a credential store appeared where no folder is watched, or its session has its
own ``unreadable=``: it says so to the zygote through a shared byte, and builds its whole
rule set alone, as a server started afresh always does). Servers forked before keep
their ``S`` for their life, as a server keeps its own rule set.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import mmap
import os
import termios
from typing import Sequence

from . import landlock
from .landlock import Grant
from .syscalls import Libc

logger = logging.getLogger(__name__)

_IN_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC
_IN_EVENTS = (0x2 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800 | 0x1000000 | 0x2000000
              | 0x4000000)
"""IN_MODIFY, IN_MOVED_FROM/TO, IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF,
IN_ONLYDIR, IN_DONT_FOLLOW, IN_EXCL_UNLINK: an entry of the folder made, removed,
renamed or written; the folder itself removed or moved."""
MOUNTS = "/proc/self/mountinfo"
LOCAL_FILE_SYSTEMS = frozenset({
    0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0x2FC12FC1, 0xF2F52010, 0x858458F6,
    0x794C7630, 0x3153464A, 0x52654973, 0x5346544E, 0x4D44})
"""ext2-4, xfs, btrfs, tmpfs, zfs, f2fs, ramfs, overlayfs, jfs, reiserfs, ntfs, vfat:
where inotify sees every change. On NFS, CIFS, FUSE, 9p... another machine's change goes
unseen, so a folder there is never part of a shared layer."""


class Layer:
    """``S``, built for one ``D_S``: its rule set and what says it still holds."""

    def __init__(self, version: int, denied: tuple[str, ...], ruleset: landlock.Ruleset,
                 watch: int, mounts: bytes) -> None:
        self.version = version
        """The Landlock ABI it was built for."""
        self.denied = denied
        """``D_S``: the shared denied paths (resolved, existing, sorted)."""
        self.ruleset = ruleset
        self._watch = watch
        self._mounts = mounts

    def fresh(self) -> bool:
        """Nothing it was built from changed since (no inotify event queued; the same
        mount table)."""
        pending = ctypes.c_int(0)
        try:
            fcntl.ioctl(self._watch, termios.FIONREAD, pending)
        except OSError:
            return False
        return pending.value == 0 and _mounts() == self._mounts

    @property
    def watch(self) -> int:
        """The inotify descriptor: readable once anything it watches changed."""
        return self._watch

    def forked(self) -> None:
        """In a forked server, once it checked ``fresh``: close the watch (its events
        stay queued for the zygote's copy and other servers'), keep the rule set."""
        if self._watch >= 0:
            os.close(self._watch)
            self._watch = -1

    def close(self) -> None:
        self.ruleset.close()
        self.forked()


_current: list[Layer] = []
"""The layer this process holds: the zygote's, inherited by the server it forks."""
_mismatch = mmap.mmap(-1, 1)
"""A byte the zygote shares with the servers it forks: set by one whose own shared
denied paths are not the layer's (a credential store appeared where no folder is
watched, another session's ``unreadable=``), so that the zygote builds it anew."""


def current() -> Layer | None:
    """The shared layer inherited from the zygote, or None (none built, or started afresh)."""
    return _current[0] if _current else None


def take() -> Layer | None:
    """The inherited layer, now the caller's to close (None when there is none)."""
    return _current.pop() if _current else None


def mismatched() -> bool:
    """Whether a server found the layer not its own since the zygote last built it."""
    return _mismatch[0] != 0


def mark_mismatch() -> None:
    """In a server whose shared denied paths are not the layer's: say so to the zygote."""
    _mismatch[0] = 1


def discard() -> None:
    """Let go of the layer (the zygote: something it was built from changed; a server:
    it does not use it)."""
    while _current:
        _current.pop().close()


def partition(grants: Sequence[Grant], denied: Sequence[str]) -> tuple[list[str], list[str]]:
    """``denied`` as ``(D_S, the rest)``: ``D_S`` those at or beneath which no grant lies
    and which lie beneath no writable grant (its entries come and go per session). A path
    beneath another denied one with no grant between them (a session's state folder in
    the trouper home) changes no rule: it is in neither."""
    roots = [path for path, _ in grants if path != "/"]
    writable = [path for path, rights in grants if rights & landlock.MAKE_REG]
    shared, own = [], []
    for d in denied:
        if _covered(d, denied, roots):
            continue
        mine = any(_beneath(r, d) for r in roots) or any(
            d != w and _beneath(d, w) for w in writable)
        (own if mine else shared).append(d)
    return shared, own


def _beneath(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies beneath it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _covered(d: str, denied: Sequence[str], roots: Sequence[str]) -> bool:
    """Whether ``d`` lies beneath another denied path with no grant at or beneath that
    one on the way to ``d``: no walk of ``landlock.plan`` then reaches ``d``."""
    return any(other != d and _beneath(d, other)
               and not any(_beneath(r, other) and _beneath(d, r) for r in roots)
               for other in denied)


def ensure(version: int, grants: Sequence[Grant], denied: Sequence[str]) -> Layer | None:
    """In the zygote, before it forks a confined server: the layer for the ``D_S`` of
    these grants and denied paths, kept while it is fresh, else built anew (None when
    there is nothing to share, or no way to watch it)."""
    shared = tuple(partition(grants, denied)[0])
    _mismatch[0] = 0  # checked against these paths now
    layer = current()
    if layer is not None and layer.version == version and layer.denied == shared:
        if layer.fresh():
            return layer
    if layer is not None:
        _current.clear()
        layer.close()
    if not shared or not version:
        return None
    try:
        layer = _build(version, shared)
    except OSError as e:
        logger.warning("no shared confinement layer (every server builds its own): %s", e)
        return None
    if layer is not None:
        _current.append(layer)
    return layer


def _build(version: int, shared: tuple[str, ...]) -> Layer | None:
    """Watch every folder ``plan`` will split (before it lists them: a change during the
    walk is seen too), then plan and build ``S``."""
    libc = _inotify()
    if libc is None:
        return None
    watch = libc.inotify_init1(_IN_NONBLOCK_CLOEXEC)
    if watch < 0:
        return None
    try:
        mounts = _mounts()
        for folder in sorted({a for d in shared for a in _ancestors(d)}):
            if (not _local(libc, folder)
                    or libc.inotify_add_watch(watch, os.fsencode(folder), _IN_EVENTS) < 0):
                os.close(watch)
                return None  # a change there could go unseen: no shared layer
        planned = landlock.plan([("/", landlock.EVERY)], shared)
        ruleset = landlock.Ruleset(_calls(), version, planned.rules, True, scoped=False)
    except BaseException:
        os.close(watch)
        raise
    return Layer(version, shared, ruleset, watch, mounts)


def _ancestors(path: str) -> list[str]:
    """The folders above ``path``, ``/`` first."""
    found, head = [], os.path.dirname(path)
    while True:
        found.append(head)
        if head == "/":
            return found[::-1]
        head = os.path.dirname(head)


def _local(libc: ctypes.CDLL, folder: str) -> bool:
    """Whether ``folder`` lies on a file system of this machine (``statfs``'s f_type)."""
    buf = ctypes.create_string_buffer(512)  # struct statfs: 120 bytes on 64-bit Linux
    if libc.statfs(os.fsencode(folder), buf) != 0:
        return False
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF in LOCAL_FILE_SYSTEMS


def _mounts() -> bytes:
    try:
        with open(MOUNTS, "rb") as f:
            return f.read()
    except OSError:
        return b""


_found: dict[str, object] = {}


def _calls() -> Libc:
    if "libc" not in _found:
        _found["libc"] = Libc()
    return _found["libc"]  # type: ignore[return-value]


def _inotify() -> ctypes.CDLL | None:
    """libc with ``inotify_init1`` and ``inotify_add_watch`` typed; None without them."""
    if "inotify" not in _found:
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.inotify_init1.argtypes = [ctypes.c_int]
            lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            lib.statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
            _found["inotify"] = lib
        except (OSError, AttributeError):
            _found["inotify"] = None
    return _found["inotify"]  # type: ignore[return-value]
