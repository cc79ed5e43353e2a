"""The confinement's rules without a kernel: the Landlock plan and the seccomp program.

``landlock.plan`` is checked on a real folder tree; the BPF program is run by a small
classic-BPF interpreter here, for every architecture it is written for (aarch64 included,
which this machine may not be), against the table of what it must refuse.
"""

from __future__ import annotations

import os
import random
import socket
import stat
import struct
from pathlib import Path

import pytest

from trouper.runtimes.sandbox import confinement, landlock, seccomp


def test_plan_splits_only_along_the_way_to_denied_paths(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "project" / "src").mkdir(parents=True)
    (home / ".bashrc").write_text("")
    (home / "link").symlink_to(home / ".ssh")
    plan = landlock.plan([(str(home), landlock.WRITE)], [str(home / ".ssh")])
    assert plan.rules == {str(home / "project"): landlock.WRITE,
                          str(home / ".bashrc"): landlock.WRITE & landlock.FILE_RIGHTS}
    assert plan.split == [str(home)]
    assert landlock.plan([(str(home), landlock.READ)], [str(home / ".ssh")]).split == []
    assert landlock.plan([(str(home), landlock.WRITE)], [str(home)]).rules == {}
    assert landlock.plan([(str(home), 7)], [str(tmp_path / "other")]).rules == {str(home): 7}


