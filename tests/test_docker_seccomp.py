"""The Docker sandbox's seccomp profile, read the way Docker and libseccomp read it: no
syscall can leave a setuid/setgid bit, nothing else of Docker's default changes.

The profile is evaluated here by a model of Docker's rules (a rule applies when its
includes/excludes match the engine's architecture and the container's capabilities;
several rules for one syscall OR together, the args of one rule AND; MASKED_EQ is
``arg & value == valueTwo``; no match: the default action, EPERM). The real kernel is
asked in tests/test_docker_privileges.py.
"""

from __future__ import annotations

import hashlib
import json
import stat
from typing import Any

import pytest

from trouper.runtimes.docker_seccomp import (
    GUARDED,
    MOBY_PROFILE,
    profile,
    profile_json,
    setid_rules,
    with_setid_rules,
)

EPERM, ENOSYS = 1, 38
O_WRONLY, O_RDWR, O_CREAT, O_DIRECTORY = 0o1, 0o2, 0o100, 0o200000
O_TMPFILE = 0o20000000 | O_DIRECTORY
MOBY_SHA256 = "01536f1d1df938ae611eba20d6349e0de7a99b6ecdee1549427a0b01b8301e28"


def rules_for(prof: dict[str, Any], arch: str, caps: frozenset[str] = frozenset()) -> list:
    """The rules Docker hands to runc for an engine on ``arch`` with ``caps``."""
    kept = []
    for rule in prof["syscalls"]:
        inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
        if arch in exc.get("arches", []) or set(exc.get("caps", [])) & caps:
            continue
        if inc.get("arches") and arch not in inc["arches"]:
            continue
        if not set(inc.get("caps", [])) <= caps:
            continue
        kept.append(rule)
    return kept


def decide(prof: dict[str, Any], name: str, *args: int, arch: str = "amd64") -> str | int:
    """``"allow"``, or the errno the syscall ``name(*args)`` fails with."""
    def holds(cond: dict[str, Any]) -> bool:
        arg = args[cond["index"]] if cond["index"] < len(args) else 0
        op = cond["op"]
        if op == "SCMP_CMP_MASKED_EQ":
            return arg & cond["value"] == cond.get("valueTwo", 0)
        if op == "SCMP_CMP_EQ":
            return arg == cond["value"]
        if op == "SCMP_CMP_NE":
            return arg != cond["value"]
        raise AssertionError(f"the model does not know {op}")

    for rule in rules_for(prof, arch):
        if name in rule["names"] and all(holds(c) for c in rule.get("args") or []):
            if rule["action"] == "SCMP_ACT_ALLOW":
                return "allow"
            return rule.get("errnoRet", EPERM)
    return prof.get("defaultErrnoRet", EPERM)


@pytest.fixture(scope="module")
def prof() -> dict[str, Any]:
    return profile()


def test_the_base_is_mobys_default_profile_unchanged():
    assert hashlib.sha256(MOBY_PROFILE.read_bytes()).hexdigest() == MOBY_SHA256
    assert MOBY_SHA256 in (MOBY_PROFILE.parent / "README.md").read_text()


@pytest.mark.parametrize(("name", "args"), [
    ("chmod", (0, 0o4755)), ("chmod", (0, 0o2755)), ("chmod", (0, 0o6000)),
    ("fchmod", (3, 0o4755)), ("fchmodat", (-100, 0, 0o4711)), ("fchmodat2", (-100, 0, 0o2700, 0)),
    ("creat", (0, 0o4755)), ("mknod", (0, stat.S_IFIFO | 0o4755, 0)),
    ("mknodat", (-100, 0, stat.S_IFREG | 0o2644, 0)),
    ("open", (0, O_CREAT | O_WRONLY, 0o4755)), ("open", (0, O_TMPFILE | O_RDWR, 0o2755)),
    ("openat", (-100, 0, O_CREAT | O_WRONLY, 0o4755)),
    ("openat", (-100, 0, O_TMPFILE | O_RDWR, 0o6755)),
])
def test_every_way_to_a_setuid_or_setgid_bit_fails_with_eperm(prof, name, args):
    assert decide(prof, name, *args) == EPERM


@pytest.mark.parametrize(("name", "args"), [
    ("chmod", (0, 0o755)), ("chmod", (0, 0o1777)), ("fchmod", (3, 0o600)),
    ("fchmodat", (-100, 0, 0o644)), ("fchmodat2", (-100, 0, 0o755, 0)), ("creat", (0, 0o666)),
    ("mknod", (0, stat.S_IFIFO | 0o644, 0)), ("mknodat", (-100, 0, stat.S_IFIFO | 0o600, 0)),
    ("open", (0, O_CREAT | O_WRONLY, 0o666)), ("open", (0, 0, 0)),
    ("open", (0, O_DIRECTORY, 0o4755)),  # no O_CREAT: the mode register is not used
    ("openat", (-100, 0, O_RDWR, 0o6777)), ("openat", (-100, 0, O_TMPFILE | O_RDWR, 0o600)),
])
def test_the_same_syscalls_work_without_those_bits(prof, name, args):
    assert decide(prof, name, *args) == "allow"


def test_openat2_fails_with_enosys_so_callers_fall_back(prof):
    assert decide(prof, "openat2", -100, 0, 0, 24) == ENOSYS


def test_on_mips_an_open_with_a_stray_mode_fails_rather_than_guess_its_flags(prof):
    assert decide(prof, "open", 0, 0, 0o4755, arch="mips64") == EPERM
    assert decide(prof, "open", 0, 0, 0o644, arch="mips64") == "allow"
    assert decide(prof, "open", 0, 0, 0o4755, arch="arm64") == "allow"


def test_nothing_else_of_dockers_default_changes(prof):
    base = json.loads(MOBY_PROFILE.read_text())
    ours = prof["syscalls"][: len(prof["syscalls"]) - len(setid_rules())]
    stripped = [dict(r, names=[n for n in r["names"] if n not in GUARDED])
                for r in base["syscalls"]]
    assert ours == [r for r in stripped if r["names"]]
    assert {k: v for k, v in prof.items() if k != "syscalls"} == {
        k: v for k, v in base.items() if k != "syscalls"}
    for name in ("read", "write", "execve", "clone", "fchown", "rename"):
        assert decide(prof, name, 0, 0, 0) == decide(base, name, 0, 0, 0)
    for name in ("io_uring_setup", "mount", "unshare", "setns", "keyctl"):
        assert decide(prof, name, 0, 0, 0) == EPERM, name  # denied, as by Docker's default


def test_a_base_that_does_not_allow_a_guarded_syscall_is_refused():
    base = json.loads(MOBY_PROFILE.read_text())
    base["syscalls"][0]["names"].remove("fchmodat2")
    with pytest.raises(ValueError, match="fchmodat2"):
        with_setid_rules(base)


def test_the_option_holds_the_profile_as_json(prof):
    assert json.loads(profile_json()) == prof
