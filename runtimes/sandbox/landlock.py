"""Landlock for the local shell: the whole file system readable but a few paths, writable
only beneath a few folders, and the rule set built in the parent, enforced in the child.

Landlock grants by allow-list and cannot take back beneath a granted folder, so "readable
except X" is computed (``plan``): a grant whose subtree holds a denied path is replaced
by grants of each of its children, recursing only along the way to the denied paths.
Children that are symlinks are skipped (their target is covered where it lives); files
get file rights only. A folder split this way keeps its children's rights but loses the
rights on its own entries (create, remove, rename directly in it).

A rule holds its file: a file deleted while a shell's domain lives is not freed until
that shell ends. So a file over ``PINNED_FILE_LIMIT`` bytes directly in a split folder
(a large download in your home, next to ``~/.ssh``) gets no rule and is unreadable to the
shell: deleting it frees the disk at once, as a user freeing space expects.

Rights are used best-effort by ABI: 1 the base rights, 2 REFER (rename across folders),
3 TRUNCATE, 4 TCP bind/connect, 5 IOCTL_DEV, 6 scoping of signals and abstract UNIX
sockets, 9 RESOLVE_UNIX (connecting to a pathname UNIX socket: granted with read, so a
socket under an unreadable path cannot be reached; below ABI 9 it always can).
See https://docs.kernel.org/userspace-api/landlock.html.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
from typing import Callable, Iterable, List, Sequence, Tuple

from .syscalls import Libc

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
"""The same numbers on every Linux architecture but alpha (syscalls added since 5.1)."""
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PATH_BENEATH = struct.Struct("=Qi")
"""struct landlock_path_beneath_attr (packed): allowed_access, parent_fd."""
_O_PATH = getattr(os, "O_PATH", 0)

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
RESOLVE_UNIX = 1 << 16
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

READ = EXECUTE | READ_FILE | READ_DIR | RESOLVE_UNIX
"""Read, execute and connect to UNIX sockets: what the whole file system gets."""
WRITE = (1 << 15) - 1 | RESOLVE_UNIX
"""Everything but IOCTL_DEV: read, write, create, remove, rename beneath a writable folder."""
DEVICE = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV
"""A device file a shell uses (/dev/null, /dev/tty...): read, write, ioctl."""
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV | RESOLVE_UNIX
"""The only rights a rule on a file (not a folder) may carry."""
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_FS_ALL = (1 << 17) - 1
"""Every right up to RESOLVE_UNIX (ABI 9); ABI 5 to 8 stop at IOCTL_DEV."""
EVERY = _FS_ALL
"""Every file-system right (a rule set keeps those its ABI handles)."""

PINNED_FILE_LIMIT = 1 << 20
"""Largest file directly in a split folder that gets a rule of its own (and so stays
allocated, even deleted, while a confined shell lives)."""

Grant = Tuple[str, int]
"""A path (resolved) and the Landlock rights beneath it."""
Lister = Callable[[str], List[Tuple[str, bool, bool]]]
"""A folder's entries as ``(name, is_dir, is_symlink)``."""


class Plan:
    """The rules to add, path by path, and the writable folders that were split."""

    def __init__(self) -> None:
        self.rules: dict[str, int] = {}
        """Resolved path -> rights (a path granted twice gets the union)."""
        self.split: list[str] = []
        """Writable folders granted child by child (they lose create/remove in themselves)."""


def plan(grants: Iterable[Grant], denied: Sequence[str],
         listdir: Lister | None = None) -> Plan:
    """The rules that grant ``grants`` but nothing at or beneath any of ``denied``.

    Paths are taken as resolved (realpath). ``listdir(path)`` gives ``(name, is_dir,
    is_symlink)`` for each entry (by default from ``os.scandir``; a folder that cannot
    be listed gives nothing, so it is denied too, never granted whole). A folder two
    grants split (``/`` read and ``/tmp`` write, around a trouper home in ``/tmp``) is
    listed once, and each of its files is sized once.
    """
    result = Plan()
    walk = _Walk(listdir or _scan, result)
    for path, rights in grants:
        walk.grant(path, rights, _is_dir(path), _beneath(path, denied))
    return result


