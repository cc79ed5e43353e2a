"""A daemon as a member of a cluster: it joins, beats, places sessions, takes over the
sessions of peers that died, answers their calls, and hands its own over when it stops.

One thread beats every ``heartbeat_s`` (database time). At each beat it also declares
dead every peer whose heartbeat is older than that peer's ``dead_after_s``, and adopts
its share of the working sessions of gone daemons: each is restored here, which claims
its log (a new owner token: anything the old host still runs can no longer append, and
its Controller stands down at its next write). A member that finds itself fenced (its
row declared dead while it could not beat, or another start of its name) stops running
sessions at once (``on_fenced``), then joins again as a new generation.

``drain()`` (SIGTERM) marks the member draining, lets its owner stop the actors, then
places each working session on a live peer, whose calls are sent on; no heartbeat has to
lapse.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..exceptions import ConfigError, StoreError, TrouperError
from ..home.paths import Home, private_dir, write_private
from ..store import SessionRecord, open_store
from ..store.postgres import PostgresEventStore
from .calls import Calls, CallTaker, Handler
from .key import ClusterKey
from .registry import ALIVE, DRAINING, GONE, STOPPED, DaemonRecord, Me, Registry
from .takeover import (
    journal_is_elsewhere,
    record_unreachable,
    settle_lost,
    unreachable_workspace,
)

logger = logging.getLogger(__name__)

SECRETS_META = "cluster.secrets"
"""Session meta key: the session's secrets file, sealed with the cluster key."""
_SEALED_SECRETS = "session secrets"
JOURNAL_META = "cluster.journal"
"""Session meta key: the home whose sandbox journal saw the session's actions (its
``local`` or ``docker`` sandbox runs from there); moved only once what another home may
have run is recorded lost."""


def runtime_needs(kind: str, labels: Sequence[str] = ()) -> list[str]:
    """What a daemon must have to run a session whose runtime is of this kind (``local``,
    ``docker``; a remote runtime runs anywhere) with these labels (``gpu=a100``)."""
    needs = [] if kind == "remote" else [kind]
    return sorted({*needs, *(f"label:{label}" for label in labels)})


def default_name(home: Home) -> str:
    """A daemon's name unless given: this host's name and its home's folder name."""
    return f"{socket.gethostname()}:{home.root.name}"


