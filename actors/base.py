"""What every trouper actor shares: safe dispatch, and work off the actor's thread.

Thespian delivers a message once more when a handler raises, then answers the sender
with a ``PoisonMessage``. A handler with side effects must never raise, so
``TrouperActor.receiveMessage`` catches everything; an actor whose state is in doubt
after a failure says why to its parent and exits, and the supervisor restarts it clean.

A handler never blocks: long work runs in ``Background`` threads (``background.py``) that
report through a self-pipe the actor watches (``ThespianWatch``, returned from *every*
receive call).

Every handler is total (I6, docs/promises.md): a message an actor cannot use (junk, another actor's
protocol, a second boot, a timer it did not set, a late reply) is logged in one line by
``drop`` and has no other effect. Only trouper messages reach ``on_<kind>`` handlers, and
never one of the hooks (``on_child_*``, ``on_timer_*``...), whatever a message calls its kind.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import traceback
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from thespian.actors import (
    Actor,
    ActorAddress,
    ActorExitRequest,
    ChildActorExited,
    PoisonMessage,
    ThespianWatch,
    WakeupMessage,
    WatchMessage,
)

from ..exceptions import StoreUnavailable
from ..home.log_format import about_session, bind_actor
from ..home.paths import write_private
from ..host.processes import libc, name_process, start_time
from ..messages.base import Frozen
from ..messages.tree import BootedUp, Failing, Probe, ProbeAnswer
from .background import Background

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1

Handler = Callable[[Any, ActorAddress], None]


@dataclass(frozen=True)
class Timer:
    """The payload of a ``wakeupAfter`` timer: what to do, with a token to match it."""

    name: str
    token: Any = None
    serial: int = 0
    """Numbers the timers one actor set; a wakeup carrying any other payload is dropped."""


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux).

    Thespian forks every actor from its parent actor. If the parent dies (SIGKILL, or a
    shutdown racing a child's start), a child would live on unsupervised: a leaked
    process, or a second Controller beside the restarted one. With this, a dead
    supervisor takes its subtree with it and the restart starts from clean.
    """
    try:
        libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except AttributeError:  # no libc, or no prctl in it
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable; children may outlive parents")
        return
    if os.getppid() == 1:  # the parent died before the prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _adopt_module_loggers() -> None:
    """Send the records of loggers made before the fork to Thespian's log forwarder.

    Thespian gives a new actor process a new logging root (forwarding to its logger
    process, which writes ``logs/trouper.log``) and a new manager, but the module-level
    ``logging.getLogger(__name__)`` objects made before the fork still hang off the old
    root: their records would go to the embedding program's handlers, or nowhere. Each
    also forgets the levels it cached: a logger the program asked "is INFO enabled?" under
    its own root (WARNING by default) would otherwise keep answering "no" here.
    """
    old = logger.manager
    if old is logging.Logger.manager:
        return
    ours = [lg for name, lg in list(old.loggerDict.items())
            if isinstance(lg, logging.Logger) and name.split(".")[0] == "trouper"]
    for existing in ours:  # other libraries' loggers keep their levels and handlers
        if existing.parent is old.root:
            existing.parent = logging.root
        existing.manager = logging.Logger.manager
        getattr(existing, "_cache", {}).clear()  # logging's own per-level answers
        logging.Logger.manager.loggerDict.setdefault(existing.name, existing)


PROCESS_NAMES = {"controller": "trouper-ctl", "runtime": "trouper-proxy", "root": "trouper-root",
                 "supervisor": "trouper-sup", "broker": "trouper-llm", "session": "trouper-session"}
"""Each role's process name (``ps``, ``/proc/<pid>/comm``: 15 bytes at most)."""


