"""Confinement of the local shell (Linux): Landlock, seccomp and dropped privileges.

The whole file system is readable but the ``unreadable`` paths; writes, creations,
removals and renames happen only beneath the ``writable`` folders (and in the few device
files a shell needs); no file ever gets a set-user-ID or set-group-ID bit; io_uring is
off; without ``network``, no socket but AF_UNIX and no TCP bind or connect. A confined
process can neither signal nor ptrace (so neither read ``/proc/<pid>/environ`` of) a
process outside its domain, nor reach an abstract UNIX socket made outside it.

``prepare`` does in the parent everything that allocates or walks (the rule set, the BPF
program, the libc handle); ``Prepared.apply`` runs in the forked child just before exec
and makes only a handful of calls on those objects. What depends on the kernel alone (the
libc handle, the Landlock ABI, the BPF programs, capabilities) is found once a process
(``warm``: the sandbox zygote, before it forks servers); what depends on files (the walks,
the rule set) is done afresh by every ``prepare``, but for the part every session shares,
which a server forked by the zygote takes from it while nothing it depends on changed
(``shared_layer.py``: then two Landlock layers, which allow what the one rule set does).
Where the kernel lacks a piece, the rest still applies and ``Prepared.missing`` says what
is not::

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
from typing import Any, Callable

from . import landlock, seccomp, shared_layer
from .resolve import Resolver
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
                 privileges: _Privileges, shared: landlock.Ruleset | None = None) -> None:
        self.missing = tuple(missing)
        """What could not be applied here, in words ("Landlock (kernel without it)",
        "seccomp (arch s390x)"): each is a hole the caller may want to warn about."""
        self.split = split
        """Writable folders granted child by child because an unreadable path lies
        beneath: the shell cannot create, remove or rename entries directly in them
        (a trouper home under /tmp splits /tmp: point TMPDIR elsewhere)."""
        self._ruleset = ruleset
        self._shared = shared
        """The zygote's layer of the rules every session shares (``shared_layer``), or
        None: ``ruleset`` then holds them all."""
        self.layered = shared is not None
        """Whether the zygote's shared layer is applied under this policy's own rules."""
        self._filter = filter_
        self._privileges = privileges

    def apply(self) -> None:
        """Confine this process (the forked child, just before exec): drop uid or
        capabilities, set no_new_privs, enforce Landlock, install seccomp.

        Raises OSError naming the step that failed; the child must then not exec.
        """
        self._privileges.drop()
        seccomp.no_new_privs(self._privileges.calls)
        if self._shared is not None:
            self._shared.restrict()
        if self._ruleset is not None:
            self._ruleset.restrict()
        if self._filter is not None:
            self._filter.install()

    def close(self) -> None:
        """Release the rule sets' descriptors (in the parent, after fork; idempotent)."""
        for ruleset in (self._ruleset, self._shared):
            if ruleset is not None:
                ruleset.close()


def prepare(policy: Policy, resolver: Resolver | None = None,
            shared: shared_layer.Layer | None = None) -> Prepared:
    """Build everything ``Prepared.apply`` needs: the walks, rule sets and BPF program.
    ``resolver``: one the caller already used on these paths (its answers are kept).
    ``shared``: the zygote's layer (``shared_layer.take()``), now this call's: applied
    under this policy's own rules when it was built for this policy's shared denied
    paths, else closed.

    Raises OSError when the kernel refuses a rule it claims to support.
    """
    calls = _libc()
    resolver = resolver or Resolver()
    missing: list[str] = []
    ruleset, split, layer = None, (), None
    try:
        version = _landlock_abi(calls, missing)
        if version:
            grants, denied = _grants(policy, resolver), resolver.existing(policy.unreadable)
            layer, denied = _layered(shared, version, grants, denied)
            planned = landlock.plan(grants, denied)
            ruleset = landlock.Ruleset(calls, version, planned.rules, policy.network)
            split = tuple(planned.split)
            missing += _landlock_gaps(version, policy.network)
        filter_ = _seccomp_filter(calls, policy.network, missing)
        privileges = _Privileges(calls, policy.drop_to, missing)
    except BaseException:
        for held in (ruleset, layer and layer.ruleset):
            if held is not None:
                held.close()
        raise
    finally:
        if shared is not None and shared is not layer:
            shared.close()
    return Prepared(missing, split, ruleset, filter_, privileges,
                    layer.ruleset if layer is not None else None)


