"""Forking a session at any event of its log: a new session that starts where the
original was then, its files included (docs/time-travel.md).

The new session's log begins with copies of the original's events 1..N, then a
``SessionForked`` event that says so (which session, which event, how its workspace was
made), then what the fork itself needs: a ``rejected`` outcome for every action the copy
holds without one (it was in flight at N: it is never run again unless the model asks
for it again), and either PAUSED (the user carries it on) or the user's hint and RUNNING.
All of it is one append, before any actor of the new session starts.

Its workspace is a new folder (the original's is never touched) holding the checkpoint
taken after the last action at or before N (``runtimes/sandbox/checkpoints.py``), or the
workspace as the first action found it (``start``) when N precedes every action; on a
remote runtime the server restores it, beside the original's, into the fork's workspace
there. Where no checkpoint exists (a session run with ``checkpoints=False``) the fork
says so: it starts from a copy of the original's current files (on a remote runtime,
from an empty workspace).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from ..config.checks import config_error, pydantic_problems
from ..config.models import LLMConfig, SessionConfig
from ..core.states import Why
from ..exceptions import ConfigError, InvalidRequest, TrouperError
from ..home.paths import Home, private_dir
from ..messages.events import (
    ActionEvent,
    AgentState,
    Event,
    MessageEvent,
    ObservationEvent,
    SessionForked,
    StateChanged,
)
from ..messages.outcomes import Outcome
from ..runtimes.sandbox.checkpoints import Checkpoints
from ..runtimes.sandbox.service import CHANGES_FILES, START_CHECKPOINT
from ..security.masking import remember_secrets, session_maskers
from ..security.secrets_file import (
    read_runtime_token,
    read_secrets,
    with_runtime_token,
    without_runtime_token,
    write_session_secrets,
)
from ..store import EventStore
from ..workspace_diff import take_baseline

NOT_RUN_FORKED = ("Not run: this session was forked while the action was in flight, and "
                  "the fork never runs it by itself. Ask for it again if it is still needed.")


@dataclass(frozen=True)
class Fork:
    """What a fork made: its id, where it starts, and how its files were made."""

    session_id: str
    from_session: str
    at_seq: int
    checkpoint: str | None
    files: str
    """How the workspace was made, in words (also in its ``SessionForked`` event)."""
    config: SessionConfig


def fork_session(home: Home, store: EventStore, session_id: str, new_id: str, *,
                 at_seq: int | None = None, message: str | None = None,
                 llm: Mapping[str, Any] | LLMConfig | None = None,
                 workspace: Path | None = None) -> Fork:
    """Write the fork of ``session_id`` at event ``at_seq`` (None: its last) as the new
    session ``new_id``: its store row, secrets file, workspace and log (see the module
    doc). Starts no actor. ``llm`` replaces the original's model settings (its API key
    is kept unless the new settings give one); ``workspace`` the new folder (default:
    the new session's under the home). Raises InvalidRequest for an ``at_seq`` outside
    the log, UnknownSession for an unknown ``session_id``."""
    record = store.session(session_id)
    events = store.read(session_id)
    last = events[-1].seq if events else 0
    at = last if at_seq is None else at_seq
    if not 1 <= at <= last:
        raise InvalidRequest(f"session {session_id} has events 1 to {last}: cannot fork "
                             f"at {at}")
    prefix = [event for event in events if event.seq <= at]
    secrets, api_key = read_secrets(home, session_id)
    config = _config(record.config, api_key, llm)
    folder = workspace if workspace is not None else home.default_workspace(new_id)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"workspace: {folder} is not an empty folder: a fork's files "
                          "are made in a folder of their own", field="workspace")
    config = config.model_copy(update={"workspace": str(folder)})
    to_mask, _ = session_maskers(secrets, config.llm, config.runtime)
    remember_secrets(to_mask.pairs)  # what this process logs of the fork is masked too
    private_dir(home.session_dir(new_id))
    checkpoint, files = _workspace(home, session_id, new_id, record.config, prefix, at,
                                   folder, _owner(events, session_id, prefix))
    token = read_runtime_token(home, session_id)
    write_session_secrets(home, new_id, secrets, config.llm, runtime_token=token)
    # the row and its log in one transaction: a fork killed between the two would be an
    # empty session, which a restart begins afresh with the original's task; the user's
    # hint is masked as every event is (it may quote a secret)
    log = [to_mask.mask_event(e) for e in
           fork_log(prefix, session_id, at, checkpoint, files, message)]
    store.create_session(new_id, to_mask.mask_event(without_runtime_token(config)), log)
    # what the fork changes from here is its diff (``Session.diff``), as a new session's
    take_baseline(home, new_id, config, secrets=[value for _, value in to_mask.pairs])
    return Fork(new_id, session_id, at, checkpoint, files, config)


def fork_log(prefix: list[Event], session_id: str, at: int, checkpoint: str | None,
             files: str, message: str | None) -> list[Event]:
    """The new session's log (see the module doc), its events unnumbered."""
    copies = [event.model_copy(update={"seq": 0}) for event in prefix]
    answered = {e.action_id for e in prefix if isinstance(e, ObservationEvent)}
    never_run = [ObservationEvent(action_id=e.action_id,
                                  outcome=Outcome(status="rejected", content=NOT_RUN_FORKED))
                 for e in prefix if isinstance(e, ActionEvent) and e.action_id not in answered]
    forked = SessionForked(from_session=session_id, at_seq=at, checkpoint=checkpoint,
                           files=files)
    where = f"forked from {session_id} at event {at}"
    if message and message.strip():
        after: list[Event] = [MessageEvent(source="user", text=message),
                              StateChanged(state=AgentState.RUNNING, cause=Why.USER_MESSAGE,
                                           reason=f"{where}, with a message from the user")]
    else:
        after = [StateChanged(state=AgentState.PAUSED, cause=Why.USER_PAUSE,
                              reason=f"{where}: send a message or resume to carry on")]
    return [*copies, *never_run, forked, *after]


def _config(stored: SessionConfig, api_key: str | None,
            llm: Mapping[str, Any] | LLMConfig | None) -> SessionConfig:
    """The original's config (as stored: without its key) with its key back, or with
    the ``llm`` given (the original's key kept unless it names one)."""
    if llm is None:
        chosen = stored.llm
    elif isinstance(llm, LLMConfig):
        chosen = llm
    else:
        try:
            chosen = LLMConfig.model_validate(llm)
        except ValidationError as exc:  # named as start_session names it: llm.<field>
            raise config_error([(f"llm.{where}" if where else "llm", why)
                                for where, why in pydantic_problems(exc)]) from None
    if chosen.api_key is None and api_key is not None:
        chosen = chosen.model_copy(update={"api_key": SecretStr(api_key)})
    return stored.model_copy(update={"llm": chosen})


def _remote_workspace(home: Home, session_id: str, new_id: str, config: SessionConfig,
                      name: str | None, what: str, at: int) -> tuple[str | None, str]:
    """The runtime server restores the checkpoint into the fork's workspace there."""
    from ..runtimes.remote import RemoteSandbox

    if name is None:
        return None, (f"no checkpoint at event {at}: the fork starts with an empty "
                      "workspace on the runtime server")
    config = with_runtime_token(config, read_runtime_token(home, session_id))
    sandbox = RemoteSandbox(new_id, config=config.runtime)
    try:
        skipped = sandbox.restore(session_id, name)
    except TrouperError as e:
        return None, (f"the runtime server restored no checkpoint ({e}): the fork starts "
                      "with an empty workspace there")
    finally:
        sandbox.close()
    return name, what + _left_out(skipped)


def _left_out(skipped: dict[str, str]) -> str:
    left = sorted(skipped)
    if not left:
        return ""
    more = f" and {len(left) - 10} more" if len(left) > 10 else ""
    return f"; left out: {', '.join(left[:10])}{more}"


def _last_change(prefix: list[Event]) -> ObservationEvent | None:
    """The outcome of the last action of ``prefix`` that may have changed the files (its
    checkpoint is the workspace at the end of ``prefix``); None when none ran."""
    kinds = {e.action_id: e.action.kind for e in prefix
             if isinstance(e, ActionEvent) and e.action is not None}
    ran = [e for e in prefix if isinstance(e, ObservationEvent)
           and kinds.get(e.action_id) in CHANGES_FILES and e.outcome.status != "rejected"]
    return ran[-1] if ran else None


def _owner(events: list[Event], session_id: str, prefix: list[Event]) -> str:
    """The session whose checkpoint store holds the snapshot ``prefix`` ends with (of
    ``events``, ``session_id``'s whole log): a fork's log begins with copies of its
    original's events (before its ``forked`` event), whose snapshots are in the
    original's store, and so on up a fork of a fork."""
    last = _last_change(prefix)
    seq = last.seq if last is not None else 0
    owner = session_id
    for mark in reversed([e for e in events if isinstance(e, SessionForked)]):
        if seq >= mark.seq:
            break
        owner = mark.from_session
    return owner


def _workspace(home: Home, session_id: str, new_id: str, config: SessionConfig,
               prefix: list[Event], at: int, folder: Path, owner: str
               ) -> tuple[str | None, str]:
    """Make the fork's workspace in ``folder`` (on a remote runtime: on its server); the
    checkpoint it holds and, in words, what it is."""
    last = _last_change(prefix)
    name = START_CHECKPOINT if last is None else last.outcome.checkpoint
    what = (f"the workspace as it was after action {last.action_id} (event {last.seq})"
            if last is not None else "the workspace as it was before the first action")
    if config.runtime.kind == "remote":
        folder.mkdir(parents=True, exist_ok=True)  # a remote session's is on the server
        return _remote_workspace(home, owner, new_id, config, name, what, at)
    store = Checkpoints(str(home.runtime_dir(owner) / "checkpoints"), config.workspace)
    if name is not None and store.manifest(name) is not None:
        return name, what + _left_out(store.restore(name, str(folder)))
    original = Path(config.workspace)
    if original.is_dir():
        shutil.copytree(original, folder, symlinks=True, dirs_exist_ok=True)
        return None, (f"no checkpoint at event {at} (checkpoints off, or none kept): the "
                      "fork starts from a copy of the original's current files")
    folder.mkdir(parents=True, exist_ok=True)
    return None, f"no checkpoint at event {at}, and the original's workspace is gone: " \
                 "the fork starts with an empty workspace"


__all__ = ["NOT_RUN_FORKED", "Fork", "fork_log", "fork_session"]
