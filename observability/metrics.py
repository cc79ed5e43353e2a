"""trouper's Prometheus metrics, recorded in the processes where they happen.

Steps, retries, rate-limit waits, actions and sandbox starts are counted from the events
the Controller has just appended (``logged``: counted once, when durable); restarts and
probes by the supervisors (``restarted``, ``probed``); the store's append time by the
store (``timing.timed_append``). They happen in the actor processes, not in the program
that serves them, so each actor process writes its samples to files of its own in the
home's metrics folder (prometheus_client's multiprocess mode, ``folder.py``), and the
program sums the folder when scraped (``exposition.render``). docs/operations.md,
"Metrics", has every metric and why files.

``enable`` switches a process to recording: the actor processes only (``actors/forking``
calls it first thing in each forked process). Anywhere else every function here does
nothing, and costs a pid comparison. Recording never raises: a failure (the home's
folder gone) is logged once and recording stops in that process.

No label takes a session id, an action id or free text: ``restart_cause`` and
``probe_cause`` sort the supervisors' reasons into a few words.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Histogram, values

from ..messages.events import (
    ActionEvent,
    LLMCompleted,
    LLMRetry,
    ObservationEvent,
    RuntimeEvent,
    StateChanged,
)
from . import folder, timing

logger = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Where prometheus_client's multiprocess values put their files (read as each opens)."""
LLM_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
ACTION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
START_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
APPEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
MAX_PENDING_TOOLS = 4096
"""Action ids remembered (for their observation's tool label) per process, at most."""


