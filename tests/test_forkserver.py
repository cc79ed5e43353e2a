"""The suite's fork server: a forked process behaves as a started one where tests look."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trouper.host.processes import listening_sockets, socket_inodes
from trouper.testing.cgroups import new_cgroup, remove_cgroup

from accel import forkserver
from accel.forkserver import ForkedProcess, ForkServer
from accel.zygote import STACKS_SIGNAL

pytestmark = pytest.mark.slow  # starts zygotes (real processes)

LIGHT: list[str] = []
"""What these tests' zygotes import: nothing (the suite's own imports trouper and litellm)."""


@pytest.fixture(scope="module")
def server():
    server = ForkServer(LIGHT)
    yield server
    server.close()


def forked(server: ForkServer, code: str, **kwargs) -> ForkedProcess:
    return ForkedProcess([sys.executable, "-c", code], server, **kwargs)


def test_output_exit_code_input_environment_and_folder(server, tmp_path):
    proc = forked(server, "import os, sys; data = sys.stdin.read();"
                  "print(data.upper(), os.getcwd(), os.environ['TROUPER_ONLY']);"
                  "print('to err', file=sys.stderr); sys.exit(7)",
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                  text=True, env={**os.environ, "TROUPER_ONLY": "this"},
                  cwd=tmp_path)
    out, err = proc.communicate("abc", timeout=60)
    assert (out, err, proc.returncode) == (f"ABC {tmp_path} this\n", "to err\n", 7)


def test_an_uncaught_error_is_exit_1_with_its_traceback(server):
    proc = forked(server, "raise ValueError('boom')", stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "Traceback" in err and "ValueError: boom" in err and "zygote" not in err


def test_signals_end_it_as_they_end_a_started_process(server):
    killed = forked(server, "import time; time.sleep(60)")
    killed.kill()
    assert killed.wait(60) == -signal.SIGKILL
    # SIGINT sent at once: it waits for the child's own handlers, then ends it by SIGINT
    interrupted = forked(server, "import time; time.sleep(60)", stderr=subprocess.DEVNULL)
    interrupted.send_signal(signal.SIGINT)
    assert interrupted.wait(60) == -signal.SIGINT


def test_a_stuck_process_tells_where_its_threads_are(server):
    """STACKS_SIGNAL makes a forked process write each thread's stack to its stderr and
    carry on: how a test that waited too long says where the program hung."""
    proc = forked(server, "import sys, threading\n"
                  "def parked(): threading.Event().wait()\n"
                  "threading.Thread(target=parked, name='parked', daemon=True).start()\n"
                  "print('up', flush=True); sys.stdin.read()",
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    os.kill(proc.pid, STACKS_SIGNAL)
    proc.stdin.write(b"go on")  # still alive: the read returns once stdin closes
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert err.count(b"(most recent call first)") == 2, err
    assert b"in parked" in err


def test_sigint_ignored_and_a_new_session(server):
    proc = forked(server, "import os, signal; print(signal.getsignal(signal.SIGINT) is "
                  "signal.SIG_IGN, os.getsid(0) == os.getpid())",
                  stdout=subprocess.PIPE, text=True, sigint_ignored=True,
                  start_new_session=True)
    assert proc.communicate(timeout=60)[0] == "True True\n"
    plain = forked(server, "import os, signal; print(signal.getsignal(signal.SIGINT) is "
                   "signal.default_int_handler, os.getsid(0) == os.getpid())",
                   stdout=subprocess.PIPE, text=True)
    assert plain.communicate(timeout=60)[0] == "True False\n"


def test_pass_fds_keep_their_numbers_and_nothing_else_leaks_in(server):
    read_end, write_end = os.pipe()
    report = ("import json, os; fds = [int(f) for f in os.listdir('/proc/self/fd')];"
              "found = {}\n"
              "for fd in fds:\n"
              "    try: found[fd] = [os.readlink(f'/proc/self/fd/{fd}').split('[')[0],"
              " os.get_inheritable(fd)]\n"
              "    except OSError: pass\n"
              f"os.write({write_end}, json.dumps(found).encode())")
    proc = forked(server, report, pass_fds=(write_end,))
    os.close(write_end)
    assert proc.wait(60) == 0
    found = json.loads(os.read(read_end, 65536))
    os.close(read_end)
    extra = {fd: what for fd, what in found.items() if int(fd) not in (0, 1, 2, write_end)}
    assert found[str(write_end)] == ["pipe:", True]
    # only its own socket to the zygote (closed on exec), not the zygote's others
    assert list(extra.values()) == [["socket:", False]], extra


def test_a_module_runs_as_main(server, tmp_path):
    proc = ForkedProcess([sys.executable, "-m", "trouper", "--help"], server,
                         stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Usage: trouper" in out


def test_timeout_then_kill_as_subprocess_run_does(server):
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5,
                       server=server)


def test_what_it_cannot_fork_is_started_as_before(monkeypatch):
    assert isinstance(forkserver.Popen(["true"]), subprocess.Popen)
    for argv in ([sys.executable, "-X", "dev", "-c", "pass"], [sys.executable, "-c"]):
        assert not ForkServer().accepts(argv)
    monkeypatch.setenv(forkserver.FORK_ENV, "0")
    started = forkserver.Popen([sys.executable, "-c", "pass"])
    assert isinstance(started, subprocess.Popen)
    started.wait(60)


def test_an_environment_an_import_may_read_gets_a_zygote_of_its_own(tmp_path):
    """A child's environment is the one it was given; variables read on import (here
    PYTHONPATH, as the interpreter reads it) also match, from a new zygote."""
    server = ForkServer(LIGHT)
    code = "import os, sys; print(os.environ.get('TROUPER_X'), '/extra' in sys.path)"
    try:
        outputs = []
        for extra in ({}, {"TROUPER_X": "1"}, {"PYTHONPATH": "/extra"}):
            proc = forked(server, code, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, **extra})
            outputs.append((proc.communicate(timeout=60)[0], server._zygote.pid))
        assert [out for out, _ in outputs] == ["None False\n", "1 False\n", "None True\n"]
        assert outputs[0][1] == outputs[1][1] != outputs[2][1]
    finally:
        server.close()


def test_a_retired_zygote_still_reports_its_childs_exit():
    server = ForkServer(LIGHT)
    try:
        sleeper = forked(server, "import sys; sys.stdin.read(); sys.exit(5)",
                         stdin=subprocess.PIPE)
        forked(server, "pass", env={**os.environ, "PYTHONPATH": "/new"}).wait(60)
        assert sleeper.poll() is None  # its zygote is retired, it runs on
        sleeper.stdin.close()
        assert sleeper.wait(60) == 5
    finally:
        server.close()


def test_the_zygote_listens_nowhere_and_ends_when_closed():
    server = ForkServer(LIGHT)
    proc = forked(server, "pass")
    proc.wait(60)
    zygote = server._zygote
    assert zygote is not None
    tcp = listening_sockets()
    unix_listening = {row.split()[6] for row in Path("/proc/net/unix").read_text()
                      .splitlines()[1:] if row.split()[3] == "00010000"}
    held = socket_inodes(zygote.pid)
    assert held and not held & (set(tcp) | unix_listening)
    server.close()
    assert zygote.returncode == 0


def test_a_cgroup_holds_the_child_and_all_it_starts(server):
    group = new_cgroup(f"trouper-test-fork-{os.getpid()}")
    if group is None:
        pytest.skip("no cgroup can be made here (not root, or no cgroup file system)")
    try:
        proc = forked(server, "import os, subprocess, sys; child = subprocess.Popen("
                      "['sleep', '60'], start_new_session=True); print(child.pid, flush=True);"
                      "sys.stdin.read()", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      cgroup=group)
        grandchild = int(proc.stdout.readline())
        members = {int(p) for p in (group / "cgroup.procs").read_text().split()}
        assert {proc.pid, grandchild} <= members
        os.kill(grandchild, signal.SIGKILL)
        proc.stdin.close()
        assert proc.wait(60) == 0
    finally:
        remove_cgroup(group)


def test_a_forked_process_forks_through_the_same_zygote(server):
    """A bench run forked from the suite's zygote starts its daemons from it too."""
    code = ("import os, sys; from accel import forkserver;"
            "inner = forkserver.run([sys.executable, '-c', 'import os; print(os.getppid())'],"
            " capture_output=True, text=True, timeout=60);"
            "print(inner.stdout.strip(), inner.returncode)")
    proc = forked(server, code, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert out.split() == [str(server._zygote.pid), "0"]


def test_a_worker_is_forked_through_its_stand_in(tmp_path):
    """pytest's workers: ``worker_python`` asks a listening zygote to fork the command
    with its own descriptors, environment and folder, stands for it, and ends as it does
    (its exit status, its signal); a folder open to others is refused."""
    import stat

    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    listening = ForkServer(LIGHT)
    try:
        path = str(folder / "zygote.sock")
        listening.listen(path)
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        zygote = listening._zygote.pid  # noqa: SLF001 - which process forks
        env = {**os.environ, "TROUPER_TEST_ZYGOTE_SOCKET": path, "TROUPER_ONLY": "worker"}
        stand_in = [*forkserver.worker_command().split(), "-u", "-c"]
        code = ("import os, sys; print(os.getppid(), os.getcwd(), os.environ['TROUPER_ONLY'],"
                " sys.stdin.readline().strip(), sys.argv); sys.exit(5)")
        done = subprocess.run([*stand_in, code], input="hello\n", capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=60)
        assert done.stdout.split() == [str(zygote), str(tmp_path), "worker", "hello", "['-c']"]
        assert done.returncode == 5, done.stderr
        killed = subprocess.run([*stand_in, "import os; os.kill(os.getpid(), 9)"], env=env,
                                timeout=60)
        assert killed.returncode == -signal.SIGKILL
    finally:
        listening.close()
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    with pytest.raises(PermissionError):
        ForkServer(LIGHT).listen(str(open_folder / "zygote.sock"))


def test_this_worker_was_forked_from_the_suite_s_zygote():
    """Under pytest-xdist (and unless ``TROUPER_TEST_FORK=0``) the workers are forked from
    the zygote that imported trouper, litellm and pytest: none of them pays its imports."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(forkserver.FORK_ENV) == "0":
        pytest.skip("not an xdist worker forked from the zygote")
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().split(b"\0")
    assert forkserver.ZYGOTE.encode() in parent and b"--listen" in parent
