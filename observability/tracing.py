"""trouper's OpenTelemetry traces: one trace per session turn, exported over OTLP/HTTP.

On only when ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is
set (and ``OTEL_SDK_DISABLED`` is not ``true``). Off, nothing of OpenTelemetry is
imported, in any process: every function here checks a cached flag and returns, and the
messages carry no context (their ``trace`` field stays None). This module imports only
the standard library at its top for that reason; the SDK comes in with the first span.

A turn is the Controller's (``TurnTraces``): it begins when the core asks the model and
ends when the next question goes to the model or the session settles. Its context
travels as a W3C ``traceparent`` in ``Complete.trace`` and ``Execute.trace``, so the
broker's model call (``model_call_began``...) and the RuntimeProxy's action
(``action_began``, ``action_ended``) are its children in their own processes.

Each process sets up its own TracerProvider on its first span (a ``BatchSpanProcessor``;
resource ``service.name=trouper``, ``trouper.role`` its role) and flushes at exit
(``flush_at_exit``): a traced actor as it is told to exit, before its parent hears it is
gone (a parent that exits has the kernel SIGKILL its children: ``die_with_parent`` in
``actors/base.py``); else at ``atexit``, or at multiprocessing's exit (an actor process
leaves through ``os._exit`` after multiprocessing's finalizers: ``atexit`` never runs
there). A process SIGKILLed loses the spans of its batch not yet sent.
docs/operations.md, "Traces".
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""Either switches tracing on (the exporter reads them itself: the first as the whole
URL, the second as a base to which ``/v1/traces`` is added)."""
SERVICE_NAME = "trouper"
FLUSH_AT_EXIT_S = 2.0
"""At most this long spent sending what is left at a process's exit (a collector that
does not answer must not hold an actor's exit for the exporter's 10 s)."""
RECOVERY_PHASES = ("restarted", "failed", "attached")
"""``RuntimeEvent`` phases recorded on the turn: the sandbox recovered or failed."""

_state: dict[str, Any] = {"pid": 0, "on": False, "tracer": None, "provider": None,
                          "open": set(), "turn": None}
"""This process's tracing (a fork's child has another pid: it sets up its own). ``open``:
spans begun and not ended (ended, marked cut short, at exit); ``turn``: the Controller's
turn span, the one its log records name when no span is current."""

Message = TypeVar("Message")


def _guarded(fallback: Callable[..., Any] = lambda *args, **kwargs: None
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Tracing never stops an actor: a call that raises (an SDK bug, a value it refuses)
    turns tracing off in this process, logs why once, and answers ``fallback(...)``
    (these calls run in handlers, after a send or an append)."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - see the docstring
                if _state["on"]:
                    logger.warning("traces stop in this process: %s failed: %s: %s",
                                   fn.__name__, type(exc).__name__, exc)
                _state["on"] = False
                return fallback(*args, **kwargs)
        return guarded
    return wrap


def _as_given(*args: Any, **kwargs: Any) -> Any:
    """The message a call was given (``asked``, ``carry``): sent without a context."""
    return args[1]


def enabled() -> bool:
    """Whether this process exports traces (read once a process: actors inherit the
    program's environment when they are forked)."""
    if _state["pid"] != os.getpid():
        _state.update(pid=os.getpid(), tracer=None, provider=None, open=set(), turn=None,
                      on=_asked_for(os.environ))
    return bool(_state["on"])


def _asked_for(env: Mapping[str, str]) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name) for name in ENDPOINT_VARS)


def tracer(role: str) -> Any | None:
    """This process's tracer, set up on the first call (``role``: its resource's
    ``trouper.role``); None when tracing is off or its setup failed (logged once: the
    actor goes on untraced)."""
    if not enabled():
        return None
    if _state["tracer"] is None:
        _set_up(role)
    return _state["tracer"]


def _set_up(role: str) -> None:
    # the role is told, not read from home/log_format: that module imports this one
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": SERVICE_NAME,
                                    "trouper.role": role})
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    except Exception as exc:  # noqa: BLE001 - tracing never stops an actor
        logger.warning("traces are not exported from this process: %s: %s",
                       type(exc).__name__, exc)
        _state["on"] = False
        return
    from .otlp_credentials import remember_otlp_credentials

    remember_otlp_credentials(ENDPOINT_VARS)
    _state.update(tracer=provider.get_tracer("trouper"), provider=provider)
    import multiprocessing.util

    atexit.register(flush_at_exit)  # a program, the daemon
    multiprocessing.util.Finalize(None, flush_at_exit, exitpriority=100)  # an actor


