"""Killing a shell and its session runs nothing more of the command line it was in."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from trouper.host.processes import pid_alive
from trouper.messages.actions import RunCommand
from trouper.runtimes.local import LocalSandbox
from trouper.runtimes.sandbox import bash as bash_module
from trouper.testing import wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it


def members(sid: int) -> list[int]:
    return [p for p in bash_module._session_members(sid) if pid_alive(p)]  # noqa: SLF001


def test_the_shell_and_its_jobs_are_all_stopped_before_any_is_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The order, read from the signals sent: killing the running job while its shell ran
    let the shell start the next command of the line before its own SIGKILL landed."""
    shell = bash_module.BashProcess(str(tmp_path), {"PATH": os.defpath, "HOME": str(tmp_path)})
    try:
        shell.send_init()
        shell.send(2, "sleep 60 & sleep 60; echo after >> ledger.txt")
        jobs = wait_until(lambda: (lambda m: m if len(m) >= 2 else None)(members(shell.pid)),
                          30, "the two jobs to run")
        sent: list[tuple[int, int]] = []
        kill, killpg = os.kill, os.killpg

        def record_kill(pid: int, signum: int) -> None:
            sent.append((pid, signum))
            kill(pid, signum)

        def record_killpg(group: int, signum: int) -> None:
            sent.append((-group, signum))
            killpg(group, signum)

        monkeypatch.setattr(bash_module.os, "kill", record_kill)
        monkeypatch.setattr(bash_module.os, "killpg", record_killpg)
        shell.kill_all()
        monkeypatch.undo()
        assert sent[0] == (shell.pid, signal.SIGSTOP)
        first_kill = next(i for i, (_, s) in enumerate(sent) if s == signal.SIGKILL)
        stopped = {pid for pid, s in sent[:first_kill] if s == signal.SIGSTOP}
        assert {shell.pid, *jobs} <= stopped
        assert shell.reap_within(10) == -signal.SIGKILL
        wait_until(lambda: not members(shell.pid), 10, "every job to be gone")
        assert not (tmp_path / "ledger.txt").exists()
    finally:
        shell.kill_all()
        shell.reap_within(5)
        shell.close()


def test_stopping_a_sandbox_mid_command_runs_nothing_more_of_its_line(
        make_sandbox: Callable[..., LocalSandbox]) -> None:
    """The same, end to end and racy by nature (the order test above is the exact one):
    before the fix one such stop in three wrote the ledger here."""
    sandbox = make_sandbox()
    ws = sandbox.workspace
    line = ("(for i in $(seq 300); do sleep 60 & done; touch spawned; wait); "
            "echo after >> ledger.txt")
    outcome = sandbox.runtime.execute("a1", RunCommand(command=line), timeout_s=120,
                                      no_output_timeout_s=0.5)
    assert outcome.still_running
    wait_until(lambda: (ws / "spawned").exists(), 60, "the jobs to start")
    shell = sandbox.runtime.alive()["shell_pid"]
    sandbox.stop()
    wait_until(lambda: not pid_alive(shell) and not members(shell), 30,
               "the shell and every process of its session to be gone")
    assert not (ws / "ledger.txt").exists()