def test_a_large_file_in_a_split_folder_gets_no_rule_that_would_pin_it(tmp_path: Path) -> None:
    """A rule keeps its file allocated, deleted or not, while a shell's domain lives: a
    user who frees a full disk by deleting a big file in the home must get the space."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".gitconfig").write_text("[user]\n")
    with open(home / "big.iso", "wb") as big:
        big.truncate(landlock.PINNED_FILE_LIMIT + 1)
    plan = landlock.plan([(str(tmp_path), landlock.READ)], [str(home / ".ssh")])
    assert str(home / ".gitconfig") in plan.rules and str(home / "big.iso") not in plan.rules
    assert landlock.plan([(str(home / "big.iso"), landlock.READ)], []).rules  # granted whole


def reference_plan(grants: list, denied: list) -> landlock.Plan:
    """``landlock.plan`` as first written (a list scan per child, a walk per grant): the
    faster walk must give the very same rules and splits."""
    out = landlock.Plan()

    def grant(path: str, rights: int, is_dir: bool, denied: list) -> None:
        if path in denied:
            return
        prefix = path.rstrip("/") + "/"
        inside = [d for d in denied if d.startswith(prefix)]
        if not is_dir:
            rights &= landlock.FILE_RIGHTS
        if not inside:
            if rights:
                out.rules[path] = out.rules.get(path, 0) | rights
            return
        if rights & landlock.MAKE_REG:
            out.split.append(path)
        for name, child_dir, link in landlock._scan(path):
            if not link and (child_dir or not landlock._large(prefix + name)):
                grant(prefix + name, rights, child_dir, inside)

    for path, rights in grants:
        grant(path, rights, os.path.isdir(path) and not os.path.islink(path), list(denied))
    return out


def random_tree(root: Path, rng: random.Random) -> list[Path]:
    """Folders, files (one over the pinning limit), symlinks (to inside, to nowhere)."""
    root.mkdir()
    made = [root]
    for i in range(60):
        parent = rng.choice([p for p in made if p.is_dir() and not p.is_symlink()])
        path = parent / f"{rng.choice('abc')}{i}"
        kind = rng.random()
        if kind < 0.45:
            path.mkdir()
        elif kind < 0.8:
            path.write_text("x")
        elif kind < 0.85:
            with open(path, "wb") as big:
                big.truncate(landlock.PINNED_FILE_LIMIT + 1)
        else:
            path.symlink_to(rng.choice(made) if rng.random() < 0.7 else root / "nowhere")
        made.append(path)
    return made


@pytest.mark.parametrize("seed", range(12))
def test_the_plan_is_the_first_walks_on_random_trees(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    made = random_tree(tmp_path / "t", rng)
    denied = confinement.Resolver().existing(
        str(p) for p in rng.sample(made, 6) + [tmp_path / "t" / "absent"])
    grants = [(str(tmp_path), landlock.READ)] + [
        (os.path.realpath(p), rng.choice([landlock.WRITE, landlock.DEVICE, landlock.READ]))
        for p in rng.sample(made, 4) if p.exists()]
    expected, got = reference_plan(grants, denied), landlock.plan(grants, denied)
    assert got.rules == expected.rules and got.split == expected.split


def test_the_resolver_answers_as_realpath_and_lexists(tmp_path: Path) -> None:
    """Every denied path goes through it: it must resolve exactly as ``os.path.realpath``
    (a symlinked home, a link to a link, a dangling link, a loop, a file as a folder)."""
    real = tmp_path / "real"
    (real / ".ssh").mkdir(parents=True)
    (real / ".netrc").write_text("")
    (tmp_path / "home").symlink_to(real)
    (real / ".aws").symlink_to(real / ".ssh")
    (real / ".kube").symlink_to(real / ".aws")
    (real / ".docker").symlink_to(tmp_path / "gone")
    (real / "loop").symlink_to(real / "loop")
    names = [".ssh", ".ssh/id", ".netrc", ".netrc/x", ".aws", ".aws/config", ".kube",
             ".kube/x/y", ".docker", ".docker/config.json", "loop", "loop/x", "absent",
             "absent/deeper", ".", "..", ".ssh/../.netrc", ""]
    paths = [str(base / n) for base in (real, tmp_path / "home", tmp_path / "nothing")
             for n in names]
    paths += ["/", "//", "//etc", "/etc/shadow", "relative/path", str(tmp_path) + "/home/",
              f"{real}//.ssh", f"{real}/./.ssh", f"{tmp_path}/home/.aws/./x", "/.", "/.."]
    resolver = confinement.Resolver()
    for path in paths * 2:  # the second time from what it kept
        want = os.path.realpath(path)
        assert resolver.resolve(path) == (want, os.path.lexists(want)), path


def verdict(code: bytes, audit: int, nr: int, *args: int) -> str:
    """What the filter ``code`` answers to syscall ``nr`` (a small cBPF interpreter)."""
    data = struct.pack("<IIQ6Q", nr, audit, 0, *(list(args) + [0] * 6)[:6])
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = struct.unpack_from("=HBBI", code, 8 * pc)
        pc += 1
        if op == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x06:  # ret k
            return {0x7FFF0000: "allow", 0x80000000: "kill"}.get(k) or os.strerror(k & 0xFFFF)
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += jt if taken else jf


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
def test_the_seccomp_program_decides_as_the_table_says(machine: str) -> None:
    arch = seccomp.ARCHES[machine]
    nr, audit = arch.numbers, arch.audit
    closed, opened = seccomp.program(arch, False), seccomp.program(arch, True)
    eperm, creat, tmpfile = os.strerror(1), 0o100, 0o20200000
    assert verdict(closed, audit ^ 1, 0) == "kill"  # another arch (ia32, arm)
    assert verdict(closed, audit, nr["openat"], 0, 0, 0) == "allow"
    for name in ("fchmod", "fchmodat", "fchmodat2", "chmod"):
        if name in nr:
            at = 2 if name.startswith("fchmodat") else 1
            mode = [0] * at
            assert verdict(closed, audit, nr[name], *mode, 0o4755) == eperm, name
            assert verdict(closed, audit, nr[name], *mode, 0o2770) == eperm, name
            assert verdict(closed, audit, nr[name], *mode, (1 << 40) | 0o755) == "allow"
    for flags in (creat | 1, tmpfile | 2):
        assert verdict(closed, audit, nr["openat"], 0, 0, flags, 0o4755) == eperm
        assert verdict(closed, audit, nr["openat"], 0, 0, flags, 0o644) == "allow"
    assert verdict(closed, audit, nr["openat"], 0, 0, 1, 0o4755) == "allow"  # no create
    assert verdict(closed, audit, nr["mknodat"], 0, 0, stat.S_IFREG | 0o4755) == eperm
    for name in ("openat2", "io_uring_setup", "io_uring_enter", "io_uring_register",
                 "keyctl", "add_key", "request_key"):
        assert verdict(opened, audit, nr[name]) == os.strerror(38), name  # ENOSYS
    for name in ("socket", "socketpair"):
        assert verdict(closed, audit, nr[name], socket.AF_INET) == os.strerror(13)
        assert verdict(closed, audit, nr[name], socket.AF_UNIX) == "allow"
        assert verdict(opened, audit, nr[name], socket.AF_INET6) == "allow"
    if arch.x32:
        assert verdict(opened, audit, 0x40000000 | nr["openat"], 0, 0, 0) == "kill"
        assert verdict(opened, audit, 0xFFFFFFFF) == "allow"  # a tracer's skipped syscall