@_guarded()
def flush_at_exit() -> None:
    """End the spans still open (marked ``trouper.cut_short``), send what is batched
    (within ``FLUSH_AT_EXIT_S``) and stop. Only in the process that set tracing up."""
    provider = _state["provider"]
    if provider is None or _state["pid"] != os.getpid():
        return
    _state.update(provider=None, tracer=None, on=False)
    for span in list(_state["open"]):
        span.set_attribute("trouper.cut_short", True)
        span.end()
    _state["open"].clear()
    # the SDK's flush waits for the exporter's own timeout (10 s, retries within): bounded
    # here by a thread the exit does not wait for
    flusher = threading.Thread(target=provider.shutdown, name="trouper-trace-flush",
                               daemon=True)
    flusher.start()
    flusher.join(FLUSH_AT_EXIT_S)


@_guarded()
def current_trace_id() -> str | None:
    """The trace of the span current on this thread, else of the Controller's turn, as
    32 hex digits; None when tracing is not set up in this process."""
    if _state["tracer"] is None or _state["pid"] != os.getpid():
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        turn = _state["turn"]
        if turn is None:
            return None
        context = turn.get_span_context()
    return f"{context.trace_id:032x}"


def _masked(text: str) -> str:
    from ..security.masking import mask_known

    return mask_known(text)


def carrier_of(span: Any) -> dict[str, str]:
    """``span``'s context as a W3C ``traceparent`` (``messages/protocol.py``'s ``trace``)."""
    c = span.get_span_context()
    return {"traceparent": f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"}


def _begin(role: str, name: str, carrier: dict[str, str] | None, kind: str,
           attributes: dict[str, Any]) -> Any | None:
    """A span of a ``role`` process, child of the context in ``carrier`` (None: a root);
    None if tracing is off."""
    t = tracer(role)
    if t is None:
        return None
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = (TraceContextTextMapPropagator().extract(carrier) if carrier is not None
              else Context())
    span = t.start_span(name, context=parent, kind=getattr(SpanKind, kind),
                        attributes=attributes)
    _state["open"].add(span)
    return span


def _end(span: Any, error: str | None = None) -> None:
    if error is not None:  # the collector is outside: masked as a log line is
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, _masked(error)[:500]))
    _state["open"].discard(span)
    span.end()