class TrouperActor(Actor):
    """Base actor: handlers never raise, never block, and are found by the message's type.

    Subclasses set ``role`` and implement ``on_<anything>(msg: T, sender)`` for each
    message type ``T`` they accept (from ``messages/``); a message of any other type is
    dropped with a log line. Thespian's own messages go to ``on_child_exited``,
    ``on_wakeup``, ``on_exit_request`` and ``on_poison``.
    """

    role: str = "actor"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._background: Background | None = None
        self._stopping = False
        self._booted = False
        self._timers: set[int] = set()
        """Serials of the timers set and not yet fired."""
        self._last_timer = 0
        die_with_parent()
        name_process(PROCESS_NAMES.get(self.role, "trouper-actor"))
        _adopt_module_loggers()
        bind_actor(self)  # JSON log lines name this role, and this actor's session
        gc.freeze()  # what the fork shared stays shared: the collector never writes to it

    # -- dispatch --------------------------------------------------------------

    def receiveMessage(self, msg: Any, sender: ActorAddress) -> ThespianWatch:  # noqa: N802
        with about_session(session_named(msg)):  # the session of its log records, if any
            try:
                self._dispatch(msg, sender)
            except StoreUnavailable as exc:  # where the store lives failed: a state
                self.store_failed(exc, msg)
            except Exception as exc:  # noqa: BLE001 - a handler must never raise (module doc)
                self._handler_failed(msg, exc)
        return ThespianWatch(self._watched())

    def _watched(self) -> list[int]:
        """What Thespian watches for this actor: the pool's pipe and ``watched_fds``."""
        background = self._background
        own = [] if background is None or background.closed else [background.fileno]
        return own + ([] if self._stopping else self.watched_fds())

    def watched_fds(self) -> list[int]:
        """Descriptors this role waits on (``on_fd_ready`` when one is readable)."""
        return []

    def on_fd_ready(self, fd: int) -> None:
        """A descriptor of ``watched_fds`` is readable."""

    def _dispatch(self, msg: Any, sender: ActorAddress) -> None:
        if isinstance(msg, WatchMessage):
            background = self._background
            for fd in msg.ready:
                if background is not None and fd == background.fileno:
                    background.drain()
                elif fd in self.watched_fds():
                    self.on_fd_ready(fd)
                else:
                    self.drop(msg, f"descriptor {fd} is not one this actor watches now")
            return
        if isinstance(msg, WakeupMessage):
            self.on_wakeup(msg.payload, sender)
            return
        if isinstance(msg, ChildActorExited):
            self.on_child_exited(msg.childAddress, sender)
            return
        if isinstance(msg, ActorExitRequest):
            self._stopping = True
            self.on_exit_request(msg, sender)
            if self._background is not None:
                self._background.close()
            return
        if isinstance(msg, PoisonMessage):
            self.on_poison(msg, sender)
            return
        if isinstance(msg, Probe):  # before any role's own rules: a live actor answers
            self.send(sender, ProbeAnswer(token=msg.token))
            return
        self._dispatch_own(msg, sender)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._handlers = _handlers_of(cls)

    _handlers: ClassVar[dict[type, str]] = {}
    """Message type -> the name of the method that handles it, read from each ``on_*``
    method's annotated message type when the class is made (dispatch is by type)."""

    def _dispatch_own(self, msg: Any, sender: ActorAddress) -> None:
        name = self._handlers.get(type(msg))
        if name is None:
            self.on_unknown(msg, sender)
            return
        handler: Handler = getattr(self, name)
        if name.startswith("on_boot_"):  # every incarnation is booted once, by its creator
            if self._booted or self._stopping:
                why = "it is stopping" if self._stopping else "it was booted already"
                self.drop(msg, why, logging.WARNING)
                return
            self._booted = True
            try:
                handler(msg, sender)
            finally:  # its boot is over (a store fault waits with the loop free)
                if sender is not None and sender == getattr(self, "_parent_address", None):
                    self.send(sender, BootedUp())  # its supervisor may probe it now
            return
        handler(msg, sender)

    def _handler_failed(self, msg: Any, exc: Exception) -> None:
        tb = traceback.format_exc()
        logger.error("%s failed on %s: %s\n%s", self.role, type(msg).__name__, exc, tb)
        self.fail(f"{type(exc).__name__} while handling {type(msg).__name__}: {exc}", exc, tb)

    def fail(self, reason: str, exc: BaseException | None = None, tb: str = "") -> None:
        """Exit on purpose so the supervisor restarts this actor clean; say why first."""
        if self._stopping:
            return
        self._stopping = True
        error_class = f"{type(exc).__module__}.{type(exc).__qualname__}" if exc else ""
        parent = getattr(self, "_parent_address", None)
        if parent is not None:
            self.send(parent, Failing(role=self.role, reason=reason, error_class=error_class,
                                      traceback=tb))
        self.send(self.myAddress, ActorExitRequest())

    # -- default handlers ----------------------------------------------------------

    def on_wakeup(self, payload: Any, sender: ActorAddress) -> None:
        if not isinstance(payload, Timer) or payload.serial not in self._timers:
            self.drop(payload, "a wakeup for no timer it set", logging.WARNING)
            return
        self._timers.discard(payload.serial)
        handler = getattr(self, f"on_timer_{payload.name}", None)
        if handler is None:
            self.drop(payload, "no handler for this timer", logging.WARNING)
            return
        handler(payload.token)

    def on_child_exited(self, child: ActorAddress, sender: ActorAddress) -> None:
        self.drop(ChildActorExited(child), "it has no children", logging.WARNING)

    def on_exit_request(self, msg: ActorExitRequest, sender: ActorAddress) -> None:
        """Last words before the actor stops; subclasses release what they hold."""

    def store_failed(self, fault: StoreUnavailable, msg: Any) -> None:
        """A write failed because of where the store lives; by default, like any failure.
        The Controller overrides it: its session waits in ERROR instead (I6)."""
        self._handler_failed(msg, fault)

    def on_poison(self, msg: PoisonMessage, sender: ActorAddress) -> None:
        logger.warning("%s: a message it sent poisoned %s: %s", self.role, sender, msg.details)

    def on_unknown(self, msg: Any, sender: ActorAddress) -> None:
        self.drop(msg, f"no handler for it (from {sender})", logging.WARNING)

    def drop(self, msg: Any, why: str, level: int = logging.INFO) -> None:
        """Log, in one line, a message this actor cannot use; it has no other effect (I6).
        WARNING for what should never come (junk, a forgery), INFO for what may (late)."""
        session_id = getattr(self, "session_id", "")
        where = f"session {session_id}: " if session_id else ""
        what = describe(msg)
        logger.log(level, "%s%s dropped %s: %s", where, self.role, what, why,
                   extra={"dropped": what})

    # -- helpers ---------------------------------------------------------------

    @property
    def booted(self) -> bool:
        """Whether this incarnation has had its boot message (it gets one, ever)."""
        return self._booted

    max_workers: int = 32
    """Threads for blocking work; the broker raises it (one per model call in flight)."""

    @property
    def background(self) -> Background:
        """The actor's worker pool, made on first use (after the fork, in this process)."""
        if self._background is None:
            self._background = Background(self.max_workers)
        return self._background

    def set_parent(self, parent: ActorAddress) -> None:
        """Remember the supervisor, to tell it why before exiting on purpose."""
        self._parent_address = parent

    def from_parent(self, msg: Any, sender: ActorAddress, why: str) -> bool:
        """Whether ``sender`` is this actor's parent; if not, ``msg`` is dropped (``why``:
        what only the parent may ask)."""
        if sender is not None and sender == getattr(self, "_parent_address", None):
            return True
        self.drop(msg, f"not from its parent, {why}", logging.WARNING)
        return False

    def publish_pid(self, path: Path) -> None:
        """Write this process's pid where tools can find the live incarnation."""
        try:
            write_private(path, f"{os.getpid()} {start_time(os.getpid()) or 0}")
        except OSError as exc:
            logger.warning("%s could not publish its pid to %s: %s", self.role, path, exc)

    def after(self, delay_s: float, name: str, token: Any = None) -> None:
        """Call ``on_timer_<name>(token)`` after ``delay_s`` seconds (a timer, not a sleep)."""
        self._last_timer += 1
        self._timers.add(self._last_timer)
        self.wakeupAfter(timedelta(seconds=max(0.0, delay_s)),
                         Timer(name, token, self._last_timer))


