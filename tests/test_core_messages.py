"""A message sent while the session works, in the core on a fake clock: ``queue`` reads
it at the next turn, ``interrupt`` cancels the model call in flight and asks again with
it (a command running goes on), ``reject`` refuses it and records nothing."""

from __future__ import annotations

from test_core_session import S, _log_of, answer, appended, call, command, only, running

from trouper.core.effects import AskModel, CancelModel, RunAction
from trouper.messages.events import LLMCompleted, MessageEvent
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import Completed, Executed


def user_texts(ask: AskModel) -> list[str]:
    return [m["content"] for m in ask.request.messages if m.get("role") == "user"]


def test_queue_lets_the_model_call_finish_and_the_agent_reads_the_message_next():
    core, clock, ask = running()  # message_policy "queue", the default
    answered, effects = command(core, clock, "send", "use python 3.12")
    assert answered.error is None and not [e for e in effects if isinstance(e, CancelModel)]
    assert not [e for e in effects if isinstance(e, AskModel)]  # the call in flight stays
    run = only(answer(core, ask, clock, call("run", command="ls")), RunAction)
    effects = core.handle(Executed(session_id="s-1", action_id=run.request.action_id,
                                   outcome=Outcome(status="ok", content="a")), clock.tick())
    assert "use python 3.12" in user_texts(only(effects, AskModel))


def test_interrupt_cancels_the_model_call_and_asks_again_with_the_message():
    core, clock, ask = running(message_policy="interrupt")
    answered, effects = command(core, clock, "send", "stop: use python 3.12")
    assert answered.error is None and core.view.state == S.RUNNING
    assert only(effects, CancelModel).request_id == ask.request.request_id
    again = only(effects, AskModel)
    assert again.request.request_id != ask.request.request_id
    assert user_texts(again)[-1] == "stop: use python 3.12"
    # the cancelled call's answer, should it still come, is not recorded
    late = core.handle(Completed(request_id=ask.request.request_id, session_id="s-1",
                                 content="", tool_calls=[call("run", command="rm -rf x")]),
                       clock.tick())
    assert not appended(late)
    assert [type(e) for e in _log_of(core)].count(LLMCompleted) == 0


def test_interrupt_while_a_command_runs_leaves_it_running_and_queues_the_message():
    core, clock, ask = running(message_policy="interrupt")
    run = only(answer(core, ask, clock, call("run", command="make build")), RunAction)
    answered, effects = command(core, clock, "send", "also run the tests")
    assert answered.error is None
    assert not [e for e in effects if isinstance(e, CancelModel | RunAction)]
    effects = core.handle(Executed(session_id="s-1", action_id=run.request.action_id,
                                   outcome=Outcome(status="ok", content="built")), clock.tick())
    assert user_texts(only(effects, AskModel))[-1] == "also run the tests"


def test_reject_refuses_a_message_while_running_and_takes_one_once_it_waits():
    core, clock, ask = running(message_policy="reject")
    before = core.view.last_seq
    answered, effects = command(core, clock, "send", "hurry up")
    assert "running and takes no message" in (answered.error or "")
    assert core.view.last_seq == before and not appended(effects)
    answer(core, ask, clock, content="Which python?")  # a text reply: it waits for the user
    assert core.view.state == S.AWAITING_USER_INPUT
    answered, _ = command(core, clock, "send", "3.12")
    assert answered.error is None and core.view.state == S.RUNNING
    assert [e.text for e in _log_of(core) if isinstance(e, MessageEvent)
            and e.source == "user"][-1] == "3.12"
