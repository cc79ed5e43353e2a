"""The session's loop: one step, from the model's reply to the next question.

A step's two inputs are handled here: ``_on_completed`` records the model's reply (its
tool calls as intents) and ``_on_executed`` an action's outcome; each then calls
``_advance``, which takes the next step when the session is RUNNING and nothing is
outstanding: the first action without an outcome, else a limit, else a question to the
model. An action's intent is durable before it runs (I2 in docs/promises.md), its
outcome recorded once (I1), and an action that may have run on a lost sandbox is asked
of the journal, never run again. Every other input (the runtime's lifecycle, the
journal's answers, a failed model call, timers, the user's commands) is
``core.session``'s, which is also the one entry point (``SessionCore.handle``).
"""

from __future__ import annotations

import logging
from typing import Any

from ..agent.condense import HEAD, condensed
from ..agent.parse import parse_response
from ..agent.tools import tool_specs
from ..config.confirmation import needs_confirmation, summary
from ..messages.actions import CloneRepository, Finish, ListMcpTools, McpCall, RunCommand, Think
from ..messages.events import (
    ActionEvent,
    AgentState,
    LLMCompleted,
    MessageEvent,
    ObservationEvent,
    PromptCondensed,
)
from ..messages.outcomes import Outcome
from ..messages.protocol import (
    Complete,
    Completed,
    Execute,
    Executed,
    ToolCall,
)
from .effects import (
    AskJournal,
    AskModel,
    CancelModel,
    ReadInstructions,
    RestartRuntime,
    RunAction,
)
from .machine import BACK_AFTER_SANDBOX, SessionMachine
from .mcp_listing import listing_recorded
from .states import Why
from .summary import due_cut, summary_messages

logger = logging.getLogger(__name__)

LOST_CONTENT = ("This action's result is unknown: the sandbox that ran it was lost before it "
                "reported back. It was not run again. Check its effects before repeating it.")



