"""A classic-BPF seccomp filter for the local shell, built as bytes in the parent.

What it refuses (everything else is allowed):

- a set-user-ID or set-group-ID bit, ever: ``chmod``, ``fchmod``, ``fchmodat``,
  ``fchmodat2``, ``mknod``, ``mknodat`` and ``creat`` with such a mode, and ``open``,
  ``openat`` with ``O_CREAT`` or ``O_TMPFILE`` and such a mode, fail with EPERM;
  ``openat2`` (whose mode is behind a pointer) fails with ENOSYS, so libc falls back to
  ``openat``;
- io_uring (``io_uring_setup``, ``_enter``, ``_register``: ENOSYS), which performs
  operations (sockets, opens) without the syscalls a filter sees;
- the kernel's keyrings (``keyctl``, ``add_key``, ``request_key``: ENOSYS), where the
  user's session may keep credentials (Docker's default profile refuses them too);
- without network: ``socket`` and ``socketpair`` of any domain but AF_UNIX (EACCES).

The filter first checks the audit architecture and kills the process on another one (an
ia32 syscall from an x86_64 process), and on x86_64 kills x32 syscalls too: their
numbers would otherwise slip past the checks. Arguments are 64-bit; only their low 32
bits are loaded, which is all the kernel reads of a mode, a flag word or a domain.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from typing import Tuple, Union

from .syscalls import Libc

_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _PR_GET_SECCOMP, _MODE_FILTER = 38, 22, 21, 2
_X32_BIT = 0x40000000
_SETID_BITS = 0o6000
_CREATE_FLAGS = 0o100 | 0o20000000
"""O_CREAT and __O_TMPFILE (the same values on x86_64 and aarch64)."""
_AF_UNIX = 1


class Arch:
    """The audit architecture and the syscall numbers the filter needs on one machine."""

    def __init__(self, audit: int, numbers: dict[str, int], x32: bool = False) -> None:
        self.audit = audit
        """AUDIT_ARCH_* of the native syscall ABI."""
        self.numbers = numbers
        """Syscall name -> number; a name the architecture lacks is absent."""
        self.x32 = x32
        """Whether x32 syscalls (numbers with bit 30) share this audit arch."""


_NEW = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "openat2": 437, "fchmodat2": 452}
ARCHES = {
    "x86_64": Arch(0xC000003E, dict(_NEW, chmod=90, fchmod=91, fchmodat=268, creat=85,
                                    mknod=133, mknodat=259, open=2, openat=257,
                                    socket=41, socketpair=53, add_key=248, request_key=249,
                                    keyctl=250), x32=True),
    "aarch64": Arch(0xC00000B7, dict(_NEW, fchmod=52, fchmodat=53, mknodat=33, openat=56,
                                     socket=198, socketpair=199, add_key=217,
                                     request_key=218, keyctl=219)),
}
"""Machines (``os.uname().machine``) the filter is written for, little-endian both."""

_ENOSYS = ("io_uring_setup", "io_uring_enter", "io_uring_register", "openat2", "keyctl",
           "add_key", "request_key")
_MODE_ARG = {"chmod": 1, "fchmod": 1, "creat": 1, "mknod": 1, "fchmodat": 2,
             "fchmodat2": 2, "mknodat": 2}
_OPEN_ARGS = {"open": (1, 2), "openat": (2, 3)}
"""Syscall -> (index of its flags, index of its mode)."""

Op = Tuple[Union[str, int], ...]
"""One instruction before assembly: ``(code, k, jump-if-true, jump-if-false)`` with
label names for the jumps (None: the next instruction), ``("ret", value)``, ``("ld",
offset)`` or ``("label", name)``."""


def machine() -> str:
    """This machine's name as the filter knows it (``os.uname().machine``)."""
    return os.uname().machine


def program(arch: Arch, network: bool) -> bytes:
    """The filter for ``arch`` as ``struct sock_filter`` records (native byte order)."""
    return assemble(_ops(arch, network))