@_guarded(lambda span, fn: fn)
def within(span: Any | None, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn``, run (on a worker thread) with ``span`` current: its log records name the
    trace. ``fn`` itself when there is no span."""
    if span is None:
        return fn

    def traced() -> Any:
        from opentelemetry.trace import use_span

        with use_span(span, end_on_exit=False, record_exception=False,
                      set_status_on_exception=False):
            return fn()

    return traced


# -- the Controller: one trace per turn -----------------------------------------------


class TurnTraces:
    """A Controller's turn spans: ``asked`` begins a turn (ending the last), ``carry``
    puts the turn's context on what goes to the broker and the runtime, ``logged`` and
    ``event`` record recoveries on it, ``after`` ends it once the session settles."""

    def __init__(self) -> None:
        self.span: Any | None = None
        self.request_id = ""
        self.carrier: dict[str, str] | None = None

    @_guarded(_as_given)
    def asked(self, request: Message, session_id: str) -> Message:
        """The model is asked ``request`` (a ``Complete``): a new turn, unless it is the
        same request again (held, re-sent). Returns it carrying the turn's context."""
        if not enabled():
            return request
        request_id = getattr(request, "request_id", "")
        if self.span is None or request_id != self.request_id:
            self.end("next_turn")
            self.span = _begin("controller", "turn", None, "INTERNAL", {
                "trouper.session_id": session_id, "trouper.turn": getattr(request, "turn", 0),
                "trouper.request_id": request_id})
            if self.span is None:
                return request
            self.request_id, self.carrier = request_id, carrier_of(self.span)
            _state["turn"] = self.span
        return self.carry(request)

    @_guarded(_as_given)
    def carry(self, msg: Message) -> Message:
        """``msg`` (a ``Complete`` or an ``Execute``) with the turn's context, if any."""
        if self.carrier is None:
            return msg
        return msg.model_copy(update={"trace": self.carrier})  # type: ignore[attr-defined]

    @_guarded()
    def end(self, why: str) -> None:
        """End the turn's span (``why``: ``trouper.turn.end``)."""
        if self.span is None:
            return
        self.span.set_attribute("trouper.turn.end", why)
        _end(self.span)
        if _state["turn"] is self.span:
            _state["turn"] = None
        self.span, self.carrier, self.request_id = None, None, ""

    @_guarded()
    def after(self, view: Any) -> None:
        """The Controller performed an input's effects: a settled session (``view``: its
        ``SessionView``) ends the turn."""
        if self.span is None:
            return
        from ..core.states import settled

        if settled(view.state, view.resumes_at):
            self.end(str(getattr(view.state, "value", view.state)))

    @_guarded()
    def logged(self, events: Iterable[Any], session_id: str) -> None:
        """The events just appended: the sandbox's restarts and failures are recorded."""
        if not enabled():
            return
        for event in events:
            if getattr(event, "kind", "") == "runtime" and event.phase in RECOVERY_PHASES:
                self.event(f"runtime.{event.phase}", session_id, {
                    "trouper.epoch": event.epoch, "trouper.detail": _masked(event.detail)[:500]},
                    error=event.phase == "failed")

    @_guarded()
    def event(self, name: str, session_id: str, attributes: dict[str, Any],
              error: bool = False) -> None:
        """A recovery: an event on the turn, or a span of its own (``recovery <name>``)
        when no turn is open (a restarted Controller asks the journal first)."""
        if not enabled():
            return
        if self.span is not None:
            self.span.add_event(name, attributes)
            return
        span = _begin("controller", f"recovery {name}", None, "INTERNAL",
                      {"trouper.session_id": session_id, **attributes})
        if span is not None:
            _end(span, name if error else None)


# -- the broker: the model call -------------------------------------------------------


@_guarded()
def model_call_began(msg: Any) -> Any | None:
    """The broker took ``msg`` (a ``Complete``): its span, or None (no context came)."""
    if msg.trace is None:
        return None
    model = msg.llm.model
    return _begin("broker", f"chat {model}", msg.trace, "CLIENT", {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
        "trouper.session_id": msg.session_id, "trouper.request_id": msg.request_id,
        "trouper.turn": msg.turn})


@_guarded()
def model_call_retried(span: Any | None, msg: Any) -> None:
    """A retry was scheduled (``msg``: the ``RetryScheduled`` sent)."""
    if span is not None:
        span.add_event("retry", {"trouper.attempt": msg.attempt, "gen_ai.request.model":
                                 msg.model, "error.type": msg.error_class,
                                 "trouper.wait_s": msg.wait_s})


@_guarded()
def model_call_answered(span: Any | None, msg: Any) -> None:
    """``Completed`` was sent."""
    if span is None:
        return
    span.set_attributes({
        "gen_ai.response.model": msg.model, "gen_ai.usage.input_tokens": msg.prompt_tokens,
        "gen_ai.usage.output_tokens": msg.completion_tokens, "trouper.cost_usd": msg.cost_usd,
        "trouper.attempts": msg.attempts, "trouper.retries": msg.attempts - 1})
    _end(span)


@_guarded()
def model_call_failed(span: Any | None, msg: Any) -> None:
    """``CompletionFailed`` was sent (or, ``msg`` a string, the call was given up)."""
    if span is None:
        return
    if isinstance(msg, str):
        span.set_attribute("trouper.outcome", msg)
        _end(span)
        return
    span.set_attributes({"error.type": msg.error_class, "trouper.attempts": msg.attempts,
                         "trouper.retries": msg.attempts - 1})
    _end(span, msg.message[:500])


# -- the RuntimeProxy: an action ------------------------------------------------------


@_guarded()
def action_began(msg: Any, runtime_kind: str) -> Any | None:
    """The RuntimeProxy runs ``msg`` (an ``Execute``): its span, or None."""
    if msg.trace is None:
        return None
    action = msg.action
    tool = getattr(action, "tool", None) if action.kind == "mcp" else action.kind
    return _begin("runtime", f"action {tool}", msg.trace, "INTERNAL", {
        "trouper.session_id": msg.session_id, "trouper.action_id": msg.action_id,
        "trouper.tool": str(tool), "trouper.runtime": runtime_kind})


@_guarded()
def action_ended(span: Any | None, outcome: Any, error: BaseException | None) -> None:
    """The action's outcome came back (or its request failed with ``error``)."""
    if span is None:
        return
    if error is not None:  # no record_exception: its text and trace would go out unmasked
        _end(span, f"{type(error).__name__}: {error}")
        return
    span.set_attribute("trouper.status", outcome.status)
    if outcome.duration_s is not None:
        span.set_attribute("trouper.duration_s", outcome.duration_s)
    if outcome.exit_code is not None:
        span.set_attribute("process.exit.code", outcome.exit_code)
    _end(span, None if outcome.status == "ok" else f"the action ended {outcome.status}")