class SessionLoop(SessionMachine):
    """The step rules of a session (see the module doc)."""

    # -- the step's two inputs: the model's reply, an action's outcome -------------------

    def _ours(self, request_id: str) -> bool:
        return self.llm_request is not None and request_id == self.llm_request.request_id

    def _on_completed(self, msg: Completed) -> None:
        if not self._ours(msg.request_id):
            return  # the answer to a cancelled or superseded request
        self.llm_request = None
        summarized, self.summarizing = self.summarizing, None
        if self.view.state != AgentState.RUNNING:
            # actions recorded now could not run and would wait without an outcome (I5);
            # RUNNING again asks anew
            logger.info("session %s: dropped a model reply that came in %s",
                        self.session_id, self.view.state.value)
            return
        self.condensed_retry = False
        usage = LLMCompleted(
            request_id=msg.request_id, model=msg.model, prompt_tokens=msg.prompt_tokens,
            completion_tokens=msg.completion_tokens, cost_usd=msg.cost_usd,
            latency_s=msg.latency_s, attempts=msg.attempts)
        if summarized is not None:  # the summarizing condenser's answer: the prompt's
            self._append(usage, PromptCondensed(  # older half, in the log once
                cut=summarized, dropped=summarized - HEAD, summary=msg.content.strip(),
                reason="summarized before the prompt grew too long"))
            self._advance()
            return
        parsed = parse_response(self.new_id()[:12], msg.content, msg.tool_calls,
                                lambda: self.new_id()[:16], self.view.mcp_tools)
        if not parsed:
            self._append(usage, MessageEvent(source="agent", text=msg.content))
            self._move(Why.TEXT_REPLY, "the agent replied with text")
            return
        self._append(usage, *[p.event for p in parsed])  # intents durable before dispatch
        rejected = [ObservationEvent(action_id=p.event.action_id, outcome=p.rejection)
                    for p in parsed if p.rejection is not None]
        if rejected:
            self._append(*rejected)
        self._advance()

    def _on_executed(self, msg: Executed) -> None:
        if msg.action_id == self.dispatched:
            self.dispatched = None
        self._record(msg.action_id, msg.outcome)

    # -- the loop ------------------------------------------------------------------------

    def _advance(self) -> None:
        """Take the next step if the session is RUNNING and nothing is outstanding."""
        if self.view.state != AgentState.RUNNING or not self.runtime_ready:
            return
        if self.dispatched is not None or self.llm_request is not None:
            return
        if self.view.pending:
            self._handle_action(next(iter(self.view.pending.values())))
        elif not self._limit_reached() and not self._stuck():
            self._ask_model()

    def _stuck(self) -> bool:
        """Pause an agent that repeats itself (``core/stuck.py``): checked before each
        question to the model, from the log's steps, so a restored core decides alike."""
        verdict = self.stuck.verdict(self.config.stuck)
        if verdict is None:
            return False
        return self._move(Why.STUCK, f"{verdict}; send a hint and resume")

    def _limit_reached(self) -> bool:
        spent = self._budget_spent()
        if spent is None:
            return False
        why, reason = spent
        if self.config.on_budget == "ask":
            return self._move(Why.BUDGET_ASK, f"{reason}; raise it to carry on (budget), "
                              "or stop the session")
        return self._move(why, reason)

    def _budget_spent(self, max_cost_usd: float | None = None,
                      max_iterations: int | None = None) -> tuple[Why, str] | None:
        """Which budget ran out and by how much (the user's latest ``BudgetChanged``
        over the config's; or the limits given); None while both last."""
        view, config = self.view, self.config
        iterations = max_iterations or view.max_iterations or config.max_iterations
        cost = max_cost_usd if max_cost_usd is not None else (
            view.max_cost_usd if view.max_cost_usd is not None else config.max_cost_usd)
        if view.iterations >= iterations:
            then = ("" if config.on_budget == "ask" else "; resume to allow as many again")
            return Why.MAX_ITERATIONS, f"reached max_iterations ({iterations} model calls){then}"
        if cost is not None and view.cost_usd >= cost:
            return Why.MAX_COST, (f"spent ${view.cost_usd:.4f} of max_cost_usd ${cost:.4f} "
                                  f"(over by ${view.cost_usd - cost:.4f})")
        return None

    def _ask_model(self) -> None:
        messages = self.prompt.messages()
        new_cut = due_cut(self.config, messages, self.cut, self.summary)
        if new_cut is not None:  # the summarizing condenser first (core/summary.py)
            llm = self.config.llm
            if self.config.summary_model:
                llm = llm.model_copy(update={"model": self.config.summary_model})
            self._send(llm, summary_messages(messages, self.cut, new_cut, self.summary), [])
            self.summarizing = new_cut
            return
        self._send(self.config.llm, condensed(messages, self.cut, self.summary),
                   self._offered_tools())

    def _offered_tools(self) -> list[dict[str, Any]]:
        """trouper's tools, then the MCP servers' (the same list object while they stay
        the same: the broker sends only what changed)."""
        mcp = self.view.mcp_tools
        if not mcp:
            return tool_specs()
        if self._tools_for is not mcp:
            self._tools = [*tool_specs(), *(tool.spec() for tool in mcp.values())]
            self._tools_for = mcp
        return self._tools

    def _send(self, llm: Any, messages: list[dict[str, Any]], tools: list[Any]) -> None:
        # model_construct: the history is ours and already valid; validating it again
        # would walk every message of the session on every step
        self.llm_request = Complete.model_construct(
            request_id=self.new_id(), session_id=self.session_id, llm=llm,
            messages=messages, tools=tools, turn=self.view.total_iterations,
            lift_cooldown=self.lift_cooldown)
        self.lift_cooldown = False
        self._out.append(AskModel(self.llm_request))

    def _cancel_model_call(self) -> None:
        if self.llm_request is not None:
            self._out.append(CancelModel(self.llm_request.request_id))
        self.llm_request, self.summarizing = None, None

    # -- actions -------------------------------------------------------------------------

    def _handle_action(self, event: ActionEvent) -> None:
        action = event.action
        if action is None:
            self._record(event.action_id, _rejection_of(event, self.view.mcp_tools))
        elif isinstance(action, Think):
            self._record(event.action_id, Outcome(status="ok", content="Thought recorded."))
        elif isinstance(action, Finish):
            self._finish(event, action)
        elif event.action_id in self.resolve_first:
            return  # its journal is being asked
        elif not self._waits_for_approval(event):
            self._dispatch(event)

    def _waits_for_approval(self, event: ActionEvent) -> bool:
        """Confirmation mode: an agent's action the policy holds, not yet approved, moves
        the session to AWAITING_USER_CONFIRMATION (the user's approve or reject goes on)."""
        if event.source != "agent" or event.action_id in self.view.approved:
            return False
        why = needs_confirmation(self.config.confirm, event.action)
        if why is None:
            return False
        self._move(Why.AWAITING_CONFIRMATION,
                   f"waiting for approval of {summary(event.action)} ({why})")
        return True

    def _dispatch(self, event: ActionEvent) -> None:
        action: Any = event.action
        if event.source == "environment":  # a setup step: no soft timeout hands it back
            timeout_s = no_output_s = self.config.setup_timeout_s
        else:
            timeout_s = getattr(action, "timeout_s", None) or self.config.command_timeout_s
            no_output_s = self.config.no_output_timeout_s
        if isinstance(action, McpCall):  # how to reach its server: the config's, not the log's
            spec = next((s for s in self.config.mcp if s.name == action.server), None)
            action = action.model_copy(update={"spec": spec})
            timeout_s = (spec.timeout_s if spec else None) or self.config.command_timeout_s
        self.dispatched = event.action_id
        self._out.append(RunAction(Execute(
            session_id=self.session_id, action_id=event.action_id,
            action=self.revealer.reveal(action), timeout_s=timeout_s,
            no_output_timeout_s=no_output_s,
            checkpoint=self.config.checkpoints if self.config.checkpoints.enabled else None)))

    # -- setup: the repository and the setup script, before the first step -------------

    def _setup_steps(self) -> list[ActionEvent]:
        """A new session's setup steps, recorded with its task (intent before anything)."""
        config, steps = self.config, []
        if config.repo is not None:
            steps.append(CloneRepository(url=config.repo, branch=config.branch))
        if config.setup is not None:
            steps.append(RunCommand(command=config.setup, timeout_s=config.setup_timeout_s))
        if config.mcp:  # last: the setup script may install a server
            steps.append(ListMcpTools(servers=config.mcp))
        return [ActionEvent(source="environment", action_id=self.new_id(), turn_id="setup",
                            tool_call_id=f"setup-{n}", tool=step.kind,
                            arguments=step.model_dump_json(exclude={"kind"}), action=step)
                for n, step in enumerate(steps, 1)]

    def _setup_done(self, event: ActionEvent, outcome: Outcome) -> bool:
        """After a setup step's outcome: False if the session goes on; True if the step
        failed, the steps after it are skipped and the session is in ERROR."""
        if isinstance(event.action, CloneRepository):
            self._out.append(ReadInstructions())  # the clone may bring an AGENTS.md
        failed = outcome.status != "ok" or outcome.exit_code not in (None, 0)
        if not failed:
            return False
        name = {"clone": "the clone of the repository",
                "mcp_tools": "the start of the MCP servers"}.get(event.tool, "the setup script")
        first = next((line for line in outcome.content.splitlines() if line.strip()), "")
        detail = f"exit status {outcome.exit_code}" if outcome.exit_code else outcome.status
        skipped = [ObservationEvent(action_id=other, outcome=Outcome(
            status="rejected", content=f"Not run: {name} failed before it."))
            for other, pending in self.view.pending.items() if pending.source == "environment"]
        self._move(Why.SETUP_FAILED, f"setup failed: {name} ({detail}): {first[:300]}",
                   along=skipped)
        return True

    def _finish(self, event: ActionEvent, action: Finish) -> None:
        """The finish's outcome, the rest of the turn rejected, and FINISHED: one append,
        so a restart can never find the finish answered and run the actions after it."""
        done = ObservationEvent(action_id=event.action_id,
                                outcome=Outcome(status="ok", content=action.message))
        skipped = [
            ObservationEvent(action_id=other, outcome=Outcome(
                status="rejected", content="Not run: the agent finished before this action."))
            for other in self.view.pending if other != event.action_id]
        self.resolve_first.clear()
        self._move(Why.FINISHED, action.message, along=[done, *skipped])

    def _record(self, action_id: str, outcome: Outcome, advance: bool = True) -> None:
        self.resolve_first.discard(action_id)
        event = self.view.pending.get(action_id)
        if event is None:
            return  # already has its outcome (promise I1)
        along: list[Any] = []
        if isinstance(event.action, ListMcpTools):
            outcome, along = listing_recorded(event, outcome, lambda: self.new_id()[:16])
        self._append(ObservationEvent(action_id=action_id, outcome=outcome), *along)
        asked_again = outcome.status == "lost" and bool(along)
        if event.source == "environment" and not asked_again and self._setup_done(
                event, outcome):
            return
        if advance:
            self._check_breaker()
            self._advance()

    def _check_breaker(self) -> None:
        limit = self.config.max_consecutive_timeouts
        if limit and self.view.consecutive_timeouts >= limit:
            self._move(Why.BREAKER, f"{self.view.consecutive_timeouts} commands in a row "
                       "timed out; check the sandbox, then resume")

    def _ask_journal(self) -> None:
        for action_id in sorted(self.resolve_first):
            self._out.append(AskJournal(action_id))

    def _recovered(self) -> None:
        """Back to RUNNING once the runtime is up. An action that was in flight may still
        run in the sandbox: RUNNING says so truly, and nothing moves on before its outcome
        (asked of the journal, ``_handle_action`` waits for it). Held back for the user
        instead (``resume_after_runtime_restart=False``), the session settles only once
        that outcome is in its log, so the user sees what became of the action."""
        recovering = self.view.state == AgentState.ERROR and self.view.resumes_at is not None
        if recovering and self.runtime_ready:
            if self.config.resume_after_runtime_restart:
                reason, self.back_reason = self.back_reason, BACK_AFTER_SANDBOX
                self._move(Why.RECOVERED, reason)
            elif not self.resolve_first:
                self._move(Why.RECOVERED_HELD, "the sandbox is back; resume to carry on")
        self._advance()

    def _restart_given_up(self) -> None:
        """The sandbox is down for good (its supervisor gave up, or it cannot work as
        configured): a resume, or the next action, starts a fresh one (leaving STOPPED
        starts one by ``FRESH_SANDBOX`` instead)."""
        if self.runtime_down:
            self.runtime_down = False
            self._out.append(RestartRuntime("resumed by the user"))


def _rejection_of(event: ActionEvent, mcp_tools: Any) -> Outcome:
    call = ToolCall(id=event.tool_call_id, name=event.tool, arguments=event.arguments)
    parsed = parse_response(event.turn_id, "", [call], lambda: event.action_id, mcp_tools)
    if parsed and parsed[0].rejection is not None:
        return parsed[0].rejection
    return Outcome(status="rejected", content=f"The call to {event.tool!r} was malformed.")