class Families:
    """The metric families one process records, built on its first record (after
    ``enable``: their values are the multiprocess ones)."""

    def __init__(self) -> None:
        def counter(name: str, doc: str, labels: Iterable[str]) -> Counter:
            return Counter(name, doc, list(labels), registry=None)

        def histogram(name: str, doc: str, labels: Iterable[str],
                      buckets: Iterable[float]) -> Histogram:
            return Histogram(name, doc, list(labels), registry=None, buckets=tuple(buckets))

        self.steps = counter("trouper_steps", "Model calls answered (one a step), by model.",
                             ["model"])
        self.llm_latency = histogram("trouper_llm_latency_seconds", "Seconds from a model "
                                     "request to its answer, retries included.", ["model"],
                                     LLM_BUCKETS)
        self.tokens = counter("trouper_llm_tokens", "Tokens of answered model calls.",
                              ["model", "direction"])
        self.cost = counter("trouper_llm_cost_usd", "Cost of answered model calls, USD.",
                            ["model"])
        self.retries = counter("trouper_llm_retries", "Model calls retried, by the error's "
                               "class.", ["model", "error_class"])
        self.rate_waits = counter("trouper_llm_rate_limit_waits", "Waits after a rate "
                                  "limit (429) before a retry.", ["model"])
        self.rate_wait_s = counter("trouper_llm_rate_limit_wait_seconds", "Seconds waited "
                                   "after rate limits before retries.", ["model"])
        self.actions = counter("trouper_actions", "Actions with an outcome, by tool, the "
                               "session's runtime kind and the outcome's status.",
                               ["tool", "runtime", "status"])
        self.action_s = histogram("trouper_action_duration_seconds", "Seconds an action "
                                  "ran (those whose outcome has a duration).",
                                  ["tool", "runtime"], ACTION_BUCKETS)
        self.sandbox_starts = counter("trouper_sandbox_starts", "Sandboxes started afresh "
                                      "(phase started) or re-attached (phase attached).",
                                      ["runtime", "phase"])
        self.sandbox_start_s = histogram("trouper_sandbox_start_seconds", "Seconds from a "
                                         "sandbox's first start step or failure in the log "
                                         "to its start.", ["runtime"], START_BUCKETS)
        self.sandbox_failures = counter("trouper_sandbox_failures", "Sandboxes (or their "
                                        "proxies) that failed.", ["runtime"])
        self.states = counter("trouper_state_changes", "Sessions' state changes, by the new "
                              "state and its cause.", ["state", "cause"])
        self.restarts = counter("trouper_actor_restarts", "Actors restarted by their "
                                "supervisor, by role and cause.", ["role", "cause"])
        self.probes = counter("trouper_actor_probes", "Probes a supervisor sent to a "
                              "child that might hang, by role and cause.", ["role", "cause"])
        self.probe_kills = counter("trouper_actor_probe_kills", "Children killed for not "
                                   "answering a probe.", ["role"])
        self.append_s = histogram("trouper_store_append_seconds", "Seconds a Controller's "
                                  "append to the store took (one transaction).",
                                  ["backend"], APPEND_BUCKETS)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.tools: dict[str, str] = {}
        """action id -> tool label, until its observation is counted."""
        self.starting: dict[str, datetime] = {}
        """session id -> when its sandbox began (re)starting, by the log."""

    def of(self, family: Any, *labels: str) -> Any:
        """``family.labels(*labels)``, kept: prometheus_client's lookup checks and locks
        each time (a quarter of a step's recording cost before it was kept)."""
        key = (id(family), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child


_state: dict[str, Any] = {"pid": 0, "families": None}
"""The process that enabled recording, and its families (a fork's child records nothing
until it enables too: its pid differs)."""


def enable(home: str | os.PathLike[str], opening: bool = False) -> Path | None:
    """This process records into ``<home>/metrics``; ``opening``: an actor system opens
    (its admin): the folder is emptied or compacted first. Returns the folder (None if it
    cannot be made: nothing is recorded)."""
    path = folder.folder_of(home)
    try:
        folder.ensure(path)
        if opening:
            folder.at_opening(path)
        else:
            folder.tidy_if_crowded(path)
    except Exception as exc:  # noqa: BLE001 - an actor system opens without its metrics
        logger.warning("metrics are not recorded: the folder %s failed: %s", path, exc)
        return None
    os.environ[MULTIPROC_ENV] = str(path)
    # the maps a fork copied from its parent (0.20 has no such call: they stay mapped)
    getattr(values, "close_all_multiprocess_files", lambda: None)()
    values.MmapedDict = folder.allocated_dict_class()  # type: ignore[attr-defined]
    values.ValueClass = values.MultiProcessValue()
    _state.update(pid=os.getpid(), families=None)
    timing.observe_append[:] = [_observe_append]
    return path


def enable_in_actor(home: str | os.PathLike[str] | None, opening: bool) -> None:
    """``actors/forking``'s line in every forked process (``opening``: the admin)."""
    if home is not None:
        enable(home, opening)


def _families() -> Families | None:
    if _state["pid"] != os.getpid():
        return None
    families = _state["families"]
    if families is None:
        families = _state["families"] = Families()
    return families


def _stop(exc: BaseException) -> None:
    logger.warning("metrics: recording stops in this process: %s: %s",
                   type(exc).__name__, exc)
    _state["pid"] = 0
    timing.observe_append.clear()


def logged(start: Any, events: Iterable[Any]) -> None:
    """Count what the events a Controller has just appended tell (``start``: its
    ``StartSession``, for the session's runtime kind)."""
    families = _families()
    if families is None:
        return
    try:
        config = start.config if start is not None else None
        session = _Session(start.session_id if start is not None else "",
                           config.runtime.kind if config is not None else "unknown",
                           config.llm.model if config is not None else "")
        for event in events:
            _count(families, event, session)
    except Exception as exc:  # noqa: BLE001 - metrics never stop an actor
        _stop(exc)


@dataclass(frozen=True)
class _Session:
    id: str
    runtime: str
    model: str
    """The configured model: the label of its calls (an answer names the provider's own
    model, a retry the configured one; the configured one is also bounded)."""


def _count(f: Families, event: Any, s: _Session) -> None:  # noqa: C901 - a branch a kind
    runtime = s.runtime
    if isinstance(event, LLMCompleted):
        model = s.model or event.model
        f.of(f.steps, model).inc()
        f.of(f.llm_latency, model).observe(event.latency_s)
        if event.prompt_tokens or event.completion_tokens:  # a scripted model reports none
            f.of(f.tokens, model, "prompt").inc(event.prompt_tokens)
            f.of(f.tokens, model, "completion").inc(event.completion_tokens)
        if event.cost_usd:
            f.of(f.cost, model).inc(event.cost_usd)
    elif isinstance(event, ActionEvent):
        if len(f.tools) >= MAX_PENDING_TOOLS:
            f.tools.clear()  # outcomes that never came (a session gone): not kept for ever
        f.tools[event.action_id] = event.tool if event.action is not None else "malformed"
    elif isinstance(event, ObservationEvent):
        # an action appended by an earlier Controller of the session: its tool is unknown
        tool = f.tools.pop(event.action_id, "unknown")
        f.of(f.actions, tool, runtime, event.outcome.status).inc()
        if event.outcome.duration_s is not None:
            f.of(f.action_s, tool, runtime).observe(event.outcome.duration_s)
    elif isinstance(event, LLMRetry):
        model = s.model or event.model or "unknown"
        f.of(f.retries, model, event.error_class).inc()
        if event.error_class == "rate_limit":
            f.of(f.rate_waits, model).inc()
            f.of(f.rate_wait_s, model).inc(event.wait_s)
    elif isinstance(event, StateChanged):
        cause = event.cause.value if event.cause is not None else "none"
        f.of(f.states, event.state.value, cause).inc()
    elif isinstance(event, RuntimeEvent):
        _count_runtime(f, event, runtime, s.id)


def _count_runtime(f: Families, event: RuntimeEvent, runtime: str, session_id: str) -> None:
    if event.phase in ("starting", "failed"):
        f.starting.setdefault(session_id, event.ts)
        if event.phase == "failed":
            f.of(f.sandbox_failures, runtime).inc()
    elif event.phase in ("started", "attached"):
        f.of(f.sandbox_starts, runtime, event.phase).inc()
        began = f.starting.pop(session_id, None)
        if began is not None:
            f.of(f.sandbox_start_s, runtime).observe(
                max(0.0, (event.ts - began).total_seconds()))


def _observe_append(backend: str, seconds: float) -> None:
    families = _families()
    if families is None:
        return
    try:
        families.of(families.append_s, backend).observe(seconds)
    except Exception as exc:  # noqa: BLE001 - metrics never stop an actor
        _stop(exc)


def role_kind(role: str) -> str:
    """A child role without its session id: ``runtime:<id>`` -> ``runtime``."""
    return role.partition(":")[0]


def restart_cause(reason: str) -> str:
    """A supervisor's restart reason, as one of a few words (``supervisor.py`` and
    ``actors/probing.py`` write these reasons)."""
    if reason.startswith("hung:"):
        return "hung"
    if "could not be started" in reason:
        return "start_failed"
    if "exited unexpectedly" in reason:
        return "exited"
    if reason.startswith("cooldown over"):
        return "cooldown"
    if " while handling " in reason:  # a handler raised (``TrouperActor.fail``)
        return "failed"
    return "other"  # a restart asked for (a resume), or a child's own last words


def probe_cause(why: str) -> str:
    """Why a supervisor probed (``actors/probing.py`` and ``actors/root.py`` say it)."""
    if why.startswith("a user's command"):
        return "unanswered_command"
    if "kept working" in why:
        return "working"
    if "model call waited" in why:
        return "broker_slow"
    return "other"


def restarted(role: str, reason: str) -> None:
    """A supervisor restarted its child ``role``."""
    _inc("restarts", role_kind(role), restart_cause(reason))


def probed(role: str, why: str) -> None:
    """A supervisor sent its child ``role`` a probe."""
    _inc("probes", role_kind(role), probe_cause(why))


def probe_killed(role: str) -> None:
    """A supervisor killed its child ``role`` for not answering a probe."""
    _inc("probe_kills", role_kind(role))


def _inc(name: str, *labels: str) -> None:
    families = _families()
    if families is None:
        return
    try:
        families.of(getattr(families, name), *labels).inc()
    except Exception as exc:  # noqa: BLE001 - metrics never stop an actor
        _stop(exc)
