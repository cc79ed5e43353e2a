"""The seccomp profile of trouper's containers: Docker's default, and no setuid/setgid bit.

A container runs as an unprivileged uid that owns the bind-mounted workspace, so a file
the sandbox made setuid (``cp /bin/busybox x && chmod 4755 x``) would be a door into that
uid for any local user who reaches the folder. The kernel lets an owner set those bits;
this profile does not. A profile given to Docker *replaces* its default, so it is built
from moby's own ``profiles/seccomp/default.json`` (v28.2.2, unchanged through v28.5.2;
shipped verbatim beside this module, ``seccomp/``, Apache-2.0), with these changes:

- ``chmod``, ``fchmod``, ``fchmodat``, ``fchmodat2``, ``creat``, ``mknod``, ``mknodat``:
  allowed only when ``mode & 06000 == 0``; else EPERM;
- ``open``, ``openat``: allowed when the mode has neither bit, or when the flags hold
  neither ``O_CREAT`` nor ``O_TMPFILE`` (then the mode is not used); else EPERM;
- ``openat2``: ENOSYS (its mode sits behind a pointer seccomp cannot read); C libraries
  fall back to ``openat``.

Docker's JSON for an argument rule: ``SCMP_CMP_MASKED_EQ`` matches when
``arg & value == valueTwo``; several rules for one syscall OR together, the ``args`` of
one rule AND. The flag bits are the generic Linux ones (x86, arm, arm64, ppc64le, s390x,
riscv64); on MIPS, where ``O_CREAT`` differs, the flags rule is left out, so an open whose
(unused) mode has those bits fails there too.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

MOBY_PROFILE = Path(__file__).with_name("seccomp") / "moby-default-v28.2.2.json"
"""Docker's default profile as moby v28.2.2 ships it (``seccomp/README.md``)."""
SETID_BITS = 0o6000
"""S_ISUID | S_ISGID."""
O_CREAT = 0o100
O_TMPFILE_BIT = 0o20000000
"""``__O_TMPFILE``: ``O_TMPFILE`` is this bit with ``O_DIRECTORY``; the kernel refuses it
without ``O_DIRECTORY``, so this bit alone marks every open that makes a file."""
ENOSYS = 38
MODE_ARG = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1,
            "mknod": 1, "mknodat": 2, "open": 2, "openat": 3}
"""Index of the ``mode`` argument of each syscall that can set a file's mode."""
FLAGS_ARG = {"open": 1, "openat": 2}
"""Index of the ``flags`` argument of the opens whose mode matters only with O_CREAT."""
GUARDED = (*MODE_ARG, "openat2")
MIPS = ["mips", "mipsle", "mipsel", "mips64", "mips64le", "mipsel64", "mips64n32",
        "mips64p32", "mips3l64n32", "mipsel64n32"]
"""Architecture names Docker may match ``arches`` against on a MIPS host (where the
``open`` flags differ)."""


@functools.lru_cache(maxsize=1)
def profile_json() -> str:
    """The profile, as the ``seccomp=<json>`` security option takes it (built once)."""
    return json.dumps(profile(), separators=(",", ":"))


def profile() -> dict[str, Any]:
    """Docker's default profile with the guarded syscalls allowed only without the
    setuid/setgid bits (see the module docstring)."""
    base = json.loads(MOBY_PROFILE.read_text(encoding="utf-8"))
    return with_setid_rules(base)


def with_setid_rules(base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with every guarded syscall taken out of its unconditional allow rules and
    the argument rules added; ValueError when ``base`` does not allow one of them as
    Docker's default does (a profile this module does not know)."""
    result = copy.deepcopy(base)
    found = set()
    for rule in result["syscalls"]:
        if rule.get("action") != "SCMP_ACT_ALLOW" or _conditional(rule):
            continue
        found.update(name for name in rule["names"] if name in GUARDED)
        rule["names"] = [name for name in rule["names"] if name not in GUARDED]
    missing = sorted(set(GUARDED) - found)
    if missing:
        raise ValueError(f"the base profile does not allow {missing} unconditionally")
    result["syscalls"] = [r for r in result["syscalls"] if r["names"]] + setid_rules()
    return result


def setid_rules() -> list[dict[str, Any]]:
    """The rules that allow the guarded syscalls only without setuid/setgid."""
    rules = [_allow(name, _masked(index, SETID_BITS, 0),
                    "allowed only without the setuid and setgid bits (trouper)")
             for name, index in MODE_ARG.items()]
    for name, index in FLAGS_ARG.items():
        rule = _allow(name, _masked(index, O_CREAT | O_TMPFILE_BIT, 0),
                      "without O_CREAT or O_TMPFILE the mode is not used (trouper)")
        rule["excludes"] = {"arches": MIPS}
        rules.append(rule)
    rules.append({"names": ["openat2"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS,
                  "comment": "its mode is behind a pointer: callers fall back to openat "
                             "(trouper)"})
    return rules


def _allow(name: str, arg: dict[str, Any], comment: str) -> dict[str, Any]:
    return {"names": [name], "action": "SCMP_ACT_ALLOW", "args": [arg], "comment": comment}


def _masked(index: int, mask: int, datum: int) -> dict[str, Any]:
    """Matches when ``arg[index] & mask == datum`` (Docker: ``value`` is the mask)."""
    return {"index": index, "value": mask, "valueTwo": datum, "op": "SCMP_CMP_MASKED_EQ"}


def _conditional(rule: dict[str, Any]) -> bool:
    return bool(rule.get("args") or rule.get("includes") or rule.get("excludes"))
