"""The embedded Thespian actor system behind a ``Trouper``, and requests into it.

Heavy modules (pydantic models, the actors) are imported *before* the system starts:
actor processes are forked, so they share those pages instead of importing their own
copies. litellm is not: only the broker needs it, and it imports it in its own process
(``actors/lazy_broker.py``), so the root and the sessions it forks stay small.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from thespian.actors import (  # noqa: E402
    ActorSystem,
    ActorSystemException,
    InvalidActorAddress,
)

from ..actors import forking
from ..actors.transport import seal  # noqa: E402
from ..agent.tools import tool_specs  # noqa: E402
from ..config.models import RestartPolicy  # noqa: E402
from ..config.settings import settings  # noqa: E402
from ..core.warm import warm_up  # noqa: E402
from ..exceptions import InvalidRequest, RequestTimeout, TrouperError, UnknownSession  # noqa: E402
from ..home.logs import log_definitions  # noqa: E402
from ..home.paths import Home  # noqa: E402
from ..host.processes import children_of, published_pid, signal_quietly  # noqa: E402
from ..messages.protocol import Accepted, Refusal, Refused  # noqa: E402
from ..messages.tree import BootRoot, Probe, ProbeAnswer, Shutdown, ShutdownDone
from ..runtimes import sandbox_zygote  # noqa: E402
from ..security.transport_key import TRANSPORT_KEY_FILE_ENV  # noqa: E402
from .root_watch import RootWatch  # noqa: E402

logger = logging.getLogger(__name__)

_OPENING = threading.Lock()
"""One actor system opens at a time in a program: the admin fork reads what it was told."""
_LISTEN_SLICE_S = 0.5
"""A request waits for its answer in slices this long, so one waiting on a root that died
ends when the watch says so, not at its timeout."""
ADMIN_PORT_TRIES = 3
"""Opens of a system whose free admin port was taken before its admin bound it."""

"""An owner-only file holding the actor transport's key, shared by every host of a
multi-host system; unset (the default), each program makes a random key of its own."""

_ERRORS: dict[Refusal, type[TrouperError]] = {
    Refusal.UNKNOWN_SESSION: UnknownSession,
    Refusal.INVALID_REQUEST: InvalidRequest,
}


def free_port() -> int:
    """An unused TCP port on loopback (for the actor system's admin port), drawn at random
    from the ephemeral range. The kernel's own choice (bind to 0) was seen to hand two
    programs opening at the same moment the same port, and only one admin binds it."""
    low, high = _ephemeral_range()
    draw = random.SystemRandom()
    for _ in range(20):
        port = draw.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return low, high


class ActorSystemHandle:
    """Starts, asks and shuts down the actor system of one ``Trouper``."""

    def __init__(
        self,
        home: Home,
        policy: RestartPolicy,
        ask_timeout_s: float,
        system_base: str,
        admin_port: int | None,
        detached: bool = False,
    ) -> None:
        self.home, self.policy, self.ask_timeout_s = home, policy, ask_timeout_s
        self.system_base, self.admin_port = system_base, admin_port
        self.detached = detached
        self._asys: ActorSystem | None = None
        self._root: Any = None
        self._lock = threading.Lock()
        self._forks: list[int] = []
        self._zygote = False
        self._watch: RootWatch | None = None
        self._closing = False
        self._root_gone = threading.Event()
        """Set while the root is dead and not yet replaced: requests waiting on it end."""
        self._root_up = threading.Event()
        """Set while a booted root runs: a request that its root's death ended waits for
        the next one and is asked again (the same request id: carried out once)."""
        self.held_at_close: list[str] | None = None
        """The sessions the tree ran when ``close`` shut it down (None: it did not say)."""
        self.on_new_root: Callable[[], None] | None = None
        """Called (in the watch's thread) once a root that died was replaced: the
        ``Trouper`` resumes the sessions that were working."""

    def open(self) -> None:
        # before any actor listens: nothing outside gets in (I7, docs/promises.md)
        seal(os.environ.get(TRANSPORT_KEY_FILE_ENV) or None)
        forking.install()
        if not self._zygote:  # its channel before the first fork: every actor inherits it
            sandbox_zygote.prepare(self.home.root / "logs" / "sandbox-zygote.log")
            self._zygote = True
        if "litellm" in sys.modules:  # the program has it already: its actors inherit it,
            from ..llm import client  # and the broker shares the warm-up done here

            client.preload_first_call()
        tool_specs()  # the tools' JSON schemas, built once here for every Controller forked below
        try:
            warm_up()  # and what a session's first steps fill lazily (core/warm.py)
        except Exception:  # noqa: BLE001 - a speed-up only: the forks fill them as before
            logger.warning("warming the session core before the fork failed", exc_info=True)
        forking.end_orphans(self.home.root)
        self.home.tighten()
        os.environ.setdefault("THESPLOG_FILE", str(self.home.root / "logs" / "thespian.log"))
        log_defs = log_definitions(self.home)
        for attempt in range(1, ADMIN_PORT_TRIES + 1):
            failed = False
            port = self.admin_port or free_port()
            before = set(children_of(os.getpid()))
            try:
                with _OPENING:
                    forking.prepare_admin(self.home.root, 0 if self.detached else os.getpid())
                    self._asys = ActorSystem(self.system_base, {"Admin Port": port},
                                             logDefs=log_defs, transientUnique=True)
            except InvalidActorAddress as exc:
                # free_port's port was taken before the admin bound it (another program
                # listening there): the admin is gone; a port of our own is tried again
                if self.admin_port or attempt == ADMIN_PORT_TRIES:
                    raise
                logger.warning("the admin port %d was taken before the admin bound it (%s); "
                               "opening on another", port, exc)
                failed = True
                continue
            finally:
                self._forks += [pid for pid in children_of(os.getpid())
                                if pid not in before and _is_fork_of_this_program(pid)]
                self._reap_forks(wait_s=5.0 if failed else 0.0)  # a failed admin exits now
            break
        self._start_root()
        # The program checks each session's model with litellm (``start_session``): it is
        # imported now, after every fork from this process, while the broker imports its own.
        from ..llm import credentials  # noqa: F401

    def _start_root(self) -> None:
        """Create and boot the root actor, and watch its process (``root_watch.py``)."""
        from ..actors.root import RootSupervisor

        with self._lock:  # no request reaches the new root before its boot
            assert self._asys is not None
            self._root = self._asys.createActor(RootSupervisor)
            self._root_gone.clear()
            boot = BootRoot(home=str(self.home.root), policy=self.policy)
            answer = self._ask_locked(boot, "boot", self.ask_timeout_s)
        if isinstance(answer, Refused):
            raise _ERRORS.get(answer.error, TrouperError)(answer.message)
        self._root_up.set()
        if self._watch is not None:
            self._watch.stop()  # the last root's: its thread is over (it may be this one)
            self._watch = None
        pid = published_pid(self.home.actor_pid_path("root"))
        watch = RootWatch(self._root_died)
        if pid is not None and watch.watch(pid):
            self._watch = watch

    def _root_died(self) -> None:
        """The root's process exited while the system was open: a new root, then every
        session that was working is resumed (``on_new_root``)."""
        self._root_up.clear()
        self._root_gone.set()  # a request waiting on the dead root ends now
        if self._closing or self._asys is None:
            return
        self._start_root()
        logger.warning("a new root actor runs; resuming the sessions that were working")
        if self.on_new_root is not None:
            self.on_new_root()

    def expect_sandboxes(self) -> None:
        """A session is about to start or restore: have the sandbox zygote running."""
        if self._zygote:
            sandbox_zygote.ensure_started()

    def request(self, msg: Any, request_id: str | None = None) -> Accepted:
        """Ask the root and wait for the matching answer. Raises the refusal as an error."""
        if self._asys is None:
            raise InvalidRequest("this Trouper is closed")
        rid = request_id if request_id is not None else msg.request_id
        answer = self._ask_across_roots(msg, rid)
        if isinstance(answer, Refused):
            raise _ERRORS.get(answer.error, TrouperError)(answer.message)
        return answer

    def query(self, msg: Any, timeout_s: float | None = None) -> Any:
        """Ask the root something whose answer is not Accepted/Refused; return the answer
        (waiting ``timeout_s``, at most ``ask_timeout_s``)."""
        if self._asys is None:
            raise InvalidRequest("this Trouper is closed")
        return self._ask_across_roots(msg, msg.request_id, timeout_s)

    def _ask_across_roots(self, msg: Any, request_id: str,
                          timeout_s: float | None = None) -> Any:
        """``_ask`` within ``ask_timeout_s`` (or the shorter ``timeout_s``); a root that
        dies meanwhile is waited for (``root_watch.py`` starts a new one) and the request
        asked of the new one."""
        wait_s = self.ask_timeout_s if timeout_s is None else min(timeout_s, self.ask_timeout_s)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                with self._lock:  # a short wait that ends unanswered says nothing: no probe
                    return self._ask_locked(msg, request_id,
                                            max(0.1, deadline - time.monotonic()),
                                            probe=wait_s >= self.ask_timeout_s)
            except _RootGone as gone:
                if not self._root_up.wait(max(0.0, deadline - time.monotonic())):
                    raise RequestTimeout(str(gone)) from None
                if self._asys is None:
                    raise InvalidRequest("this Trouper is closed") from None

    def _ask(self, msg: Any, request_id: str, timeout_s: float) -> Any:
        with self._lock:
            return self._ask_locked(msg, request_id, timeout_s)

    def _ask_locked(self, msg: Any, request_id: str, timeout_s: float,
                    probe: bool = True) -> Any:
        """Ask the root and wait for the answer matching ``request_id`` (``_lock`` held);
        with ``probe``, a root that leaves it unanswered is probed (``_probe_root``)."""
        assert self._asys is not None
        deadline = time.monotonic() + timeout_s
        what = getattr(msg, "kind", type(msg).__name__)
        answer = self._asys.ask(self._root, msg, min(timeout_s, _LISTEN_SLICE_S))
        while True:
            if answer is not None and getattr(answer, "request_id", None) == request_id:
                return answer
            if answer is not None:
                logger.debug("dropping a stale answer %r", answer)
            if self._root_gone.is_set() and not self._closing:
                raise _RootGone(f"the root actor died while {what} waited for its answer")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if probe and not self._closing:
                    self._probe_root()
                raise RequestTimeout(f"no answer to {what} within {timeout_s:g} s")
            answer = self._asys.listen(min(remaining, _LISTEN_SLICE_S))

    def _probe_root(self) -> None:
        """A request went unanswered: ask the root whether it answers at all, and kill one
        that does not (hung), so that the watch starts a new one (``_lock`` held)."""
        assert self._asys is not None
        token = uuid.uuid4().hex
        wait_s = settings().probe_answer_s
        deadline = time.monotonic() + wait_s
        answer = self._asys.ask(self._root, Probe(token=token), wait_s)
        while not (isinstance(answer, ProbeAnswer) and answer.token == token):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._root_gone.is_set():
                break
            answer = self._asys.listen(remaining)
        else:
            return  # it answers: busy, not hung
        pid = published_pid(self.home.actor_pid_path("root"))
        if pid is not None and not self._root_gone.is_set():
            logger.warning("the root actor (pid %d) answers nothing, not even a probe: hung; "
                           "killing it so that a new one starts", pid)
            signal_quietly(pid, signal.SIGKILL)

    def close(self, stop_sandboxes: bool = True) -> list[str]:
        """Shut the tree down: sandboxes first (bounded), then every actor process. The ids
        of the sessions whose sandboxes were closed (the others were left to the deadline,
        or had none running)."""
        self._closing = True
        if self._watch is not None:
            self._watch.stop()
        asys, self._asys = self._asys, None
        if asys is None:
            self._release_zygote()
            return []
        request_id = uuid.uuid4().hex
        closed: list[str] = []
        try:
            self._asys = asys
            done = self._ask(Shutdown(request_id=request_id, stop_sandboxes=stop_sandboxes),
                             request_id, 20.0)
            if isinstance(done, ShutdownDone):
                closed, self.held_at_close = list(done.sessions), done.held
                logger.info("closed sandboxes of %d session(s)", len(closed))
        except (TrouperError, ActorSystemException) as exc:
            logger.warning("graceful shutdown incomplete: %s", exc)
        finally:
            self._asys = None
            asys.shutdown()
            forking.await_admin_exit(self.home.root, 5.0)  # else its watch says we are gone
            # the admin's first fork exits as soon as it has forked the admin, but on a busy
            # machine not always before a close right after the open: unreaped, it stayed
            # the program's zombie (1 in about 150 open/close cycles under the suite)
            self._reap_forks(wait_s=5.0)
            self._release_zygote()
        return closed

    def _release_zygote(self) -> None:
        if self._zygote:
            self._zygote = False
            sandbox_zygote.release()

    def _reap_forks(self, wait_s: float = 0.0) -> None:
        """Reap the admin's first fork: it exits at once, and nobody else waits for it
        (waiting up to ``wait_s`` for it to exit)."""
        deadline = time.monotonic() + wait_s
        while True:
            for pid in list(self._forks):
                try:
                    done, _status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    self._forks.remove(pid)
            if not self._forks or time.monotonic() >= deadline:
                return
            time.sleep(0.01)  # a poll interval: the condition is the fork's exit above


class _RootGone(RequestTimeout):
    """The root died under a request (``_ask_across_roots`` asks the next root)."""


def _is_fork_of_this_program(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as theirs, open("/proc/self/cmdline", "rb") as ours:
            return theirs.read() in (b"", ours.read())  # b"": already a zombie
    except OSError:
        return False
