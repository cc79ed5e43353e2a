"""A stopped session's sandbox: ended at once, and a fresh one when the session goes on.

Entering a state of ``ENDS_SANDBOX`` (STOPPED, whether by the user's stop or a budget:
its rows in ``core.states.TABLE`` end with ``END_SANDBOX``) asks the adapter to end the
sandbox (``EndSandbox``): its shell, every job the shell started, and its container
unless ``keep``. What was in flight comes back first, with its real outcome when it has
one (a command the end killed reads ``interrupted``, from the sandbox's own journal); an
action whose result never comes back is recorded here once the sandbox is ended
(``SandboxEnded``): ``interrupted``, or ``lost`` when its journal was still being asked,
saying the session was stopped. It is never run again (I1, I2). The stop's answer waits
for the end, ``END_ANSWER_WAIT_S`` at most, so that ``Session.stop()`` returns with the
sandbox gone.

Leaving STOPPED (a resume, a message: ``FRESH_SANDBOX``) asks for a fresh sandbox
(``RestartRuntime``), once the end is done, and tells the agent its shell state was
reset. A session restored in STOPPED ends whatever sandbox is left of it (a program that
died mid-stop), once its journal has answered for what was in flight.

The promises cited (I1, I2) are defined in docs/promises.md.
"""

from __future__ import annotations

import logging
from typing import Any

from ..messages.events import MessageEvent, ObservationEvent, RuntimeEvent
from ..messages.outcomes import Outcome
from .effects import Answer, EndSandbox, RestartRuntime, SandboxEnded, StartTimer
from .loop import SessionLoop
from .states import ENDS_SANDBOX

logger = logging.getLogger(__name__)

STOPPED_IN_FLIGHT = (
    "The session was stopped while this action was in flight: its sandbox was ended (the "
    "shell and every job it started were killed) before the action's result came back. "
    "It was not run again. Check its effects before repeating it.")
"""The outcome of an action whose result did not come back from the ended sandbox."""
SHELL_RESET = (
    "[trouper: this session was stopped, which ended its sandbox; it now goes on in a "
    "fresh one. The shell starts anew in the workspace: the working directory, exported "
    "variables and background jobs from before are gone. The workspace's files are kept.]")
"""What the agent is told when its session goes on after a stop (in its prompt)."""
ENDED = "the session stopped: its shell and every job it started were ended"
"""The detail of the ``closed`` runtime event (a status line: never in a prompt)."""
END_ANSWER_WAIT_S = 10.0
"""Longest a stop's answer waits for the sandbox's end (a slower end goes on after it)."""


class SandboxEnding(SessionLoop):
    """The sandbox rules of STOPPED (see the module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: list[Answer] = []
        """Stop commands answered once the sandbox has ended (or the wait is over)."""
        self.end_token = 0
        """Counts the ends asked for: a wait's timer names the end it waits for."""

    def _end_if_stopped(self, restored: bool = False) -> None:
        """In a state that ends the sandbox, ask for its end once, as soon as nothing
        needs the sandbox first: at once while it runs (the end answers for what runs in
        it), or with none running when nothing is left to ask its journal. ``restored``:
        the first step of a restored core, which ends whatever is left even when its log
        says it was ended (so that nothing starts one meanwhile)."""
        if self.view.state not in ENDS_SANDBOX or self.ending:
            return
        if not self.runtime_ready and (self.resolve_first
                                       or (self.sandbox_ended and not restored)):
            return  # the journal answers first, once the sandbox is back; or ended already
        self.ending, self.runtime_ready = True, False
        self.end_token += 1
        self._out.append(EndSandbox(self.view.reason or "stopped"))

    def _fresh_sandbox(self) -> None:
        """The session goes on after a stop: a fresh sandbox (once the end is done: see
        ``_on_sandbox_ended``), and the agent told that its shell state is gone."""
        if self.ending:
            pass  # asked for when the end is done
        elif self.sandbox_ended:
            self.sandbox_ended, self.runtime_down = False, False
            self._out.append(RestartRuntime("the session goes on after a stop"))
        else:
            return  # its sandbox was never ended (still coming back): nothing was reset
        self._append(MessageEvent(source="environment", text=SHELL_RESET))

    def _on_sandbox_ended(self, msg: SandboxEnded) -> None:
        if not self.ending:
            logger.info("session %s: a sandbox end nobody waits for; ignored", self.session_id)
            return
        self.ending, self.runtime_ready = False, False
        events: list[Any] = self._never_came_back()
        if not self.sandbox_ended:
            events.append(RuntimeEvent(phase="closed", detail=ENDED))
        if events:
            self._append(*events)
        self._release_answers()
        if self.view.state not in ENDS_SANDBOX:  # it went on meanwhile: a fresh one now
            self.sandbox_ended, self.runtime_down = False, False
            self._out.append(RestartRuntime("the session goes on after a stop"))

    def _never_came_back(self) -> list[Any]:
        """An outcome for each action in flight whose result the ended sandbox never gave
        (``interrupted``; ``lost`` where its journal was being asked)."""
        in_flight = [(self.dispatched, "interrupted")] if self.dispatched else []
        in_flight += [(action_id, "lost") for action_id in sorted(self.resolve_first)]
        self.dispatched = None
        self.resolve_first.clear()
        return [ObservationEvent(action_id=action_id, outcome=Outcome(
                    status=status, content=STOPPED_IN_FLIGHT))  # type: ignore[arg-type]
                for action_id, status in in_flight if action_id in self.view.pending]

    # -- a stop's answer waits for the end --------------------------------------------

    def _answer_stop(self, answer: Answer) -> None:
        if not self.ending:
            self._out.append(answer)
            return
        if not self.held:
            self._out.append(StartTimer("end_answer", END_ANSWER_WAIT_S, self.end_token))
        self.held.append(answer)

    def _release_answers(self) -> None:
        held, self.held = self.held, []
        self._out.extend(held)

    def _end_waited(self, token: int) -> None:
        if token == self.end_token and self.held:
            logger.warning("session %s: the sandbox has not ended within %g s; the stop is "
                           "answered, and the end goes on", self.session_id, END_ANSWER_WAIT_S)
            self._release_answers()
