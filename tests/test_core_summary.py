"""The summarizing condenser in the core, on a fake clock: past ``summarize_at_tokens``
the older half of the prompt is summarized by a model before the next question, the
summary is recorded once (its cost counted), the prompt carries it in place of what it
dropped, and a restored core rebuilds that prompt without asking for a summary again."""

from __future__ import annotations

from typing import Any

from test_core_session import Clock, _log_of, answer, call, make, only, running

from trouper.core.effects import AskModel, RunAction
from trouper.core.session import SessionCore
from trouper.core.summary import INSTRUCTIONS
from trouper.messages.events import LLMCompleted, PromptCondensed
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import Completed, Executed, RuntimeReady

LONG = "x" * 800  # 200 estimated tokens of output a step


def step(core: SessionCore, ask: AskModel, clock: Clock, n: int) -> AskModel:
    run = only(answer(core, ask, clock, call("run", command=f"make step{n}")), RunAction)
    effects = core.handle(Executed(session_id="s-1", action_id=run.request.action_id,
                                   outcome=Outcome(status="ok", content=f"{n} {LONG}")),
                          clock.tick())
    return only(effects, AskModel)


def is_summary_request(ask: AskModel) -> bool:
    return ask.request.messages[0]["content"] == INSTRUCTIONS and not ask.request.tools


def summarize(core: SessionCore, ask: AskModel, clock: Clock, text: str,
              cost: float = 0.0) -> AskModel:
    effects = core.handle(Completed(request_id=ask.request.request_id, session_id="s-1",
                                    content=text, cost_usd=cost), clock.tick())
    return only(effects, AskModel)


def options(**more: Any) -> dict[str, Any]:
    return {"condenser": "summarize", "summarize_at_tokens": 600, **more}


def test_past_the_threshold_the_older_half_is_summarized_before_the_next_question():
    core, clock, ask = running(**options())
    asks = [ask]
    while not is_summary_request(asks[-1]):
        assert len(asks) < 10, "no summary was asked for"
        asks.append(step(core, asks[-1], clock, len(asks)))
    summary_ask = asks[-1]
    transcript = summary_ask.request.messages[1]["content"]
    assert "make step1" in transcript and LONG[:50] in transcript
    ask = summarize(core, summary_ask, clock, "Built steps 1-2; step 3 is next.", cost=0.01)
    [condensed] = [e for e in _log_of(core) if isinstance(e, PromptCondensed)]
    assert condensed.summary == "Built steps 1-2; step 3 is next." and condensed.cut > 2
    assert ask.request.tools  # the agent's own question now, with the summary in it
    marker = ask.request.messages[2]["content"]
    assert "Built steps 1-2; step 3 is next." in marker and "summarized" in marker
    assert ask.request.messages[3:] == core.prompt.messages()[condensed.cut:]  # the rest
    assert core.view.cost_usd == 0.01  # the summary's cost is the session's
    assert [type(e) for e in _log_of(core)].count(LLMCompleted) == len(asks)


def test_a_restored_core_rebuilds_the_summarized_prompt_and_asks_for_no_summary_again():
    core, clock, ask = running(**options())
    while not is_summary_request(ask):
        ask = step(core, ask, clock, core.view.actions + 1)
    before = summarize(core, ask, clock, "SUMMARY OF THE START")
    fresh, _ = make(**options())
    fresh.restore(_log_of(core))
    effects = fresh.handle(RuntimeReady(session_id="s-1", epoch=2, attached=True),
                           clock.tick())
    again = only(effects, AskModel)
    assert not is_summary_request(again)
    assert again.request.messages == before.request.messages  # the same prompt


def test_the_summary_model_writes_the_summary_and_the_default_condenser_never_asks():
    core, clock, ask = running(**options(summary_model="hosted_vllm/cheap"))
    while not is_summary_request(ask):
        ask = step(core, ask, clock, core.view.actions + 1)
    assert ask.request.llm.model == "hosted_vllm/cheap"
    plain, clock2, ask2 = running(summarize_at_tokens=600)  # condenser "cut"
    for n in range(6):
        ask2 = step(plain, ask2, clock2, n)
        assert not is_summary_request(ask2)