def _layered(shared: shared_layer.Layer | None, version: int, grants: list[landlock.Grant],
             denied: list[str]) -> tuple[shared_layer.Layer | None, list[str]]:
    """``(shared, the denied paths left to this policy's own rules)`` when ``shared`` was
    built for this policy's shared denied paths; else ``(None, denied)``."""
    if shared is None or shared.version != version:
        return None, denied
    common, own = shared_layer.partition(grants, denied)
    if tuple(common) != shared.denied:
        shared_layer.mark_mismatch()
    fresh = tuple(common) == shared.denied and shared.fresh()  # as of now, not of the fork
    shared.forked()
    return (shared, own) if fresh else (None, denied)


def warm() -> None:
    """Find now what ``prepare`` needs of this kernel and process, not of the file system
    (the C functions, the Landlock ABI, seccomp and its two BPF programs, capabilities):
    a sandbox zygote calls it once, so that the servers it forks find it all done."""
    calls = _libc()
    _landlock_abi(calls, [])
    for network in (True, False):
        _seccomp_filter(calls, network, [])
    if os.geteuid() == 0:
        _last_cap()
    else:
        _has_capabilities()


_FOUND: dict[object, object] = {}
"""What ``warm`` finds, per process (a fork inherits it): none of it depends on files
but the kernel's own (/proc/sys), which do not change while it runs."""


def _once(key: object, find: Callable[[], object]) -> Any:
    if key not in _FOUND:
        _FOUND[key] = find()
    return _FOUND[key]


def _libc() -> Libc:
    return _once("libc", Libc)


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
    version, why = _once("landlock", lambda: _find_abi(calls))
    if why:
        missing.append(why)
    return version


def _find_abi(calls: Libc) -> tuple[int, str]:
    try:
        return landlock.abi(calls), ""
    except OSError as e:
        why = "disabled at boot" if e.errno == errno.EOPNOTSUPP else "kernel without it"
        return 0, f"Landlock ({why})"


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


def _grants(policy: Policy, resolver: Resolver) -> list[landlock.Grant]:
    grants: list[landlock.Grant] = [("/", landlock.READ)]
    grants += [(resolver.real(p), landlock.WRITE) for p in policy.writable]
    grants += [(resolver.real(p), landlock.DEVICE) for p in DEVICE_FILES]
    grants += [(resolver.real(p), r) for p, r in DEVICE_FOLDERS.items()]
    return [(path, rights) for path, rights in grants if os.path.exists(path)]


def _seccomp_filter(calls: Libc, network: bool, missing: list[str]) -> seccomp.Filter | None:
    """The filter for ``network`` (one per process: ``install`` only reads it)."""
    filter_, why = _once(("seccomp", network), lambda: _find_filter(calls, network))
    if why:
        missing.append(why)
    return filter_


def _find_filter(calls: Libc, network: bool) -> tuple[seccomp.Filter | None, str]:
    arch = seccomp.ARCHES.get(seccomp.machine())
    if arch is None:
        return None, f"seccomp (arch {seccomp.machine()})"
    if not seccomp.supported(calls):
        return None, "seccomp (kernel without it)"
    return seccomp.Filter(calls, seccomp.program(arch, network)), ""


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
    return _once("last_cap", _read_last_cap)


def _read_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63  # drop() stops at the first capability the kernel does not know


def _has_capabilities() -> bool:
    """Whether this process has a capability (found once: a process gains none
    without an exec)."""
    return _once("capabilities", _read_capabilities)


def _read_capabilities() -> bool:
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith("Cap"))
    except OSError:
        return True
    return any(int(fields.get(k, "0"), 16) for k in ("CapPrm", "CapAmb", "CapEff"))
