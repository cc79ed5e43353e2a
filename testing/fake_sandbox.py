"""A sandbox backend that runs nothing, for testing a runtime driver's rules without a
process: ``FakeSandbox`` (its ``FakeRuntime`` records what it was asked and raises what
the test queues), and ``run``, which performs a driver's ``Work`` at once (or holds it in a
``Held`` until ``finish``) and returns the other effects in order."""

from __future__ import annotations

from typing import Any

from ..messages.actions import RunCommand
from ..messages.outcomes import Outcome
from ..messages.protocol import Execute
from ..runtimes.base import JournalRecord, SandboxHealth
from ..runtimes.driver import Work

SID = "s-1"
OK = Outcome(status="ok", content="done")


class FakeRuntime:
    def __init__(self) -> None:
        self.executed: list[str] = []
        self.execute_errors: list[BaseException] = []
        self.records: list[JournalRecord] = []

    def execute(self, action_id: str, action: Any, *, timeout_s: float,
                no_output_timeout_s: float, checkpoint: Any = None) -> Outcome:
        if self.execute_errors:
            raise self.execute_errors.pop(0)
        self.executed.append(action_id)
        return OK

    def resolve(self, action_id: str, *, wait_s: float = 0.0) -> JournalRecord:
        return self.records.pop(0)


class FakeSandbox:
    def __init__(self) -> None:
        self.runtime = FakeRuntime()
        self.epoch: int | None = None
        self.start_error: BaseException | None = None
        self.health = SandboxHealth(alive=True)
        self.stops = 0
        self.cancels = 0

    def start(self) -> bool:
        if self.start_error is not None:
            raise self.start_error
        self.epoch = 7
        return False

    def alive(self) -> SandboxHealth:
        return self.health

    def stop(self) -> None:
        self.stops += 1

    def cancel(self) -> None:
        self.cancels += 1


class Held:
    """Work effects kept, to be finished when the test says (a worker still busy)."""

    def __init__(self) -> None:
        self.work: list[Work] = []


def run(effects: list[Any], held: Held | None = None) -> list[Any]:
    """Perform Work at once (the worker's result fed back); the other effects, in order."""
    out: list[Any] = []
    for effect in effects:
        if isinstance(effect, Work):
            if held is not None:
                held.work.append(effect)
                continue
            try:
                result, error = effect.fn(), None
            except Exception as exc:  # noqa: BLE001 - as the worker pool hands it back
                result, error = None, exc
            out += run(effect.then(result, error))
        else:
            out.append(effect)
    return out


def finish(held: Held) -> list[Any]:
    work, held.work = held.work, []
    return run(work)


def execute(action_id: str = "a1", session_id: str = SID) -> Execute:
    return Execute(session_id=session_id, action_id=action_id,
                   action=RunCommand(command="true"), timeout_s=10, no_output_timeout_s=5)


