"""What the daemon's routes do with its ``Trouper``: idempotent creates, pages, views,
commands, and masking of everything that goes out.

Secrets given at creation are write-only: no answer carries them (the stored config has
no API key, and ``secret_names`` only names the sandbox's secrets), and every string that
leaves the daemon is masked with every secret this process knows (it learns a session's
when it creates or restores it, or first shows it).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import os
import re
import threading
import uuid
from typing import TYPE_CHECKING, Any

from ..client.info import SessionInfo, SessionRow, SessionSummary
from ..client.session import Session, new_session_id
from ..core.fold import SessionView
from ..exceptions import (
    ConfigError,
    Conflict,
    InvalidRequest,
    RequestTimeout,
    StoreUnavailable,
    UnknownSession,
)
from ..messages.events import EVENT_ADAPTER, AgentState, Event
from ..security.masking import known_masker
from ..security.secrets_file import remember_session_secrets
from .bodies import CreateSession, needs_of

if TYPE_CHECKING:
    from ..client.embedded import Trouper
    from ..cluster.member import Member
    from ..config.models import SessionConfig
    from ..store import SessionRecord

REQUEST_META = "daemon.create_request"
"""Session meta key: the keyed hash of the body that created the session (idempotency)."""
MAX_PAGE = 500
MAX_EVENTS_PAGE = 5000
VIEWS_KEPT = 256
"""Sessions whose folded view the daemon keeps between GETs."""
CALL_TIMEOUT_S = 60.0
"""How long a daemon of a cluster waits for the daemon that runs a session to answer."""
MAX_HOPS = 3
"""A call passed on more often than this (its session kept moving) is refused: retry."""


SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
"""A session id as ``Trouper.start_session`` takes one: any other names no session, and is
answered 404 before it reaches the store or a file (``..``, a 256-character id...)."""
MAX_IDEMPOTENCY_KEY = 255
"""Longest ``Idempotency-Key`` header taken on a command."""


class Service:
    """The daemon's operations on one open ``Trouper``."""

    def __init__(self, trouper: Trouper, token: str, member: Member | None = None) -> None:
        self.tree = trouper
        """The daemon's ``Trouper`` as it is (a fenced daemon's is closed a moment)."""
        self.member = member
        """This daemon's membership of a cluster (None: a daemon on its own)."""
        self._labels: dict[str, list[str]] = {}
        self._key = hashlib.sha256(b"trouper daemon idempotency\0" + token.encode()).digest()
        self._creating = threading.Lock()
        self._known: set[str] = set()
        self._known_lock = threading.Lock()
        self._views: collections.OrderedDict[str, SessionView] = collections.OrderedDict()
        self._views_lock = threading.Lock()

    @property
    def trouper(self) -> Trouper:
        """The daemon's open ``Trouper``; StoreUnavailable (503, retried by clients) while
        a daemon fenced by its cluster opens a fresh one."""
        if self.tree.closed:
            raise StoreUnavailable("this daemon is joining its cluster again: retry in a "
                                   "moment")
        return self.tree

    @property
    def store(self) -> Any:
        return self.trouper.store

    # -- sessions ------------------------------------------------------------------

    def create(self, body: CreateSession) -> tuple[dict[str, Any], bool]:
        """Start a session; returns its view and whether it was created now (False: the
        same request was made before with this id). In a cluster it starts on the live
        daemon that can run it and runs the fewest sessions."""
        if body.workspace is not None and not os.path.isabs(body.workspace):
            raise ConfigError("workspace: must be an absolute path (the daemon's folder is "
                              "not yours)", field="workspace")
        if self.member is not None:
            if body.id is None:  # named here, so the call may be carried out again safely
                body = body.model_copy(update={"id": new_session_id()})
            target = self.member.place(needs_of(body))
            if target != self.member.name:
                view, created = self._call(target, body.id, 0, kind="create",
                                           body=body.model_dump())
                return view, bool(created)
        return self._create_here(body)

    def _create_here(self, body: CreateSession) -> tuple[dict[str, Any], bool]:
        fields = body.model_dump()
        labels = fields.pop("labels")
        digest = self._digest({**fields, **({"labels": labels} if labels else {})})
        options = {k: v for k, v in fields.items()
                   if k not in ("id", "task", "llm", "runtime", "workspace", "secrets")}
        if labels and self.member is None:
            raise ConfigError("labels: only a daemon of a cluster places sessions by label "
                              "(docs/cluster.md)", field="labels")
        with self._creating:
            if body.id is not None and self._exists(body.id):
                if self.store.get_meta(body.id, REQUEST_META) != digest:
                    raise Conflict(f"session {body.id!r} exists, made by another request")
                return self.detail(body.id), False
            if body.id is not None:
                self._labels[body.id] = labels  # for ``placed``, told during the start
            try:
                session = self.trouper.start_session(
                    body.task, llm=body.llm, runtime=body.runtime, workspace=body.workspace,
                    secrets=body.secrets, session_id=body.id, **options)
            finally:
                self._labels.pop(body.id or "", None)
            self.store.put_meta(session.id, REQUEST_META, digest)
        with self._known_lock:
            self._known.add(session.id)  # start_session taught this process its secrets
        return self.detail(session.id), True

    def placed(self, session_id: str, config: SessionConfig) -> None:
        """``Trouper``'s word that a session was made here: where it runs, in a cluster."""
        if self.member is not None:
            from ..cluster.member import runtime_needs

            self.member.placed(session_id, runtime_needs(config.runtime.kind,
                                                         self._labels.get(session_id, [])))

    def handle_call(self, body: dict[str, Any]) -> Any:
        """A call from another daemon of the cluster (``cluster/calls.py``)."""
        hops = int(body.get("hops", 0))
        if hops > MAX_HOPS:
            raise RequestTimeout("the session moved between daemons while the request was "
                                 "on its way: retry")
        if body["kind"] == "create":  # placed here by the daemon that was asked
            return self._create_here(CreateSession(**body["body"]))
        if body["kind"] == "carry_on" and self.member is not None:  # handed over in a drain
            return self.member.carry_on(body["session_id"], body.get("left_on", ""))
        if body["kind"] == "diff":
            return self.diff(body["session_id"], hops)
        if body["kind"] in ("fork", "rewind"):
            return self.fork(body["session_id"], body.get("at_seq"), body.get("message"),
                             body.get("llm"), body.get("workspace"), hops,
                             rewind=body["kind"] == "rewind")
        return self._command(body["session_id"], body["command"], body["text"],
                             body["action_id"], body["request_id"], hops)

    def _call(self, target: str, about: str | None, hops: int, **body: Any) -> Any:
        assert self.member is not None
        return self.member.calls.call(
            target, about, {**body, "hops": hops + 1}, CALL_TIMEOUT_S,
            still_for=lambda: self.member.registry.placement(about)[0]
            if self.member is not None and about else None)

    def daemon_of(self, session_id: str) -> str | None:
        """The daemon that runs the session, in a cluster (None: none, or no cluster)."""
        return None if self.member is None else self.member.registry.placement(session_id)[0]

    def _command_id(self, key: str, *parts: str) -> str:
        """The command's id for ``key``: the same key and the same command give the same
        id; another command under a reused key is another command. Keyed, so the id in
        the log tells nothing of the message it hashes."""
        if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY or not key.isprintable():
            raise ConfigError(f"Idempotency-Key: 1 to {MAX_IDEMPOTENCY_KEY} printable "
                              "characters", field="Idempotency-Key")
        return "k-" + self._digest({"key": key, "command": list(parts)})[:40]

    def _digest(self, fields: dict[str, Any]) -> str:
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
        return hmac.new(self._key, canonical.encode(), hashlib.sha256).hexdigest()

    def _exists(self, session_id: str) -> bool:
        try:
            self.record(session_id)
        except UnknownSession:
            return False
        return True

    def page(self, *, states: list[AgentState] | None, cursor: str | None, offset: int,
             limit: int, usage: bool = False, replaced: bool = False) -> dict[str, Any]:
        """A page of sessions, newest first; with ``usage``, each row with its cost and
        steps (folded from its log: the page's list asks for them, a client's
        ``sessions()`` does not); those a rewind replaced only with ``replaced``."""
        if not 1 <= limit <= MAX_PAGE:
            raise ConfigError(f"limit: must be between 1 and {MAX_PAGE}", field="limit")
        if offset < 0:
            raise ConfigError("offset: must not be negative", field="offset")
        if offset and cursor:
            raise ConfigError("cursor: give a cursor or an offset, not both", field="cursor")
        if offset:
            records = [r for r in self.store.sessions(replaced=replaced)
                       if states is None or r.state in states][offset:offset + limit + 1]
            more = len(records) > limit
            records, after = records[:limit], None
            next_offset: int | None = offset + limit if more else None
        else:
            try:
                records, after = self.store.sessions_page(states=states, cursor=cursor,
                                                          limit=limit, replaced=replaced)
            except InvalidRequest as exc:
                raise ConfigError(f"cursor: {exc}", field="cursor") from None
            next_offset = None
        return {"sessions": [self.summary(r, usage) for r in records], "next_cursor": after,
                "next_offset": next_offset}

    def summary(self, record: SessionRecord, usage: bool = False) -> dict[str, Any]:
        """A list's row, masked: the session's summary, with its cost and steps when
        ``usage`` is asked for."""
        self.learn(record.session_id)
        if not usage:
            return mask(SessionSummary.of_record(record).to_json())  # type: ignore[no-any-return]
        with self._views_lock:
            view = self._fold(record.session_id, record.last_seq)
            usage = {"cost_usd": view.cost_usd, "iterations": view.total_iterations}
        row = SessionRow(**SessionSummary.of_record(record).model_dump(), **usage)
        return mask(row.to_json())  # type: ignore[no-any-return]

    def record(self, session_id: str) -> SessionRecord:
        """The stored session; UnknownSession, before the store is asked, for an id no
        session can have."""
        if not SESSION_ID.match(session_id):
            raise UnknownSession(f"no session has the id {session_id[:80]!r}: an id is 1 to "
                                 "64 letters, digits, '.', '_' or '-', starting with a letter "
                                 "or digit")
        return self.store.session(session_id)  # type: ignore[no-any-return]

    def detail(self, session_id: str) -> dict[str, Any]:
        """The session folded from its log: state, cost, the action waiting, its config."""
        record = self.record(session_id)
        fault = self.trouper.fault(session_id)
        self.learn(session_id)
        with self._views_lock:  # the view is shared: read it whole under the lock
            info = SessionInfo.of(record, self._fold(session_id), fault)
        shown = info.to_json()
        if self.member is not None:
            shown["daemon"] = self.daemon_of(session_id)
        return mask(shown)  # type: ignore[no-any-return]

    def _fold(self, session_id: str, last_seq: int | None = None) -> SessionView:
        """The session's view, kept between calls and brought up to date with the events
        appended since (a GET costs the new events, not the whole log; none when
        ``last_seq``, the store's, says there are none)."""
        view = self._views.pop(session_id, None) or SessionView()
        if last_seq is None or view.last_seq < last_seq:
            for event in self.store.read(session_id, since=view.last_seq):
                view.apply(event)
        self._views[session_id] = view
        while len(self._views) > VIEWS_KEPT:
            self._views.popitem(last=False)
        return view

    # -- commands and events -----------------------------------------------------------

    def command(self, session_id: str, command: str, text: str = "",
                action_id: str = "", key: str | None = None) -> dict[str, Any]:
        """Carry out a user command; with an ``Idempotency-Key`` (``key``), the same
        command sent again under it is answered, not carried out twice."""
        self.record(session_id)  # 404 before anything is asked of the tree
        request_id = None if key is None else self._command_id(
            key, session_id, command, text, action_id)
        if request_id is None and self.member is not None:
            request_id = uuid.uuid4().hex  # a call may be carried out again: never twice
        return self._command(session_id, command, text, action_id, request_id)

    def _command(self, session_id: str, command: str, text: str, action_id: str,
                 request_id: str | None, hops: int = 0) -> dict[str, Any]:
        if self.member is not None:
            target = self.member.route(session_id)
            if target is not None:
                return self._call(target, session_id, hops, kind="command",  # type: ignore[no-any-return]
                                  session_id=session_id, command=command, text=text,
                                  action_id=action_id, request_id=request_id)
        self.learn(session_id)
        seq = self.trouper.command(session_id, command, text, action_id=action_id,
                                   request_id=request_id)
        record = self.store.session(session_id)
        return {"id": session_id, "seq": seq, "state": record.state.value}

    def events(self, session_id: str, after: int, limit: int) -> dict[str, Any]:
        if after < 0:
            raise ConfigError("after: must not be negative", field="after")
        if not 1 <= limit <= MAX_EVENTS_PAGE:
            raise ConfigError(f"limit: must be between 1 and {MAX_EVENTS_PAGE}", field="limit")
        self.record(session_id)  # a known session's files only are read
        self.learn(session_id)
        events = self.store.read(session_id, since=after, limit=limit)
        head = self.store.last_seq(session_id)
        return {"events": [event_json(e) for e in events],
                "next_after": events[-1].seq if events else after, "head_seq": head}

    def diff(self, session_id: str, hops: int = 0) -> dict[str, Any]:
        """What changed in the session's workspace since it started, masked (asked of the
        daemon that runs it, whose home holds its baseline)."""
        from ..workspace_diff import workspace_diff

        record = self.record(session_id)
        if self.member is not None:
            target = self.member.route(session_id)
            if target is not None:
                return self._call(target, session_id, hops, kind="diff",  # type: ignore[no-any-return]
                                  session_id=session_id)
        self.learn(session_id)
        compared = workspace_diff(self.trouper.home, session_id, record.config)
        return mask(compared.to_json())  # type: ignore[no-any-return]

    def fork(self, session_id: str, at_seq: int | None, message: str | None,
             llm: dict[str, Any] | None = None, workspace: str | None = None,
             hops: int = 0, *, rewind: bool = False) -> dict[str, Any]:
        """Fork the session at ``at_seq`` (docs/time-travel.md): by the daemon that runs
        it, whose home holds its checkpoints (and whose tree stops it, for a ``rewind``:
        the fork then takes its place in the list). The new session's view."""
        self.record(session_id)
        if workspace is not None and not os.path.isabs(workspace):
            raise ConfigError("workspace: must be an absolute path (the daemon's folder is "
                              "not yours)", field="workspace")
        if self.member is not None:
            target = self.member.route(session_id)
            if target is not None:
                return self._call(target, session_id, hops,  # type: ignore[no-any-return]
                                  kind="rewind" if rewind else "fork",
                                  session_id=session_id, at_seq=at_seq, message=message,
                                  llm=llm, workspace=workspace)
        self.learn(session_id)
        make = self.trouper.rewind if rewind else self.trouper.fork
        fork = make(session_id, at_seq, message, llm=llm, workspace=workspace)
        self.learn(fork.id)
        return {**self.detail(fork.id), "session_id": fork.id}

    def session(self, session_id: str) -> Session:
        self.record(session_id)
        self.learn(session_id)
        return Session(self.trouper, session_id)

    def learn(self, session_id: str) -> None:
        """Teach this process a session's secrets once, so what it shows is masked."""
        if session_id in self._known:
            return
        with self._known_lock:
            if session_id not in self._known:
                remember_session_secrets(self.trouper.home, session_id)
                self._known.add(session_id)


def event_json(event: Event) -> dict[str, Any]:
    """An event as the API shows it: masked with every secret this process knows."""
    return _event_json(known_masker().mask_event(event))


def _event_json(event: Any) -> dict[str, Any]:
    return EVENT_ADAPTER.dump_python(event, mode="json")  # type: ignore[no-any-return]


def mask(value: Any) -> Any:
    """A JSON value with every string masked (keys and values)."""
    masker = known_masker()
    if not masker.enabled:
        return value
    if isinstance(value, str):
        return masker.mask_text(value)
    if isinstance(value, dict):
        return {mask(k): mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value