def _ops(arch: Arch, network: bool) -> list[Op]:
    nums = arch.numbers
    ops: list[Op] = [("ld", 4), (_JEQ, arch.audit, None, "kill"), ("ld", 0)]
    if arch.x32:  # x32 shares x86_64's audit arch; -1 is what a tracer's skip looks like
        ops += [(_JGE, _X32_BIT, None, "dispatch"), (_JEQ, 0xFFFFFFFF, "allow", "kill")]
    ops.append(("label", "dispatch"))
    ops += [(_JEQ, nums[name], "enosys", None) for name in _ENOSYS if name in nums]
    ops += [(_JEQ, nums[name], f"mode{i}", None) for name, i in _MODE_ARG.items() if name in nums]
    ops += [(_JEQ, nums[name], f"open{f}", None) for name, (f, _) in _OPEN_ARGS.items()
            if name in nums]
    if not network:
        ops += [(_JEQ, nums[name], "domain", None) for name in ("socket", "socketpair")]
    ops.append(("ret", _RET_ALLOW))
    for flags, mode in sorted(set(_OPEN_ARGS.values())):
        ops += [("label", f"open{flags}"), ("ld", _arg(flags)),
                (_JSET, _CREATE_FLAGS, f"mode{mode}", "allow")]
    for i in sorted(set(_MODE_ARG.values()) | {m for _, m in _OPEN_ARGS.values()}):
        ops += [("label", f"mode{i}"), ("ld", _arg(i)), (_JSET, _SETID_BITS, "eperm", "allow")]
    ops += [("label", "domain"), ("ld", _arg(0)), (_JEQ, _AF_UNIX, "allow", "eacces")]
    for label, value in (("allow", _RET_ALLOW), ("kill", _RET_KILL_PROCESS),
                         ("enosys", _RET_ERRNO | errno.ENOSYS),
                         ("eperm", _RET_ERRNO | errno.EPERM),
                         ("eacces", _RET_ERRNO | errno.EACCES)):
        ops += [("label", label), ("ret", value)]
    return ops


def _arg(index: int) -> int:
    """Offset of the low 32 bits of ``seccomp_data.args[index]``."""
    return 16 + 8 * index + (4 if sys.byteorder == "big" else 0)


def assemble(ops: list[Op]) -> bytes:
    """Resolve labels into forward jump offsets and pack the instructions."""
    labels: dict[str, int] = {}
    code: list[Op] = []
    for op in ops:
        if op[0] == "label":
            labels[str(op[1])] = len(code)
        else:
            code.append(op)
    out = bytearray()
    for at, op in enumerate(code):
        if op[0] == "ld":
            out += struct.pack("=HBBI", _LD_ABS_W, 0, 0, int(op[1]))
        elif op[0] == "ret":
            out += struct.pack("=HBBI", _RET, 0, 0, int(op[1]))
        else:
            jt, jf = (_offset(labels, op[i], at) for i in (2, 3))
            out += struct.pack("=HBBI", int(op[0]), jt, jf, int(op[1]))
    return bytes(out)


def _offset(labels: dict[str, int], label: str | int | None, at: int) -> int:
    if label is None:
        return 0
    offset = labels[str(label)] - at - 1
    if not 0 <= offset <= 255:
        raise ValueError(f"BPF jump to {label} out of range ({offset})")
    return offset


def supported(calls: Libc) -> bool:
    """Whether this kernel has seccomp (PR_GET_SECCOMP answers)."""
    try:
        calls.prctl("PR_GET_SECCOMP", _PR_GET_SECCOMP)
    except OSError:
        return False
    return True


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Filter:
    """A filter program in memory, ready for ``install`` (in the child, after fork)."""

    def __init__(self, calls: Libc, code: bytes) -> None:
        self._calls = calls
        self._buffer = ctypes.create_string_buffer(code, len(code))
        self._fprog = _Fprog(len(code) // 8, ctypes.addressof(self._buffer))
        self._pointer = ctypes.pointer(self._fprog)

    def install(self) -> None:
        """Install the filter on this thread (no_new_privs must be set); OSError if refused."""
        self._calls.prctl("seccomp filter", _PR_SET_SECCOMP, _MODE_FILTER, self._pointer)


def no_new_privs(calls: Libc) -> None:
    """Set PR_SET_NO_NEW_PRIVS: no exec gains privileges (setuid bits, file caps) again."""
    calls.prctl("no_new_privs", _PR_SET_NO_NEW_PRIVS, 1)