class _Walk:
    """One plan's walk: what it listed and sized, so that no folder is read twice."""

    def __init__(self, listdir: Lister, out: Plan) -> None:
        self.listdir = listdir
        self.out = out
        self.listed: dict[str, list[tuple[str, bool, bool]]] = {}
        self.large: dict[str, bool] = {}

    def grant(self, path: str, rights: int, is_dir: bool, denied: list[str]) -> None:
        """Grant ``rights`` at ``path`` but at or beneath ``denied`` (the denied paths at
        or beneath it: the others cannot matter here)."""
        if path in denied:
            return
        if not is_dir:
            rights &= FILE_RIGHTS
        if not denied:
            if rights:
                self.out.rules[path] = self.out.rules.get(path, 0) | rights
            return
        if rights & MAKE_REG:
            self.out.split.append(path)
        prefix = path.rstrip("/") + "/"
        toward: dict[str, list[str]] = {}
        """A child's name -> the denied paths at or beneath it."""
        for d in denied:
            toward.setdefault(d[len(prefix):].split("/", 1)[0], []).append(d)
        entries = self.listed.get(path)
        if entries is None:
            entries = self.listed[path] = self.listdir(path)
        for name, child_is_dir, is_symlink in entries:
            if is_symlink or (not child_is_dir and self._large(prefix + name)):
                continue
            self.grant(prefix + name, rights, child_is_dir, toward.get(name, []))

    def _large(self, path: str) -> bool:
        known = self.large.get(path)
        if known is None:
            known = self.large[path] = _large(path)
        return known


def _beneath(path: str, denied: Sequence[str]) -> list[str]:
    """Those of ``denied`` at or strictly beneath ``path``."""
    prefix = path.rstrip("/") + "/"
    return [d for d in denied if d == path or d.startswith(prefix)]


def _large(path: str) -> bool:
    """Whether a file is too large to pin with a rule of its own (PINNED_FILE_LIMIT)."""
    try:
        return os.stat(path, follow_symlinks=False).st_size > PINNED_FILE_LIMIT
    except OSError:
        return False


def _scan(path: str) -> list[tuple[str, bool, bool]]:
    try:
        with os.scandir(path) as entries:
            return [(e.name, e.is_dir(follow_symlinks=False), e.is_symlink()) for e in entries]
    except OSError:
        return []


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def abi(calls: Libc) -> int:
    """The kernel's Landlock ABI version; OSError without Landlock (ENOSYS: not built in,
    EOPNOTSUPP: disabled at boot)."""
    return calls.syscall("landlock_create_ruleset", SYS_CREATE_RULESET, None,
                         ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))


def handled_fs(version: int) -> int:
    """The file-system rights Landlock ABI ``version`` knows (all of them get handled)."""
    if version <= 0:
        return 0
    return _FS_BY_ABI.get(version, _FS_ALL if version >= 9 else (1 << 16) - 1)


class Ruleset:
    """A Landlock rule set, built in the parent; ``restrict`` enforces it in the child."""

    def __init__(self, calls: Libc, version: int, rules: dict[str, int],
                 network: bool, scoped: bool = True) -> None:
        """Create the rule set for ABI ``version`` and add ``rules`` (path -> rights);
        without ``network`` (ABI >= 4), TCP bind and connect are handled and never
        granted; with ``scoped`` (ABI >= 6), signals and abstract UNIX sockets stay in
        the domain. OSError (naming the step) when the kernel refuses."""
        self._calls = calls
        fs = handled_fs(version)
        net = NET_BIND_TCP | NET_CONNECT_TCP if version >= 4 and not network else 0
        scope = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if version >= 6 and scoped else 0
        size = 8 if version < 4 else 16 if version < 6 else 24
        attr = ctypes.create_string_buffer(struct.pack("=QQQ", fs, net, scope)[:size], size)
        self.fd = calls.syscall("landlock_create_ruleset", SYS_CREATE_RULESET, attr,
                                ctypes.c_size_t(size), ctypes.c_uint32(0))
        try:
            self._add_all(rules, fs)
        except BaseException:
            self.close()
            raise

    def _add_all(self, rules: dict[str, int], handled: int) -> None:
        """Add each rule (its rights cut to ``handled``): a path gone since the plan, or
        made a symlink, grants nothing. The ctypes arguments are built once, not per
        rule: a split /tmp can take thousands."""
        call, attr = self._calls.raw("syscall"), ctypes.create_string_buffer(12)
        args = (ctypes.c_long(SYS_ADD_RULE), ctypes.c_int(self.fd),
                ctypes.c_int(_RULE_PATH_BENEATH), attr, ctypes.c_uint32(0))
        pack, flags = _PATH_BENEATH.pack_into, _O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW
        for path, rights in rules.items():
            try:
                fd = os.open(path, flags)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.EACCES, errno.ELOOP):
                    continue  # gone (or made a symlink) since the plan: nothing to grant
                raise
            try:
                pack(attr, 0, rights & handled, fd)
                if call(*args) < 0:
                    code = ctypes.get_errno()
                    if code != errno.EBADFD:  # an internal file system (a netns file)
                        raise OSError(code, f"landlock_add_rule {path}: {os.strerror(code)}")
            finally:
                os.close(fd)

    def restrict(self) -> None:
        """Enforce the rule set on this process (no_new_privs must be set) and close it."""
        fd, self.fd = self.fd, -1
        try:
            self._calls.syscall("landlock_restrict_self", SYS_RESTRICT_SELF, ctypes.c_int(fd),
                                ctypes.c_uint32(0))
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the rule set's descriptor (idempotent)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
