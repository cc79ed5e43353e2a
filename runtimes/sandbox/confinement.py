"""Confinement of the local shell (Linux): Landlock, seccomp and dropped privileges.

The whole file system is readable but the ``unreadable`` paths; writes, creations,
removals and renames happen only beneath the ``writable`` folders (and in the few device
files a shell needs); no file ever gets a set-user-ID or set-group-ID bit; io_uring is
off; without ``network``, no socket but AF_UNIX and no TCP bind or connect. A confined
process can neither signal nor ptrace (so neither read ``/proc/<pid>/environ`` of) a
process outside its domain, nor reach an abstract UNIX socket made outside it.

``prepare`` does in the parent everything that allocates or walks (the rule set, the BPF
program, the libc handle); ``Prepared.apply`` runs in the forked child just before exec
and makes only a handful of calls on those objects. Where the kernel lacks a piece, the
rest still applies and ``Prepared.missing`` says what is not::

    prepared = prepare(Policy(writable=(workspace, "/tmp"), unreadable=(home,)))
    pid, fd = pty.fork()
    if pid == 0:
        prepared.apply()  # then close descriptors and exec
        ...
    prepared.close()

Run as root (euid 0), the child becomes ``drop_to`` when it is set, else it stays uid 0
without any capability, and with securebits locked so that no exec (a setuid-root
binary, or any binary as uid 0) gives one back. Without Landlock, a capability-less root
can still write every file root owns: check ``missing``.

What this does not stop: connecting to a pathname UNIX socket (the Docker socket, the
D-Bus session bus, an ssh-agent) below Landlock ABI 9, even under an unreadable path, and
so asking a daemon to act for the shell; seeing that an unreadable path exists (``stat``,
``cd`` into it, its name in a listing of its folder); reading another process's
``/proc/<pid>/cmdline``; the kernel keyrings where seccomp is missing. Rules bind to the
files that exist at ``prepare``: an entry made later directly in a split folder (or
replaced by rename) is neither readable nor writable for that shell, and an unreadable
path made later is not protected until the sandbox's next start (its rule set serves
every shell of it).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass

from . import landlock, seccomp
from .syscalls import Libc

DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                "/dev/tty", "/dev/ptmx")
"""Device files a shell reads and writes (with ioctl where Landlock controls it)."""
DEVICE_FOLDERS = {"/dev/pts": landlock.DEVICE | landlock.READ_DIR, "/dev/shm": landlock.WRITE}
"""Folders of /dev granted beneath: the pseudo-terminals and POSIX shared memory."""
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _CAP_AMBIENT_CLEAR_ALL, _PR_SET_SECUREBITS = 24, 47, 4, 28
_SECUREBITS = 0b11101111
"""NOROOT, NO_SETUID_FIXUP and NO_CAP_AMBIENT_RAISE, each locked; KEEP_CAPS off, locked."""
_CAPABILITY_VERSION_3 = 0x20080522


@dataclass(frozen=True)
class Policy:
    """What the confined shell may read, write and reach."""

    writable: tuple[str, ...]
    """Folders beneath which everything may be read, written, created, removed, renamed
    and executed: the workspace, temp folders. One that does not exist is left out."""
    unreadable: tuple[str, ...] = ()
    """Files or folders neither readable nor writable, even under ``writable`` or "/".
    One that does not exist costs nothing (and stays unprotected if made later)."""
    network: bool = True
    """False: no socket but AF_UNIX (seccomp), and no TCP bind or connect (Landlock)."""
    drop_to: tuple[int, int] | None = None
    """``(uid, gid)`` the shell becomes when the server runs as root; None: it stays
    uid 0 without capabilities. Ignored, and listed in ``missing``, when not root."""


class Prepared:
    """The confinement of one shell, prepared in the parent; ``apply`` it in the child."""

    def __init__(self, missing: list[str], split: tuple[str, ...],
                 ruleset: landlock.Ruleset | None, filter_: seccomp.Filter | None,
                 privileges: _Privileges) -> None:
        self.missing = tuple(missing)
        """What could not be applied here, in words ("Landlock (kernel without it)",
        "seccomp (arch s390x)"): each is a hole the caller may want to warn about."""
        self.split = split
        """Writable folders granted child by child because an unreadable path lies
        beneath: the shell cannot create, remove or rename entries directly in them
        (a trouper home under /tmp splits /tmp: point TMPDIR elsewhere)."""
        self._ruleset = ruleset
        self._filter = filter_
        self._privileges = privileges

    def apply(self) -> None:
        """Confine this process (the forked child, just before exec): drop uid or
        capabilities, set no_new_privs, enforce Landlock, install seccomp.

        Raises OSError naming the step that failed; the child must then not exec.
        """
        self._privileges.drop()
        seccomp.no_new_privs(self._privileges.calls)
        if self._ruleset is not None:
            self._ruleset.restrict()
        if self._filter is not None:
            self._filter.install()

    def close(self) -> None:
        """Release the rule set's descriptor (in the parent, after fork; idempotent)."""
        if self._ruleset is not None:
            self._ruleset.close()


