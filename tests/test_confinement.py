"""The local shell's confinement holds, checked from outside on real processes.

Each test starts a small stdlib runner (``python -I -S``, as the sandbox server runs) that
prepares a Policy, forks, applies it in the child and execs ``/bin/sh -c <script>``; the
test then looks at the exit status, the output and the files. Where the kernel lacks a
feature the test skips with the reason; as root, the tests that need the child and its
parent to share credentials (ptrace, signals) run the runner as uid 65532. The rules
themselves (the Landlock plan, the BPF program) are checked in test_confinement_rules.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trouper.runtimes.sandbox import confinement

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

AVAILABLE = confinement.available()
ABI = int(AVAILABLE["landlock_abi"])  # type: ignore[call-overload]
ROOT = os.geteuid() == 0
NOBODY = (65532, 65532)
needs_landlock = pytest.mark.skipif(not AVAILABLE["landlock_abi"],
                                    reason="this kernel has no Landlock")
needs_scoping = pytest.mark.skipif(ABI < 6,
                                   reason="Landlock ABI < 6: no signal scoping")
needs_seccomp = pytest.mark.skipif(not AVAILABLE["seccomp"],
                                   reason=f"no seccomp filter for {AVAILABLE['arch']}")
needs_root = pytest.mark.skipif(not ROOT, reason="only root drops capabilities or uid")

RUNNER = r'''
import json, os, sys, time
spec = json.loads(sys.argv[1])
sys.path.insert(0, spec["path"])
if spec["become"] and os.geteuid() == 0:  # then exec afresh: a dumpable, same-uid parent
    os.setgroups([]); os.setgid(spec["become"][1]); os.setuid(spec["become"][0])
    spec["become"] = None
    os.execv(spec["python"], [spec["python"], "-I", "-S", sys.argv[0], json.dumps(spec)])
from sandbox import confinement
if spec["abi"] == 0:  # as on a kernel without Landlock: a syscall number it lacks (ENOSYS)
    confinement.landlock.SYS_CREATE_RULESET = 1023
elif spec["abi"] is not None:  # as on an older kernel
    confinement.landlock.abi = lambda calls: spec["abi"]
policy = confinement.Policy(**{k: tuple(v) if isinstance(v, list) else v
                               for k, v in spec["policy"].items()})
start = time.perf_counter()
prepared = confinement.prepare(policy)
prepare_s = time.perf_counter() - start
if spec["no_seccomp"]:
    prepared._filter = None
read_fd, write_fd = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        start = time.perf_counter()
        prepared.apply()
        os.write(write_fd, repr(time.perf_counter() - start).encode())
        os.close(write_fd)
        os.execv("/bin/sh", ["sh", "-c", spec["script"]])
    except BaseException as e:
        os.write(2, ("apply failed: %r\n" % (e,)).encode())
    os._exit(126)
prepared.close()
os.close(write_fd)
apply_s = float(os.read(read_fd, 64) or "nan")
status = os.waitpid(pid, 0)[1]
report = {"missing": list(prepared.missing), "split": list(prepared.split),
          "prepare_s": prepare_s, "apply_s": apply_s}
os.write(2, ("\nREPORT " + json.dumps(report) + "\n").encode())
sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
'''


STRAY = Path("/dev/trouper-confinement-test")
"""A file the tests try to create in /dev: must never be made (removed if it was)."""


@pytest.fixture
def stray() -> Iterator[Path]:
    STRAY.unlink(missing_ok=True)
    yield STRAY
    existed = STRAY.exists()
    STRAY.unlink(missing_ok=True)
    assert not existed, f"the confined shell created {STRAY}"


@dataclass
class Run:
    """What a confined command did."""

    code: int
    out: str
    err: str
    report: dict


@pytest.fixture(scope="module")
def runner() -> Iterator[Path]:
    """The runner, beside a copy of the sandbox package: all readable by uid 65532 too
    (the repository may lie in a folder only its owner can enter, as a CI clone does)."""
    folder = Path(tempfile.mkdtemp(prefix="trouper-confine-"))
    shutil.copytree(Path(confinement.__file__).parent, folder / "sandbox",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "runner.py").write_text(RUNNER)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield folder / "runner.py"
    shutil.rmtree(folder)


def confined(runner: Path, script: str, writable: tuple = (), unreadable: tuple = (),
             network: bool = True, drop_to: tuple | None = None, become: bool = False,
             env: dict | None = None, no_seccomp: bool = False, abi: int | None = None) -> Run:
    """Run ``sh -c script`` confined by the Policy; ``become``: the runner as 65532."""
    python = sys.executable
    if become and ROOT:
        python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3")
                       if os.path.exists(p)), "")
        if not python:
            pytest.skip("no system python3 that uid 65532 can run")
    spec = {"path": str(runner.parent), "script": script,
            "policy": {"writable": [str(p) for p in writable],
                       "unreadable": [str(p) for p in unreadable],
                       "network": network, "drop_to": drop_to},
            "become": NOBODY if become else None, "python": python, "no_seccomp": no_seccomp,
            "abi": abi}
    done = subprocess.run([python, "-I", "-S", str(runner), json.dumps(spec)], cwd="/",
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})))
    err, _, report = done.stderr.rpartition("\nREPORT ")
    assert report, done.stderr
    return Run(done.returncode, done.stdout, err, json.loads(report))


def statuses(out: str) -> dict[str, int]:
    """``name=status`` lines printed by a script, as a dict."""
    return {k: int(v) for k, v in (line.split("=", 1) for line in out.split() if "=" in line)}


# -- Landlock ---------------------------------------------------------------------------

@needs_landlock
def test_unreadable_files_and_folders_cannot_be_read_or_listed(runner: Path,
                                                              tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text("KEY")
    (tmp_path / "token").write_text("TOKEN")
    (tmp_path / "notes").write_text("NOTES\n")
    run = confined(runner, f"cd {tmp_path}; cat token; echo token=$?; cat secrets/key; "
                   "echo key=$?; ls secrets; echo ls=$?; cat notes; echo notes=$?",
                   unreadable=(tmp_path / "token", tmp_path / "secrets"))
    assert "TOKEN" not in run.out and "KEY" not in run.out and "NOTES" in run.out
    assert statuses(run.out) == {"token": 1, "key": 1, "ls": 2, "notes": 0}
    assert run.report["missing"] == [] and run.report["split"] == []


@needs_landlock
def test_outside_writable_nothing_is_written_created_or_removed(runner: Path, tmp_path: Path,
                                                               stray: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "f").write_text("kept")
    run = confined(runner, f"cd {tmp_path}/outside; echo x > f; echo write=$?; "
                   "touch new; echo create=$?; mkdir d; echo mkdir=$?; rm -f f; echo rm=$?; "
                   f"mv f g; echo mv=$?; : > {stray}; echo dev=$?",
                   writable=(tmp_path / "ws",))
    assert all(status != 0 for status in statuses(run.out).values()), run.out
    assert sorted(os.listdir(tmp_path / "outside")) == ["f"]
    assert (tmp_path / "outside" / "f").read_text() == "kept"


@needs_landlock
def test_in_writable_files_are_written_renamed_and_folders_made(runner: Path,
                                                              tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    move = "import os; os.rename(\"b\", \"d/e/c\"); os.link(\"d/e/c\", \"d/h\")"
    run = confined(runner, f"cd {ws} && echo one > a && mv a b && mkdir -p d/e && "
                   f"{sys.executable} -c '{move}' && cp d/e/c f && rm f d/h && "
                   "echo two >> d/e/c && ln -s c d/e/l && echo ok", writable=(ws,))
    assert run.out.strip() == "ok", run.err
    assert (ws / "d" / "e" / "c").read_text() == "one\ntwo\n"
    assert sorted(os.listdir(ws)) == ["d"]


@needs_landlock
def test_a_workspace_inside_an_unreadable_home_is_writable(runner: Path,
                                                         tmp_path: Path) -> None:
    home = tmp_path / "trouper-home"
    ws = home / "sessions" / "s1" / "workspace"
    ws.mkdir(parents=True)
    (home / "secrets.json").write_text("SECRET")
    run = confined(runner, f"cd {ws} && echo hi > f && mkdir d && mv f d/f && echo ok; "
                   f"cat {home}/secrets.json; echo cat=$?; ls {home}; echo ls=$?",
                   writable=(ws,), unreadable=(home,))
    assert "ok" in run.out and "SECRET" not in run.out
    assert statuses(run.out) == {"cat": 1, "ls": 2}
    assert (ws / "d" / "f").read_text() == "hi\n"


@needs_landlock
def test_an_unreadable_folder_inside_a_writable_one_stays_unreadable(runner: Path,
                                                                   tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE")
    (home / "project").mkdir()
    (home / ".profile").write_text("")
    run = confined(runner, f"cd {home}; cat .ssh/id_ed25519; echo cat=$?; ls .ssh; echo ls=$?; "
                   "echo x > .ssh/new; echo plant=$?; echo y > project/f; echo project=$?; "
                   "echo z >> .profile; echo profile=$?; touch top; echo top=$?; "
                   "ln .ssh/id_ed25519 project/key; echo link=$?; mv .ssh/id_ed25519 project; "
                   "echo mv=$?",
                   writable=(home,), unreadable=(home / ".ssh", tmp_path / "absent"))
    assert "PRIVATE" not in run.out
    assert statuses(run.out) == {"cat": 1, "ls": 2, "plant": 2, "project": 0, "profile": 0,
                                 "top": 1, "link": 1, "mv": 1}  # top: see Prepared.split
    assert run.report["split"] == [str(home)]
    assert os.listdir(home / ".ssh") == ["id_ed25519"]
    assert (home / ".profile").read_text() == "z\n"


@needs_landlock
def test_the_shell_devices_work_and_no_other(runner: Path, stray: Path) -> None:
    run = confined(runner, "echo x > /dev/null; echo null=$?; head -c1 /dev/urandom >/dev/null; "
                   "echo urandom=$?; echo x > /dev/full; echo full=$?; "
                   "f=/dev/shm/trouper-confinement-$$; echo x > $f && rm $f; echo shm=$?; "
                   f"{sys.executable} -c 'import os; os.openpty()'; echo pty=$?; "
                   f"echo x > {stray}; echo other=$?")
    assert statuses(run.out) == {"null": 0, "urandom": 0, "full": 1, "shm": 0, "pty": 0,
                                 "other": 2}, run.err
    assert "cannot create /dev/full" not in run.err  # opened: it fails on write, as it does


@needs_landlock
def test_the_parents_environment_cannot_be_read(runner: Path) -> None:
    run = confined(runner, "cat /proc/$PPID/environ; echo parent=$?; "
                   "grep -c TROUPER_MARKER /proc/self/environ",
                   become=True, env={"TROUPER_MARKER": "canary-7f3a"})
    assert statuses(run.out)["parent"] == 1 and "Permission denied" in run.err
    assert run.out.split()[-1] == "1"  # its own environ (with the marker) stays readable


@needs_scoping
def test_no_signal_reaches_a_process_outside_the_domain(runner: Path) -> None:
    run = confined(runner, "kill -0 $PPID; echo parent=$?; sleep 60 & kill $!; wait $!; "
                   "echo own=$?", become=True)
    assert statuses(run.out) == {"parent": 1, "own": 143}


@needs_scoping
def test_no_abstract_socket_made_outside_the_domain_is_reached(runner: Path) -> None:
    name = f"trouper-confinement-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("\0" + name)
    listener.listen()
    connect = (f"{sys.executable} -c 'import socket; socket.socket(socket.AF_UNIX).connect"
               f"(\"\\0{name}\")'; echo outside=$?; {sys.executable} -c 'import socket; "
               "s = socket.socket(socket.AF_UNIX); s.bind(\"\\0inner\"); s.listen(); "
               "socket.socket(socket.AF_UNIX).connect(\"\\0inner\")'; echo inside=$?")
    try:
        run = confined(runner, connect)
    finally:
        listener.close()
    assert statuses(run.out) == {"outside": 1, "inside": 0}, run.err
    assert "PermissionError" in run.err


GAPS = {1: ["truncate", "TCP", "ioctl", "scoping"], 2: ["truncate", "TCP", "ioctl", "scoping"],
        3: ["TCP", "ioctl", "scoping"], 4: ["ioctl", "scoping"], 5: ["scoping"], 6: [], 7: []}
"""Words ``missing`` holds, by Landlock ABI, for a policy without network."""


@needs_landlock
@pytest.mark.parametrize("abi", [*GAPS, 0])
def test_each_older_abi_confines_with_what_it_has(runner: Path, tmp_path: Path,
                                                  abi: int) -> None:
    if abi > ABI:
        pytest.skip(f"this kernel has Landlock ABI {AVAILABLE['landlock_abi']} < {abi}")
    (tmp_path / "ws" / "d").mkdir(parents=True)
    (tmp_path / "secret").write_text("SECRET\n")
    rename = "import os; os.rename(\"f\", \"d/f\")"
    run = confined(runner, f"cd {tmp_path}/ws; cat ../secret; echo cat=$?; echo x > f; "
                   f"echo write=$?; echo y > ../outside; echo outside=$?; {sys.executable} "
                   f"-c '{rename}'; echo rename=$?; touch s; chmod 4755 s; echo setuid=$?",
                   writable=(tmp_path / "ws",), unreadable=(tmp_path / "secret",),
                   network=False, abi=abi)
    landlock_on = abi > 0
    assert statuses(run.out) == {"cat": int(landlock_on), "write": 0,
                                 "outside": 2 * landlock_on, "setuid": 1,
                                 "rename": int(abi == 1)}  # ABI 1 never moves across folders
    missing = " ".join(run.report["missing"])
    words = GAPS.get(abi, ["kernel without it"])
    assert all(word in missing for word in words) and len(run.report["missing"]) == len(words)


@needs_landlock
def test_without_seccomp_landlock_alone_refuses_tcp(runner: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    check = (f"{sys.executable} -c 'import socket; socket.create_connection"
             f"((\"127.0.0.1\", {port}), timeout=10)'; echo connect=$?")
    try:
        closed = confined(runner, check, network=False, no_seccomp=True)
        open_ = confined(runner, check, network=True, no_seccomp=True)
    finally:
        listener.close()
    assert statuses(closed.out) == {"connect": 1} and "PermissionError" in closed.err
    assert statuses(open_.out) == {"connect": 0}


# -- seccomp ----------------------------------------------------------------------------

@needs_seccomp
def test_no_file_ever_gets_a_setuid_or_setgid_bit(runner: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    py = sys.executable
    run = confined(runner, f"cd {ws}; touch a b; echo x > src; mkdir d; "
                   "chmod 4755 a; echo chmod=$?; chmod g+s b; echo gs=$?; chmod g+s d; "
                   "echo dir=$?; install -m 4755 src c; echo install=$?; "
                   f"{py} -c 'import os; os.open(\"o\", os.O_CREAT | os.O_WRONLY, 0o4755)'; "
                   f"echo open=$?; {py} -c 'import os, stat; os.mknod(\"m\", stat.S_IFREG | "
                   "0o2755)'; echo mknod=$?; chmod 750 a; echo plain=$?", writable=(ws,))
    codes = statuses(run.out)
    assert codes.pop("plain") == 0 and all(codes.values()), run.out
    assert "Operation not permitted" in run.err
    for name in ("a", "b", "c", "d"):
        assert stat.S_IMODE((ws / name).stat().st_mode) & 0o6000 == 0, name
    assert stat.S_IMODE((ws / "a").stat().st_mode) == 0o750
    assert not (ws / "o").exists() and not (ws / "m").exists()


@needs_seccomp
def test_openat2_and_io_uring_are_not_there(runner: Path) -> None:
    probe = ("import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
             "libc.syscall.restype = ctypes.c_long; buf = ctypes.create_string_buffer(128); "
             "print('openat2=%d' % (libc.syscall(437, -100, b'/', buf, 24) < 0 and "
             "ctypes.get_errno())); print('io_uring=%d' % (libc.syscall(425, 1, buf) < 0 "
             "and ctypes.get_errno())); print('keyctl=%d' % (libc.syscall("
             f"{confinement.seccomp.ARCHES[confinement.seccomp.machine()].numbers['keyctl']}, "
             "0, -3, 0) < 0 and ctypes.get_errno()))")  # the session keyring's id
    run = confined(runner, f"{sys.executable} -c \"{probe}\"; ls / > /dev/null; echo ls=$?")
    assert statuses(run.out) == {"openat2": 38, "io_uring": 38, "keyctl": 38, "ls": 0}, \
        run.err  # ENOSYS


@needs_seccomp
@pytest.mark.skipif(AVAILABLE["arch"] != "x86_64", reason="ia32 syscalls exist on x86_64")
def test_a_syscall_of_a_foreign_arch_kills_the_process(runner: Path) -> None:
    # mov eax, 20 (ia32 getpid); int 0x80; ret: a 32-bit syscall from a 64-bit process
    probe = ("import ctypes, mmap; m = mmap.mmap(-1, 4096, prot=7); "
             "m.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])); "
             "addr = ctypes.addressof(ctypes.c_char.from_buffer(m)); "
             "print(ctypes.CFUNCTYPE(ctypes.c_int)(addr)())")
    run = confined(runner, f"{sys.executable} -c '{probe}'; echo ia32=$?")
    assert statuses(run.out) == {"ia32": 128 + 31}, run.out + run.err  # SIGSYS


@needs_seccomp
def test_without_network_only_unix_sockets_are_made(runner: Path) -> None:
    py = sys.executable
    script = (f"{py} -c 'import socket; socket.socket()'; echo inet=$?; "
              f"{py} -c 'import socket; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)'; "
              f"echo udp6=$?; {py} -c 'import socket; a, b = socket.socketpair(); "
              "a.send(b\"x\"); assert b.recv(1) == b\"x\"'; echo pair=$?")
    closed = confined(runner, script, network=False)
    assert statuses(closed.out) == {"inet": 1, "udp6": 1, "pair": 0}
    assert "PermissionError" in closed.err
    assert statuses(confined(runner, script).out) == {"inet": 0, "udp6": 0, "pair": 0}


# -- privileges -------------------------------------------------------------------------

@needs_root
def test_root_keeps_no_capability(runner: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_text("")
    bits = 'import ctypes; print("securebits=%d" % ctypes.CDLL(None).prctl(27, 0, 0, 0, 0))'
    run = confined(runner, f"grep -E '^(Cap|NoNewPrivs)' /proc/self/status; id -u; "
                   f"chown 1234 {ws}/f; echo chown=$?; {sys.executable} -c '{bits}'",
                   writable=(ws,))
    status = dict(line.split(":\t") for line in run.out.splitlines() if ":\t" in line)
    assert {k: int(v, 16) for k, v in status.items()} == {
        "CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0, "NoNewPrivs": 1}
    assert "\n0\n" in run.out and statuses(run.out)["chown"] == 1
    assert statuses(run.out)["securebits"] == 0b11101111
    assert (ws / "f").stat().st_uid == 0


@needs_root
def test_root_becomes_drop_to(runner: Path) -> None:
    ws = runner.parent / "ws"  # in a 0755 folder: uid 65532 reaches it
    ws.mkdir()
    os.chown(ws, *NOBODY)
    run = confined(runner, f"id -u; id -g; id -G; touch {ws}/f", writable=(ws,),
                   drop_to=NOBODY)
    assert run.out.split() == ["65532"] * 3 and run.code == 0, run.err
    assert (ws / "f").stat().st_uid == 65532


def test_missing_names_what_this_machine_lacks(runner: Path) -> None:
    run = confined(runner, "true", drop_to=None if ROOT else (4321, 4321))
    missing = run.report["missing"]
    assert any("Landlock" in m for m in missing) == (ABI < 6)
    assert any("seccomp" in m for m in missing) == (not AVAILABLE["seccomp"])
    assert any("drop_to" in m for m in missing) == (not ROOT)