def _handlers_of(cls: type) -> dict[type, str]:
    """``{message type: method name}`` for every ``on_*(self, msg: T, sender)`` of ``cls``
    whose ``T`` is a trouper message (``messages/``); hooks that take other arguments
    (``on_timer_*``, ``on_child_*``, ``on_wakeup``) are called by name, never by a message.
    An annotation that does not resolve is a bug in the actor: it fails at import."""
    found: dict[type, str] = {}
    for name in dir(cls):
        method = getattr(cls, name, None)
        if not name.startswith("on_") or not callable(method):
            continue
        hints = typing.get_type_hints(method)
        params = [hint for key, hint in hints.items() if key != "return"]
        if params and isinstance(params[0], type) and issubclass(params[0], Frozen):
            if params[0] in found:
                raise TypeError(f"{cls.__name__}: {found[params[0]]} and {name} both "
                                f"handle {params[0].__name__}")
            found[params[0]] = name
    return found


def session_named(msg: Any) -> str | None:
    """The session a trouper message is about (its ``session_id``, or its ``start``'s),
    or None."""
    if not isinstance(msg, Frozen):
        return None
    named = getattr(msg, "session_id", None)
    if named is None:
        named = getattr(getattr(msg, "start", None), "session_id", None)
    return named if isinstance(named, str) and named else None


def describe(msg: Any) -> str:
    """A message's name for a log line; never its content (a prompt, a secret, megabytes)."""
    if isinstance(msg, Frozen):
        return str(msg)  # its kind and ids only (messages/base.py)
    if isinstance(msg, Timer):
        return f"timer {msg.name!r}"
    kind = getattr(msg, "kind", None)
    return f"{type(msg).__name__}({kind})" if isinstance(kind, str) else type(msg).__name__

