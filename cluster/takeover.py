"""What a daemon records when it takes a session over from another daemon, before the
session's Controller starts here: the one other writer of a log (docs/architecture.md,
"A cluster of daemons"), always after claiming it (a new owner token fences every writer
before it).

- **Actions the old host may have run.** A `local` or `docker` session's journal lives in
  the home of the daemon that ran it. Asked here, a fresh journal would answer "absent"
  for an action the old host did send, and the Controller would run it again. So every
  action with no outcome that may have been sent (all but one still waiting for the
  user's approval) is recorded ``lost`` here, as its sandbox was lost with its host. A
  remote runtime's journal is the runtime server's, which every daemon asks: nothing is
  recorded for it.
- **A workspace that is not here.** A `local` or `docker` session needs its workspace on
  this host. Where it is not, the session is recorded in ERROR, saying so, instead of
  a sandbox started on an empty folder.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..config.models import SessionConfig
from ..core.fold import SessionView
from ..core.loop import LOST_CONTENT
from ..core.states import Why
from ..messages.events import AgentState, ObservationEvent, StateChanged
from ..messages.outcomes import Outcome
from ..store.base import EventStore

logger = logging.getLogger(__name__)


def journal_is_elsewhere(config: SessionConfig) -> bool:
    """Whether the session's journal stays with the host that ran it."""
    return config.runtime.kind != "remote"


def settle_lost(store: EventStore, session_id: str) -> list[str]:
    """Fence the old host, then record ``lost`` for every action of the session that
    may have been sent to its sandbox and has no outcome; their ids.

    The claim comes first: until it, the old host (cut off, not dead) may still append
    an action and send it; after it, none of its appends goes through, so the log read
    next holds every action it may have sent."""
    owner = store.claim_owner(session_id)
    view = SessionView.of(store.read(session_id))
    waiting = view.awaiting_confirmation
    lost = [action_id for action_id in view.pending
            if waiting is None or action_id != waiting.action_id]
    if lost:
        store.append(session_id, [
            ObservationEvent(action_id=action_id,
                             outcome=Outcome(status="lost", content=LOST_CONTENT))
            for action_id in lost], owner=owner)
        logger.warning("cluster: session %s: %d action(s) its last daemon may have run "
                       "recorded lost: %s", session_id, len(lost), ", ".join(lost))
    return lost


def unreachable_workspace(config: SessionConfig) -> str | None:
    """The session's workspace when its sandbox would run here and it is not here."""
    if config.runtime.kind == "remote":
        return None
    return None if Path(config.workspace).is_dir() else str(config.workspace)


def record_unreachable(store: EventStore, session_id: str, workspace: str,
                       daemon: str) -> None:
    """The session in ERROR: its workspace is not on this daemon's host."""
    reason = (f"its workspace {workspace} is not reachable from daemon {daemon}: share "
              f"workspaces between the daemons (the same path on each), or resume the "
              f"session on the daemon that has it")
    owner = store.claim_owner(session_id)
    if store.session(session_id).state == AgentState.ERROR:
        return
    store.append(session_id, [StateChanged(
        source="environment", state=AgentState.ERROR, reason=reason,
        cause=Why.RUNTIME_MISCONFIGURED)], owner=owner)
    logger.error("cluster: session %s: %s", session_id, reason)
