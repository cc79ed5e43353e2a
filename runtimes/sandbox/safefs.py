"""Opening files beneath a folder without following symlinks, with no check-then-use race.

Every path is resolved relative to a descriptor of the workspace, never by name from
``/``: with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` where the kernel has it
(Linux >= 5.6, called through ctypes), else one component at a time, each opened with
``O_NOFOLLOW | O_DIRECTORY`` relative to the previous one's descriptor. Either way a
symlink anywhere in the path fails (``ELOOP``), and whatever is renamed or swapped while
we work, nothing leads outside: there is no moment when a checked name is opened again.

Callers pass the path as components (``parts``) already normalised, without ``..``.
Errors are ``OSError`` with the kernel's errno; the caller words them for the agent.
"""

from __future__ import annotations

import errno
import os
import secrets
from typing import Any, BinaryIO, Callable

from .owners import adopt_owner

O_PATH = getattr(os, "O_PATH", 0)
"""Linux: a descriptor that names a file without opening it (no FIFO or device open)."""
DIR_FLAGS = (O_PATH or os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437
"""The same number on every Linux architecture (syscalls added since 5.1 share numbers)."""
_TMP_SUFFIX = ".trouper-tmp"



def open_beneath(root_fd: int, parts: list[str], flags: int, mode: int = 0) -> int:
    """Open ``parts`` below ``root_fd`` with ``flags`` (plus ``O_NOFOLLOW | O_CLOEXEC``);
    no component may be a symlink. A trailing symlink opened with ``O_PATH`` gives a
    descriptor of the link itself (fstat it to see); otherwise it fails with ELOOP."""
    if not parts:
        raise ValueError("open_beneath needs at least one path component")
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if not flags & os.O_CREAT:
        fd = _openat2(root_fd, "/".join(parts), flags)
        if fd is not None:
            return fd
    dir_fd = open_dirs(root_fd, parts[:-1])
    try:
        return os.open(parts[-1], flags, mode, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def open_dirs(root_fd: int, parts: list[str], create_mode: int | None = None) -> int:
    """A descriptor of the folder ``parts`` below ``root_fd`` (symlinks refused).

    With ``create_mode``, missing folders are made (``mkdirat``) and given that mode
    exactly, whatever the umask; without it, a missing one raises FileNotFoundError.
    """
    if not parts:
        return os.dup(root_fd)
    try:
        fd = _openat2(root_fd, "/".join(parts), DIR_FLAGS)
    except FileNotFoundError:
        if create_mode is None:
            raise
        fd = None  # some folders are missing: walk, making them
    if fd is not None:
        return fd
    fd = os.dup(root_fd)
    for name in parts:
        fd = _step(fd, name, create_mode)  # closes the fd it is given, even when it fails
    return fd


def _step(dir_fd: int, name: str, create_mode: int | None) -> int:
    """Open the folder ``name`` in ``dir_fd`` (making it if allowed); closes ``dir_fd``."""
    try:
        try:
            return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if create_mode is None:
                raise
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:  # made meanwhile by someone else: use it as it is
            return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        made = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=dir_fd)
        adopt_owner(made, dir_fd)  # root: the parent folder's owner, not root
        os.fchmod(made, create_mode)  # mkdir's mode is masked by the umask: be exact
        return made
    finally:
        os.close(dir_fd)


def replace_file(
    dir_fd: int, name: str, mode: int, write: Callable[[BinaryIO], object]
) -> None:
    """Make ``name`` in ``dir_fd`` a new regular file with ``mode`` and what ``write``
    writes: a temporary file beside it (``O_EXCL``), then a rename over ``name``.

    The rename replaces the directory entry: a symlink or a hard link that sits at
    ``name`` is swapped out, never written through. When this process is root, the new
    file takes the owner of the regular file it replaces, or else the folder's
    (``owners.adopt_owner``).
    """
    tmp = f".{name[:180]}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
            out.flush()
            adopt_owner(out.fileno(), dir_fd, name)  # before the mode: a chown clears setuid
            os.fchmod(out.fileno(), mode)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def first_symlink(root: str, parts: list[str]) -> str | None:
    """The first of ``parts``' prefixes that is a symlink (for messages only: racy)."""
    for i in range(1, len(parts) + 1):
        if os.path.islink(os.path.join(root, *parts[:i])):
            return "/".join(parts[:i])
    return None


class _Openat2:
    """``openat2`` through ctypes, beneath a folder and without symlinks.

    Calling it returns a descriptor, or None where the kernel (or a seccomp filter, or a
    python without ctypes) does not allow it: then the caller walks the components.
    """

    def __init__(self) -> None:
        self.state: bool | None = None
        """None: not tried yet; True: it works here; False: unavailable, walk instead."""
        self._ctypes: Any = None
        self._how: Any = None
        self._syscall: Any = None

    def __call__(self, dir_fd: int, path: str, flags: int) -> int | None:
        if self.state is False or not self._load():
            return None
        ctypes = self._ctypes
        resolve = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
        how = self._how(flags, 0, resolve)
        for _attempt in range(3):  # EAGAIN: a rename raced the lookup; the kernel asks again
            fd = self._syscall(
                ctypes.c_long(_SYS_OPENAT2),
                ctypes.c_int(dir_fd),
                ctypes.c_char_p(os.fsencode(path)),
                ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )
            if fd >= 0:
                self.state = True
                return int(fd)
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EPERM) and not self.state:
                self.state = False  # an old kernel, or a seccomp filter that refuses it
                return None
            if err != errno.EAGAIN:
                raise OSError(err, os.strerror(err), path)
        return None

    def _load(self) -> bool:
        if self._syscall is not None:
            return True
        try:
            import ctypes
        except ImportError:
            self.state = False
            return False

        class OpenHow(ctypes.Structure):
            _fields_ = [
                ("flags", ctypes.c_uint64),
                ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64),
            ]

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        self._ctypes, self._how, self._syscall = ctypes, OpenHow, libc.syscall
        return True


_openat2 = _Openat2()
