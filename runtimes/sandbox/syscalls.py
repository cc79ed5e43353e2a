"""libc's ``syscall``, ``prctl`` and ``capset`` through ctypes, resolved in the parent.

A child forked from a multi-threaded server must not look a symbol up (``dlsym`` takes
the loader's lock, which another thread may have held at the fork), so every function a
confined child calls is resolved here, before the fork. Each call names its step, and a
failure raises OSError with that name and the kernel's errno.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable

_ULONG_0 = ctypes.c_ulong(0)


class Libc:
    """The C functions confinement calls, resolved once."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(None, use_errno=True)
        self._syscall = lib.syscall
        self._syscall.restype = ctypes.c_long
        self._prctl = lib.prctl
        self._capset = lib.capset

    def syscall(self, step: str, number: int, *args: object) -> int:
        """``syscall(number, *args)`` (ctypes values); its result, or OSError."""
        return _checked(step, self._syscall(ctypes.c_long(number), *args))

    def prctl(self, step: str, option: int, arg2: int = 0, arg3: object = _ULONG_0) -> int:
        """``prctl(option, arg2, arg3, 0, 0)``; its result, or OSError."""
        return _checked(step, self._prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), arg3,
                                          _ULONG_0, _ULONG_0))

    def raw(self, name: str) -> Callable[..., int]:
        """The C function ``name`` (``"syscall"``, ``"prctl"``, ``"capset"``) itself, for
        a loop of calls: its result unchecked (-1 and ``ctypes.get_errno()`` on failure)."""
        return {"syscall": self._syscall, "prctl": self._prctl, "capset": self._capset}[name]

    def capset(self, step: str, header: object, data: object) -> None:
        """``capset(header, data)``, or OSError."""
        _checked(step, self._capset(header, data))


def _checked(step: str, result: int) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{step}: {os.strerror(code)}")
    return result