class Member:
    """One daemon's membership; see the module docstring."""

    def __init__(self, store_url: str, key: ClusterKey, home: Home, *, name: str,
                 url: str, capabilities: Sequence[str], heartbeat_s: float,
                 dead_after_s: float) -> None:
        if heartbeat_s <= 0 or dead_after_s <= heartbeat_s:
            raise ConfigError("the heartbeat must be above 0 s and shorter than the time "
                              "after which a silent daemon is declared dead",
                              field="heartbeat")
        # a beat that cannot get a connection fails within the time peers wait, not later
        store = open_store(store_url, timeout_s=max(1.0, dead_after_s))
        assert isinstance(store, PostgresEventStore), "a cluster shares a PostgreSQL store"
        self.store, self.key, self.home = store, key, home
        self.registry = Registry(store)
        self.calls = Calls(store, key)
        self.me = Me(name=name, url=url, host=socket.gethostname(), home=str(home.root),
                     pid=os.getpid(), capabilities=tuple(sorted(set(capabilities))),
                     heartbeat_s=heartbeat_s, dead_after_s=dead_after_s)
        self.generation = 0
        self.restore: Callable[[str], None] = lambda session_id: None
        """Carries a session on here (set by the daemon: ``Trouper.restore``)."""
        self.on_fenced: Callable[[], None] = lambda: None
        """Stops running every session here (set by the daemon)."""
        self.on_rejoin: Callable[[], None] = lambda: None
        """Makes ready to run sessions again after ``on_fenced`` (set by the daemon);
        a StoreError it raises is tried again at the next beat."""
        self._stop = threading.Event()
        self._last_ok = time.monotonic()
        """When a beat last reached the store."""
        self._rejoin = False
        """Fenced: the beat joins again (a new generation) once the store answers."""
        self._fence_lock = threading.Lock()
        self._serving = threading.Event()
        """Set once the daemon runs sessions: until then the beat only says it lives."""
        self._beat: threading.Thread | None = None
        self._taker: CallTaker | None = None

    @property
    def name(self) -> str:
        return self.me.name

    # -- joining and leaving ---------------------------------------------------------

    def join(self) -> None:
        """Check the key and register (refused with ConfigError: another key, the name
        taken by a live daemon elsewhere)."""
        self.registry.check_key(self.key)
        self.generation = self.registry.register(self.me)
        logger.info("cluster: joined as %s (generation %d), capabilities %s", self.name,
                    self.generation, ", ".join(self.me.capabilities))
        # beating from now on: a daemon whose actor system takes seconds to open must not
        # be declared dead meanwhile (it takes no session over before ``serve``)
        self._beat = threading.Thread(target=self._beating, name="cluster-heartbeat",
                                      daemon=True)
        self._beat.start()

    def serve(self, handler: Handler) -> None:
        """Take calls, carry on the sessions placed here, then take sessions over from
        gone peers at each beat, until ``drain`` or ``close``."""
        self._taker = CallTaker(self.store, self.key, self.name, handler)
        self._taker.start()
        for session_id in self.registry.placed_on(self.name):
            self.carry_on(session_id)
        self.registry.set_state(self.name, self.generation, ALIVE)
        self._serving.set()

    def drain(self, stop_actors: Callable[[], None]) -> dict[str, str]:
        """Hand every working session to a live peer: no new session comes here, the
        actors stop (``stop_actors``), then the sessions are placed on peers, which carry
        them on at once. Returns session id -> its new daemon."""
        self._serving.clear()  # the beat goes on (no peer takes over meanwhile), alone
        self.registry.set_state(self.name, self.generation, DRAINING, "draining: SIGTERM")
        if self._taker is not None:
            self._taker.stop()
        stop_actors()
        def tell(conn: Any, session_id: str, peer: str) -> None:  # it carries it on at once
            self.calls.post(peer, session_id, {"kind": "carry_on", "session_id": session_id,
                                               "left_on": str(self.home.root),
                                               "reply": False}, conn)

        moved = self.registry.hand_over(self.name, tell)
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=10)
        self.registry.set_state(self.name, self.generation, STOPPED, "stopped")
        logger.info("cluster: %s stopped; %d sessions handed over", self.name, len(moved))
        return moved

    def close(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=10)
        if self._taker is not None:
            self._taker.stop()
        self.store.close()

    # -- placement -------------------------------------------------------------------

    def place(self, needs: Sequence[str]) -> str:
        """The daemon a new session with these needs goes to; ConfigError when none of
        the live ones can run it."""
        chosen = self.registry.place(needs)
        if chosen is None:
            live = [d for d in self.registry.daemons() if d.state == "alive"]
            raise ConfigError(
                f"no live daemon of the cluster can run this session: it needs "
                f"{', '.join(needs) or 'nothing'}; the live daemons have "
                + ("; ".join(f"{d.name}: {', '.join(d.capabilities)}" for d in live)
                   or "none"), field="runtime")
        return chosen

    def placed(self, session_id: str, needs: Sequence[str]) -> None:
        """A session made here: placed here, its secrets file sealed into the store so a
        peer that takes it over can carry it on."""
        path = self.home.secrets_path(session_id)
        try:
            plain = json.loads(path.read_text())
        except FileNotFoundError:
            plain = None
        if plain is not None:
            sealed = self.key.seal(_SEALED_SECRETS, session_id, plain)
            self.store.put_meta(session_id, SECRETS_META, base64.b64encode(sealed).decode())
        self.store.put_meta(session_id, JOURNAL_META, str(self.home.root))
        self.registry.set_placement(session_id, self.name, needs)

    def route(self, session_id: str) -> str | None:
        """Where a call about this session is carried out: None for here (a session of
        this daemon, or one taken over now: its daemon is gone, or no daemon ever ran it),
        or the name of the live daemon that runs it. Raises ConfigError when its daemon
        is gone and this one cannot run it."""
        daemon, state, needs = self.registry.placement(session_id)
        if daemon == self.name:
            self._arrive(session_id, None)  # (a take this daemon crashed in mid-way)
            return None
        if daemon is not None and state not in GONE:
            return daemon
        left_on = self.registry.take(session_id, self.name, self.me.capabilities)
        if left_on is not None:
            logger.info("cluster: took session %s over from %s (%s)", session_id, daemon,
                        state)
            self._arrive(session_id, left_on)
            return None
        daemon, state, needs = self.registry.placement(session_id)  # a peer took it
        if daemon is not None and state not in GONE:
            return daemon
        raise ConfigError(f"session {session_id!r} ran on {daemon!r}, which is {state}, and "
                          f"this daemon cannot run it (it needs {', '.join(needs)})",
                          field="runtime")

    def runs(self, record: SessionRecord) -> bool:
        """Whether the stored session is placed on this daemon."""
        return self.registry.placement(record.session_id)[0] == self.name

    def daemons(self) -> list[DaemonRecord]:
        return self.registry.daemons()

    # -- the beat --------------------------------------------------------------------

    def _beating(self) -> None:
        self._last_ok = time.monotonic()
        threading.Thread(target=self._watching, name="cluster-watchdog", daemon=True).start()
        while not self._stop.wait(self.me.heartbeat_s):
            try:
                if self._rejoin:  # fenced before: join as a new generation, carry on ours
                    serving = self._serving.is_set()  # (not before it serves, nor draining)
                    if serving:
                        self.on_rejoin()
                    self.generation = self.registry.register(self.me)
                    self._rejoin = False
                    logger.info("cluster: %s joined again (generation %d)", self.name,
                                self.generation)
                    if serving:
                        self.registry.set_state(self.name, self.generation, ALIVE)
                        for session_id in self.registry.placed_on(self.name):
                            self.carry_on(session_id)
                elif not self.registry.heartbeat(self.name, self.generation):
                    self._fence("the cluster declared it dead")
                    continue
                self._last_ok = time.monotonic()
                if not self._serving.is_set():
                    continue
                for name in self.registry.declare_dead():
                    logger.warning("cluster: daemon %s is dead (its heartbeat lapsed)", name)
                for session_id, left_on in self.registry.adopt(self.name,
                                                               self.me.capabilities):
                    logger.info("cluster: adopting session %s", session_id)
                    self.carry_on(session_id, left_on)
            except StoreError as exc:
                logger.warning("cluster: cannot beat (%.1f s): %s",
                               time.monotonic() - self._last_ok, exc)
                self._fence_if_silent()
            except Exception:  # noqa: BLE001 - a beat that dies leaves the daemon unfenced
                logger.exception("cluster: the beat failed; beating on")
                self._fence_if_silent()

    def _watching(self) -> None:
        """A beat that hangs (a partition that swallows packets: the query waits for the
        TCP timeouts) must not keep this daemon running sessions its peers took."""
        while not self._stop.wait(self.me.heartbeat_s):
            if self._serving.is_set():
                self._fence_if_silent()

    def _fence_if_silent(self) -> None:
        silent = time.monotonic() - self._last_ok
        if silent > self.me.dead_after_s:  # the peers may have declared it dead by now
            self._fence(f"no heartbeat reached the store for {silent:.1f} s")

    def _fence(self, why: str) -> None:
        """Fenced once until it joins again (the beat and the watchdog may both see it)."""
        with self._fence_lock:
            if not self._rejoin:
                self._rejoin = self._fenced(why)

    def _fenced(self, why: str) -> bool:
        """Peers may run this daemon's sessions now: stop running ours (the beat joins
        again once the store answers). Returns True."""
        logger.error("cluster: %s is fenced (%s): it stops running its sessions", self.name,
                     why)
        try:
            self.on_fenced()
        except Exception:  # noqa: BLE001 - the beat must go on, to join again
            logger.exception("cluster: stopping the sessions failed")
        return True

    # -- carrying a session on -------------------------------------------------------

    def carry_on(self, session_id: str, left_on: str | None = None) -> None:
        """Carry the session on here (restored from its log; a session already running
        here is left as it is), or record ERROR when its workspace is not here.
        ``left_on``: the home of the daemon it ran on ('' unknown; None: this one's)."""
        try:
            self._arrive(session_id, left_on)
            record = self.store.session(session_id)
            missing = unreachable_workspace(record.config)
            if missing is not None:
                record_unreachable(self.store, session_id, missing, self.name)
                return
            self.restore(session_id)
        except TrouperError as exc:
            logger.error("cluster: session %s cannot be carried on here: %s", session_id, exc)

    def _arrive(self, session_id: str, left_on: str | None) -> None:
        """The session runs here from now on. ``left_on``: the home of the daemon it ran
        on ('': none known, an embedded program's; None: this daemon's). Its secrets are
        brought here, and unless its actions went to this home's journal (the
        ``JOURNAL_META`` the store keeps, else ``left_on``), the old host's containers go
        and what it may have run is recorded lost (``cluster/takeover.py``) before the
        mark moves here: a crash between the move and the record is caught at the next
        arrival, whichever path it takes."""
        self._bring_secrets(session_id)
        here = str(self.home.root)
        marked = self.store.get_meta(session_id, JOURNAL_META)
        journal = marked
        if journal is None:  # placed before the mark was kept, or no daemon's
            ran_here = left_on in (None, here) or self.home.runtime_dir(session_id).exists()
            journal = here if ran_here else left_on or ""
        if journal != here:
            if journal:
                self._retire_leftovers(session_id, journal)
            if journal_is_elsewhere(self.store.session(session_id).config):
                settle_lost(self.store, session_id)
        if marked != here:
            self.store.put_meta(session_id, JOURNAL_META, here)

    def _retire_leftovers(self, session_id: str, left_on: str) -> None:
        """The containers the session's last daemon left (SIGKILLed, it could not remove
        them), where this daemon's engine reaches them: the session gets a fresh one here,
        and an old one must not run on beside it."""
        if left_on and "docker" in self.me.capabilities:
            from .leftovers import remove_containers

            remove_containers(session_id, left_on)

    def _bring_secrets(self, session_id: str) -> None:
        """The session's secrets file in this home, from the store, if it is not here."""
        path = self.home.secrets_path(session_id)
        if path.exists():
            return
        private_dir(self.home.session_dir(session_id))
        value = self.store.get_meta(session_id, SECRETS_META)
        if value is None:
            return
        plain = self.key.open(_SEALED_SECRETS, session_id, base64.b64decode(value))
        write_private(path, json.dumps(plain), durable=True)
