"""The journal contract of ``runtimes/base.py`` as tests every sandbox backend must pass.

A backend's test module subclasses ``SandboxContract`` and provides the ``new_sandbox``
fixture: a factory of *new* ``Sandbox`` objects for one and the same session (a second
object stands for a restarted proxy), each stopped by the fixture at the end::

    class TestLocalContract(SandboxContract):
        @pytest.fixture
        def new_sandbox(self, tmp_path):
            ...
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ..exceptions import StaleEpoch
from ..messages.actions import RunCommand
from ..runtimes.base import Sandbox
from .faults import wait_until

LIMITS = {"timeout_s": 30.0, "no_output_timeout_s": 20.0}


class SandboxContract:
    """Inherit, and provide ``new_sandbox`` and ``workspace`` fixtures."""

    @pytest.fixture
    def new_sandbox(self) -> Callable[[], Sandbox]:  # pragma: no cover - overridden
        raise NotImplementedError

    @pytest.fixture
    def workspace(self) -> Path:  # pragma: no cover - overridden
        raise NotImplementedError

    def test_an_action_id_runs_once(
        self, new_sandbox: Callable[[], Sandbox], workspace: Path
    ) -> None:
        sandbox = new_sandbox()
        sandbox.start(1)
        command = RunCommand(command="echo x >> ledger.txt")
        first = sandbox.runtime.execute("a-1", command, **LIMITS)
        again = sandbox.runtime.execute("a-1", command, **LIMITS)
        assert first == again and first.status == "ok"
        assert (workspace / "ledger.txt").read_text() == "x\n"

    def test_resolve_never_runs_anything(
        self, new_sandbox: Callable[[], Sandbox], workspace: Path
    ) -> None:
        sandbox = new_sandbox()
        sandbox.start(1)
        assert sandbox.runtime.resolve("never-sent").state == "absent"
        sandbox.runtime.execute("a-2", RunCommand(command="echo y >> ledger.txt"), **LIMITS)
        record = sandbox.runtime.resolve("a-2")
        assert record.state == "finished" and record.outcome is not None
        assert (workspace / "ledger.txt").read_text() == "y\n"

    def test_a_newer_epoch_attaches_and_fences_the_older(
        self, new_sandbox: Callable[[], Sandbox], workspace: Path
    ) -> None:
        old = new_sandbox()
        old.start(1)
        old.runtime.execute("a-3", RunCommand(command="cd /tmp && export K=v"), **LIMITS)
        new = new_sandbox()
        assert new.start(2) is True  # the same sandbox, re-attached
        shell = new.runtime.execute("a-4", RunCommand(command="echo $PWD $K"), **LIMITS)
        assert shell.content.split()[:2] == ["/tmp", "v"]  # the shell's state survived
        with pytest.raises(StaleEpoch):
            old.runtime.execute("a-5", RunCommand(command="echo no >> ledger.txt"), **LIMITS)
        assert not (workspace / "ledger.txt").exists()
        assert new.runtime.resolve("a-5").state == "absent"

    def test_each_start_claims_the_next_epoch_the_sandbox_counts(
        self, new_sandbox: Callable[[], Sandbox], workspace: Path
    ) -> None:
        """No clock decides who owns the sandbox: a wall clock stepped back cannot make it
        refuse the newest proxy. Even after an explicit (say, clock-made) high epoch, the
        next start claims one past it."""
        old = new_sandbox()
        old.start(10**12)  # what a millisecond clock once handed out
        new = new_sandbox()
        assert new.start() is True and new.epoch == 10**12 + 1
        newest = new_sandbox()
        newest.start()
        assert newest.epoch == 10**12 + 2
        with pytest.raises(StaleEpoch):
            new.runtime.execute("a-6", RunCommand(command="echo no >> ledger.txt"), **LIMITS)
        assert newest.runtime.execute("a-7", RunCommand(command="true"), **LIMITS).status == "ok"

    def test_kill_crashes_it_and_a_fresh_object_sees_it(
        self, new_sandbox: Callable[[], Sandbox], workspace: Path
    ) -> None:
        """Fault injection goes through the interface: a fresh object for the session (as
        the harness makes) says it runs, kills it, and says it does not any more."""
        sandbox = new_sandbox()
        assert new_sandbox().kill() is None  # nothing runs yet: nothing to kill
        sandbox.start(1)
        observer = new_sandbox()
        assert observer.running()
        assert observer.kill() is not None
        wait_until(lambda: not observer.running(), 10, "the killed sandbox to stop running")
        assert not sandbox.alive().alive