def prepare(policy: Policy) -> Prepared:
    """Build everything ``Prepared.apply`` needs: the walks, rule set and BPF program.

    Raises OSError when the kernel refuses a rule it claims to support.
    """
    calls = Libc()
    missing: list[str] = []
    ruleset, split = None, ()
    version = _landlock_abi(calls, missing)
    if version:
        planned = landlock.plan(_grants(policy), _denied(policy.unreadable))
        ruleset = landlock.Ruleset(calls, version, planned.rules, policy.network)
        split = tuple(planned.split)
        missing += _landlock_gaps(version, policy.network)
    try:
        filter_ = _seccomp_filter(calls, policy.network, missing)
        privileges = _Privileges(calls, policy.drop_to, missing)
    except BaseException:
        if ruleset is not None:
            ruleset.close()
        raise
    return Prepared(missing, split, ruleset, filter_, privileges)


def available() -> dict[str, object]:
    """What this kernel and machine offer, for a status line or the docs:
    ``{"landlock_abi": 7, "seccomp": True, "arch": "x86_64", "euid": 0}``
    (``landlock_abi`` 0: none)."""
    calls = Libc()
    try:
        version = landlock.abi(calls)
    except OSError:
        version = 0
    arch = seccomp.machine()
    return {"landlock_abi": version,
            "seccomp": arch in seccomp.ARCHES and seccomp.supported(calls),
            "arch": arch, "euid": os.geteuid()}


def _landlock_abi(calls: Libc, missing: list[str]) -> int:
    try:
        return landlock.abi(calls)
    except OSError as e:
        why = "disabled at boot" if e.errno == errno.EOPNOTSUPP else "kernel without it"
        missing.append(f"Landlock ({why})")
        return 0


def _landlock_gaps(version: int, network: bool) -> list[str]:
    gaps = []
    if version < 3:
        gaps.append(f"Landlock truncate control (ABI {version} < 3)")
    if version < 4 and not network:
        gaps.append(f"Landlock TCP bind/connect rules (ABI {version} < 4)")
    if version < 5:
        gaps.append(f"Landlock device ioctl control (ABI {version} < 5)")
    if version < 6:
        gaps.append(f"Landlock scoping of signals and abstract sockets (ABI {version} < 6)")
    return gaps


def _grants(policy: Policy) -> list[landlock.Grant]:
    grants: list[landlock.Grant] = [("/", landlock.READ)]
    grants += [(os.path.realpath(p), landlock.WRITE) for p in policy.writable]
    grants += [(os.path.realpath(p), landlock.DEVICE) for p in DEVICE_FILES]
    grants += [(os.path.realpath(p), r) for p, r in DEVICE_FOLDERS.items()]
    return [(path, rights) for path, rights in grants if os.path.exists(path)]


def _denied(unreadable: tuple[str, ...]) -> list[str]:
    paths = {os.path.realpath(p) for p in unreadable}
    return sorted(p for p in paths if os.path.lexists(p))


def _seccomp_filter(calls: Libc, network: bool, missing: list[str]) -> seccomp.Filter | None:
    arch = seccomp.ARCHES.get(seccomp.machine())
    if arch is None:
        missing.append(f"seccomp (arch {seccomp.machine()})")
        return None
    if not seccomp.supported(calls):
        missing.append("seccomp (kernel without it)")
        return None
    return seccomp.Filter(calls, seccomp.program(arch, network))


class _Privileges:
    """Becoming ``drop_to``, or losing every capability, prepared in the parent."""

    def __init__(self, calls: Libc, drop_to: tuple[int, int] | None,
                 missing: list[str]) -> None:
        self.calls = calls
        self._become: tuple[int, int] | None = None
        self._last_cap = -1
        """Highest capability to drop from the bounding set; -1: none to drop."""
        self._clear = False
        if os.geteuid() == 0 and drop_to is not None:
            self._become = drop_to
        elif os.geteuid() == 0:
            self._last_cap = _last_cap()
            self._clear = True
        else:
            if drop_to is not None and drop_to != (os.getuid(), os.getgid()):
                missing.append(f"drop_to {drop_to} (not root: stays uid {os.getuid()})")
            self._clear = _has_capabilities()
        self._header = ctypes.create_string_buffer(struct.pack("=Ii", _CAPABILITY_VERSION_3, 0))
        self._data = ctypes.create_string_buffer(24)

    def drop(self) -> None:
        """In the child: become ``drop_to``, or drop every capability."""
        if self._become is not None:
            uid, gid = self._become
            try:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
            except OSError as e:
                raise OSError(e.errno, f"drop to uid {uid} gid {gid}: {e.strerror}") from e
        for cap in range(self._last_cap + 1):
            try:
                self.calls.prctl("capability bounding set", _PR_CAPBSET_DROP, cap)
            except OSError as e:
                if e.errno == errno.EINVAL and cap > 0:
                    break  # past the kernel's last capability (cap_last_cap unread)
                raise
        if self._last_cap >= 0:
            self.calls.prctl("securebits", _PR_SET_SECUREBITS, _SECUREBITS)
        if self._clear:
            self.calls.prctl("ambient capabilities", _PR_CAP_AMBIENT, _CAP_AMBIENT_CLEAR_ALL)
            self.calls.capset("capset", self._header, self._data)


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63  # drop() stops at the first capability the kernel does not know


def _has_capabilities() -> bool:
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith("Cap"))
    except OSError:
        return True
    return any(int(fields.get(k, "0"), 16) for k in ("CapPrm", "CapAmb", "CapEff"))
