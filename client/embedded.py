"""The Python API: ``Trouper`` runs an embedded actor system; ``Session`` drives one session.

They implement ``client_protocol``'s ``TrouperClient`` and ``SessionHandle``, as the
daemon's client (``Trouper.connect()``) does.

Example::

    from trouper import Trouper, AgentState
    with Trouper(home="/tmp/th") as t:
        s = t.start_session("make hello.txt", llm={"model": "hosted_vllm/x",
                                                   "base_url": url, "api_key": "k"})
        assert s.wait(timeout=60) == AgentState.FINISHED
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from ..config.models import LLMConfig, RestartPolicy, RuntimeConfig, SessionConfig
from ..config.settings import Settings
from ..core.states import RESTORABLE
from ..exceptions import InvalidRequest, RequestTimeout, UnknownSession
from ..home.paths import Home, private_dir
from ..messages.events import AgentState
from ..messages.protocol import FaultQuery, FaultStatus, StartSession, UserCommand
from ..runtimes.docker_support import gc_at_start, sweep_at_close
from ..security.masking import remember_secrets, session_maskers
from ..security.secrets_file import (
    read_runtime_token,
    read_secrets,
    runtime_token,
    with_runtime_token,
    without_runtime_token,
    write_session_secrets,
)
from ..store import EventStore, SessionRecord, open_store, store_url
from ..workspace_diff import take_baseline
from .actor_system import ActorSystemHandle
from .checks import (
    check_trouper_args,
    checked_config,
    checked_request_id,
    free_id,
    workspace_path,
)
from .fork import fork_session
from .info import SessionSummary
from .rewind import replace
from .session import Session, new_session_id
from .store_reader import summaries

if TYPE_CHECKING:
    from .daemon import RemoteTrouper

logger = logging.getLogger(__name__)


class Trouper:
    """An embedded trouper: an actor system, a store and the sessions under one home (a
    ``TrouperClient``).

    Args:
        home: the folder holding the store and session folders (``$TROUPER_HOME``,
            else ``~/.trouper``).
        resume: on open, carry on every session the log shows was still working
            (RUNNING, LOADING, RATE_LIMITED, or an ERROR that was recovering).
        policy: the restart policy of the supervisors.
        ask_timeout_s: how long a request to the actor tree may take.
        store: the event store's URL (``postgresql://...`` for one shared by several
            hosts; docs/cluster.md); default ``$TROUPER_STORE``, else the home's SQLite
            file. The home still holds the logs, the secrets and default workspaces.
        mine: which stored sessions this Trouper carries on when it opens (``resume``)
            or when its root is started again; default all. A daemon of a cluster gives
            the sessions placed on it.
        placed: told ``(session_id, config)`` of each session this Trouper starts, once
            its row is in the store and before its actors start (a cluster's daemon
            records where it runs); what it raises refuses the start.

    Raises:
        ConfigError: ``home`` exists and is not a folder, ``ask_timeout_s`` is not
            positive, or a ``TROUPER_*`` setting in the
            environment is refused (its ``field`` names the variable); checked before
            anything is created.
    """

    def __init__(
        self,
        home: str | os.PathLike[str] | None = None,
        *,
        resume: bool = True,
        policy: RestartPolicy | None = None,
        ask_timeout_s: float = 30.0,
        system_base: str = "multiprocTCPBase",
        admin_port: int | None = None,
        store: str | None = None,
        mine: Callable[[SessionRecord], bool] | None = None,
        placed: Callable[[str, SessionConfig], None] | None = None,
    ) -> None:
        check_trouper_args(home, ask_timeout_s)
        Settings.from_env()  # the actors read these after the fork: refuse here
        self.home = Home.at(home)
        self.store_url = store_url(self.home, store)
        self._mine, self._placed = mine, placed
        open_store(self.store_url).close()  # a store that cannot open fails before a fork
        self._system = ActorSystemHandle(
            self.home, policy or RestartPolicy(), ask_timeout_s, system_base, admin_port)
        self._closed = False
        self._containers: dict[str, bool] = {}
        """The docker sessions this program ran (id -> keep): none outlives its close."""
        self.store: EventStore  # opened once the actor system runs (see below)
        try:
            # forked first: SQLite's lock table survives a fork, and an actor forked while
            # this process held a connection would share its locks instead of taking its own
            self._system.open()
            self.store = open_store(self.store_url)
            self._system.on_new_root = self._resume_unfinished  # after a root that died
            # containers of ended sessions, replaced ones among them
            gc_at_start(self.home.root, self.store.sessions(replaced=True))
            if resume:
                self._resume_unfinished()
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def __enter__(self) -> Trouper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, stop_sandboxes: bool = True) -> list[str]:
        """Stop every actor (and, by default, every sandbox). Idempotent. Returns the ids
        of the sessions whose sandboxes this call closed (empty when called again).

        No container of this program's sessions outlives it, ``stop_sandboxes`` or not:
        whatever the tree could not stop is removed once it is down (within
        ``docker_support.CLOSE_SWEEP_S``), but the newest of a ``keep`` session. A session
        still working resumes, at the next open, in a fresh container. With
        ``stop_sandboxes=False`` the local sandbox servers are left to be re-attached
        (they end by themselves when idle)."""
        if self._closed:
            return []
        self._closed = True
        closed = self._system.close(stop_sandboxes=stop_sandboxes)
        held = self._system.held_at_close  # None: the tree did not say; all this ran
        ours = {sid: keep for sid, keep in self._containers.items()
                if held is None or sid in held}
        if ours:
            sweep_at_close(self.home.root, ours)
        store = getattr(self, "store", None)  # absent when the actor system failed to open
        if store is not None:
            store.close()
        return closed

    # -- sessions ----------------------------------------------------------------

    def start_session(
        self,
        task: str,
        *,
        llm: Mapping[str, Any] | LLMConfig,
        runtime: str | Mapping[str, Any] | RuntimeConfig = "local",
        workspace: str | os.PathLike[str] | None = None,
        secrets: Mapping[str, str] | None = None,
        session_id: str | None = None,
        **options: Any,
    ) -> Session:
        """Start a session working on ``task`` and return it at once (it runs in the tree).

        ``secrets`` (name -> value) are environment variables of the sandbox's shell; the
        model may use them as ``<secret:NAME>``, and their values (and the LLM key, which
        it may not use) are masked in everything stored, shown or logged. Only
        ``<home>/sessions/<id>/secrets.json`` (0600) holds them. ``options`` are the other
        fields of ``SessionConfig`` (``max_iterations``, ``max_cost_usd``,
        ``command_timeout_s``, ``no_output_timeout_s``...). ``runtime`` is where the
        sandbox runs: ``"local"`` (the default, ``LocalRuntime()``), a ``DockerRuntime``
        (``{"kind": "docker", "image": ...}``) or a ``RemoteRuntime`` (``{"kind":
        "remote", "url": ..., "token": ...}``: the token is kept like the LLM key).
        ``session_id``: the id to give the session (letters, digits, ``.``, ``_``, ``-``;
        at most 64), instead of a new ``s-...`` one; an id the store holds is refused
        (InvalidRequest).

        Everything is checked before anything is created: a refused session leaves no
        folder, no workspace, no store row and no secrets file. A ``workspace`` the user
        names is created only if its parent exists. Before the session's actors start, a
        baseline of the workspace is recorded, for ``Session.diff()`` (docs/api.md, "What
        the agent changed").

        Raises:
            ConfigError: naming the field and the reason (``task: must not be empty``),
                its message masked; MissingCredentials (a ConfigError) when the model
                needs an API key that is neither given nor in the environment.
            InvalidRequest: this Trouper is closed.
        """
        if self._closed:
            raise InvalidRequest("this Trouper is closed")
        session_id = new_session_id() if session_id is None else \
            free_id(self.store, session_id)
        named = workspace is not None
        folder = workspace_path(workspace, self.home.root) if named else \
            self.home.default_workspace(session_id)
        config = checked_config(task, llm, runtime, folder, secrets, options, named)
        secrets = dict(secrets or {})
        # all checked and nothing made so far: a refusal above leaves no trace
        private_dir(self.home.session_dir(session_id))  # mkdir's parents would take the umask
        folder.mkdir(parents=not named, exist_ok=True)
        to_mask, _ = session_maskers(secrets, config.llm, config.runtime)
        token = runtime_token(config)  # a remote runtime's: kept like the LLM key
        # this process's logs and the store's safety net
        remember_secrets(to_mask.pairs)  # the runtime token among them
        write_session_secrets(self.home, session_id, secrets, config.llm, runtime_token=token)
        # the task and every other field stored masked; the keys are left out
        self.store.create_session(session_id, to_mask.mask_event(without_runtime_token(config)))
        if self._placed is not None:
            self._placed(session_id, config)
        # before the actors, so before any action; a file holding a secret is not copied
        take_baseline(self.home, session_id, config,
                      secrets=[value for _, value in to_mask.pairs])
        self._expect_sandbox(session_id, config)
        self._system.request(StartSession(
            request_id=uuid.uuid4().hex, session_id=session_id, config=config,
            secrets=secrets, home=str(self.home.root), store_url=self.store_url))
        return Session(self, session_id)

    def fork(self, session_id: str, at_seq: int | None = None, message: str | None = None,
             *, llm: Mapping[str, Any] | LLMConfig | None = None,
             workspace: str | os.PathLike[str] | None = None) -> Session:
        """A new session that starts where ``session_id`` was at event ``at_seq`` (None:
        its last): its log begins with the original's events up to there, its workspace
        is the checkpoint taken then (docs/time-travel.md). With ``message`` it carries
        on with that hint at once; without, it waits PAUSED for the user. The original is
        untouched. ``llm`` replaces the model settings (a new scripted server...);
        ``workspace`` the fork's folder (default: its own under the home).

        Raises UnknownSession, or InvalidRequest for an ``at_seq`` outside the log."""
        if self._closed:
            raise InvalidRequest("this Trouper is closed")
        new_id = new_session_id()
        folder = workspace_path(workspace, self.home.root) if workspace is not None else None
        made = fork_session(self.home, self.store, session_id, new_id, at_seq=at_seq,
                            message=message, llm=llm, workspace=folder)
        if self._placed is not None:
            self._placed(new_id, made.config)
        if message and message.strip():
            self.restore(new_id)  # it carries on; a paused fork starts on its first command
        return Session(self, new_id)

    def rewind(self, session_id: str, at_seq: int | None = None, message: str | None = None,
               *, llm: Mapping[str, Any] | LLMConfig | None = None,
               workspace: str | os.PathLike[str] | None = None) -> Session:
        """``fork``, and the fork takes the original's place in ``sessions()``: the
        original is stopped if it is still working, then marked replaced (its log and
        files are kept; ``session(id)`` still opens it). docs/time-travel.md, "Rewind".

        Raises UnknownSession, or InvalidRequest for an ``at_seq`` outside the log."""
        fork = self.fork(session_id, at_seq, message, llm=llm, workspace=workspace)
        replace(self.store, Session(self, session_id), fork.id)
        return fork

    def sessions(self, state: AgentState | str | None = None, *,
                 replaced: bool = False) -> list[SessionSummary]:
        """Every session in the store, newest first; with ``state``, only those in it
        (ConfigError for a name that is no state); one a rewind replaced only with
        ``replaced``."""
        return summaries(self.store, state, replaced)

    def session(self, session_id: str) -> Session:
        """The session with that id. Raises UnknownSession."""
        self.store.session(session_id)
        return Session(self, session_id)

    # -- used by Session -------------------------------------------------------------

    def fault(self, session_id: str, timeout_s: float | None = None) -> str | None:
        """Why the session cannot record anything right now (a full disk, a read-only
        store...), or None. While it lasts the session is in ERROR for its clients,
        though its log cannot say so yet (it is recorded once the store takes writes).
        ``timeout_s``: how long to wait for the tree's answer (at most ``ask_timeout_s``;
        no answer reads as None)."""
        if self._closed:
            return None  # no actor system to ask: only the log speaks
        try:
            answer = self._system.query(FaultQuery(request_id=uuid.uuid4().hex,
                                                   session_id=session_id), timeout_s)
        except (InvalidRequest, RequestTimeout) as exc:
            logger.debug("no answer about session %s's faults: %s", session_id, exc)
            return None
        return answer.cause if isinstance(answer, FaultStatus) else None

    def command(self, session_id: str, command: str, text: str = "", *,
                action_id: str = "", request_id: str | None = None) -> int:
        """Send a user command; start the session's actors first if they are not running
        (a settled session stands down after ``settled_stand_down_s``; should it stand
        down again before the command reaches it, it is started again).

        ``request_id`` names the command (letters, digits, ``.``, ``_``, ``:``, ``-``; at
        most 64): sent again with the same id, a command the session carried out is
        answered with the seq of its first event and not carried out twice (among the
        session's latest 256 commands). The daemon's ``Idempotency-Key`` header becomes
        one, so a client that lost the answer may send the command again."""
        if request_id is None:
            request_id = uuid.uuid4().hex
        else:
            request_id = checked_request_id(request_id)
        msg = UserCommand(request_id=request_id, session_id=session_id,
                          command=command, text=text,  # type: ignore[arg-type]
                          action_id=action_id)
        for attempt in range(_COMMAND_RESTORES + 1):
            try:
                return self._system.request(msg).seq
            except UnknownSession:
                if attempt == _COMMAND_RESTORES:
                    raise
                self.restore(session_id)  # no host had it: the same id goes to the new one
        raise AssertionError("unreachable")

    def restore(self, session_id: str) -> None:
        """Start the actors of a stored session; they carry on from its log."""
        record = self.store.session(session_id)
        secrets, api_key = read_secrets(self.home, session_id)
        config = record.config
        if api_key is not None:
            config = config.model_copy(
                update={"llm": config.llm.model_copy(update={"api_key": SecretStr(api_key)})})
        token = read_runtime_token(self.home, session_id)
        config = with_runtime_token(config, token)
        remember_secrets(session_maskers(secrets, config.llm, config.runtime)[0].pairs)
        self._expect_sandbox(session_id, config)
        self._system.request(StartSession(
            request_id=uuid.uuid4().hex, session_id=session_id, config=config,
            secrets=secrets, home=str(self.home.root), store_url=self.store_url,
            restore=True))

    @staticmethod
    def connect(url: str | None = None, token: str | None = None,
                home: str | os.PathLike[str] | None = None) -> RemoteTrouper:
        """A client of a running ``trouper daemon``, with this same session API over HTTP
        (default: the daemon of ``home``, its url and token read there); docs/daemon.md."""
        from .daemon import connect

        return connect(url, token=token, home=home)

    def _expect_sandbox(self, session_id: str, config: SessionConfig) -> None:
        """The sandbox server of a local or docker session is forked by the zygote; a
        docker session's containers are this program's to remove at its close."""
        if config.runtime.kind == "docker":
            self._containers[session_id] = bool(getattr(config.runtime, "keep", False))
        if config.runtime.kind != "remote":
            self._system.expect_sandboxes()

    def _resume_unfinished(self) -> None:
        for record in self.store.sessions(replaced=True):  # a replaced one may still work
            if record.state in RESTORABLE and (self._mine is None or self._mine(record)):
                logger.info("resuming session %s (%s)", record.session_id, record.state.value)
                self.restore(record.session_id)


_COMMAND_RESTORES = 3
"""Restores a command tries before it reports the session unknown."""
