"""One session through the core in memory, before the actor system forks.

Every Controller would otherwise fill the same lazy caches after its fork (pydantic's
validators and serializers for the events, the prompt builder's, the parser's and the
maskers' compiled patterns): CPU at each session's start and memory private to each.
Run once in the program that opens the actor system (about 3 ms of CPU), they are shared
by every fork: a Controller's start took 0.7 ms less CPU and its private memory 0.3 MB
less (100 sessions started at once, three runs each way, on the bench machine).
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from ..config.models import LLMConfig, SessionConfig
from ..messages.events import EVENT_ADAPTER
from ..messages.outcomes import Outcome
from ..messages.protocol import Completed, Executed, RuntimeReady, ToolCall
from ..security.masking import session_maskers
from .effects import Append, AskModel, RunAction
from .session import SessionCore

WARM_UP_WORKSPACE = "/nonexistent/trouper-warm-up"
"""The warm-up session's workspace: named only, never made (the core does no I/O)."""


@contextmanager
def _unlogged() -> Iterator[None]:
    """The core's own log lines off: the program's log must not show a made-up session.
    Only ``trouper.core`` is quieted: in the program that opens the system no core runs
    (Controllers run in their own processes), so no real line is lost meanwhile."""
    core = logging.getLogger("trouper.core")
    level = core.level
    core.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        core.setLevel(level)


def warm_up() -> None:
    """A two-step session (a command, then finish), its events serialised both ways."""
    with _unlogged():
        _session()


def _session() -> None:
    config = SessionConfig(task="warm up", llm=LLMConfig(model="hosted_vllm/warm-up"),
                           workspace=WARM_UP_WORKSPACE)
    masker, revealer = session_maskers({}, config.llm)
    core = SessionCore("s-warm-up", config, masker=masker, revealer=revealer)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    effects = core.begin(now)
    effects += core.handle(RuntimeReady(session_id="s-warm-up", epoch=1, attached=False), now)
    for call in (ToolCall(id="c1", name="run", arguments=json.dumps({"command": "true"})),
                 ToolCall(id="c2", name="finish", arguments=json.dumps({"message": "ok"}))):
        ask = next(e for e in reversed(effects) if isinstance(e, AskModel))
        pickle.loads(pickle.dumps(ask.request))  # how it crosses to the broker
        now += timedelta(seconds=1)
        effects = core.handle(Completed(request_id=ask.request.request_id,
                                        session_id="s-warm-up", tool_calls=[call]), now)
        runs = [e for e in effects if isinstance(e, RunAction)]
        for run in runs:
            pickle.loads(pickle.dumps(run.request))
            effects += core.handle(Executed(session_id="s-warm-up",
                                            action_id=run.request.action_id,
                                            outcome=Outcome(status="ok", content="")), now)
    for effect in effects:
        if isinstance(effect, Append):
            for event in effect.events:
                EVENT_ADAPTER.validate_json(event.model_dump_json())
