"""What the Docker runtime and ``trouper runtime gc`` share: labels, the owner of a
trouper home, finding a session's container, its cause of death, and garbage collection.

The docker SDK is imported inside the functions only: ``import trouper`` never loads it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..exceptions import RuntimeUnavailable
from .misconfigured import docker_missing

logger = logging.getLogger(__name__)

LABEL_SESSION = "trouper.client.session"
LABEL_OWNER = "trouper.owner"
"""Which trouper home made the container: its containers are the only ones it touches."""
LABEL_EPOCH = "trouper.epoch"
LABEL_KEEP = "trouper.keep"
IO_MOUNT = "/.trouper"
"""Where the shell's input folder is mounted (read-only) inside every container."""
LOG_TAIL_LINES = 20
"""The last lines of a stopped container's log quoted in why it failed."""
LOG_SCAN_LINES = 1000
"""How far back the log is searched for the line that says what went wrong."""
LOG_CAUSE_LINES = 5
"""Error-looking lines from before the tail quoted too (a crash dump can push the cause out)."""
LOG_LINE_CHARS = 300
"""Longest line quoted; longer ones are cut."""
_CAUSE = re.compile(r"error|fatal|panic|traceback|exception|denied|not found|no such file|"
                    r"cannot|can't|failed|killed|segmentation fault|out of memory", re.I)


def owner_of(state_dir: Path) -> str:
    """The owner label of the trouper home a session's state folder belongs to
    (``<home>/sessions/<id>/runtime``): a hash of the home's path."""
    home = Path(state_dir).resolve().parents[2]
    return owner_of_home(home)


def owner_of_home(home: Path) -> str:
    """The owner label of the trouper home ``home``."""
    return hashlib.sha256(str(Path(home).resolve()).encode("utf-8")).hexdigest()[:16]


def docker_client(timeout_s: float = 60.0) -> Any:
    """A docker SDK client from the environment (``DOCKER_HOST`` or the local socket);
    RuntimeUnavailable when the SDK is missing or the engine does not answer."""
    try:
        import docker
    except ImportError as e:
        raise docker_missing("the docker Python SDK (pip install docker)") from e
    try:
        client = docker.from_env(timeout=max(1, int(timeout_s)))
        client.ping()
    except docker.errors.DockerException as e:
        raise RuntimeUnavailable(f"the Docker engine does not answer: {e}") from e
    return client


def list_containers(client: Any, labels: list[str]) -> list[Any]:
    """The containers (running or not) with all ``labels`` (``name=value`` or ``name``);
    one removed meanwhile is left out (the SDK's own list fails on it)."""
    from docker.errors import NotFound

    found = []
    for row in client.api.containers(all=True, filters={"label": labels}):
        try:
            found.append(client.containers.get(row["Id"]))
        except NotFound:
            continue
    return found


def find_container(client: Any, session_id: str, owner: str) -> Any:
    """The container of ``session_id`` made by ``owner`` (the newest, if several); None."""
    found = session_containers(client, session_id, owner)
    return found[0] if found else None


def session_containers(client: Any, session_id: str, owner: str) -> list[Any]:
    """Every container of ``session_id`` made by ``owner``, running or not, newest first."""
    found = list_containers(client, [f"{LABEL_SESSION}={session_id}", f"{LABEL_OWNER}={owner}"])
    found.sort(key=lambda c: c.attrs.get("Created", ""), reverse=True)
    return found


def container_failure(container: Any) -> str:
    """Why ``container`` does not run: its status, exit code, OOM kill, error and the last
    lines of its log."""
    state = container.attrs.get("State", {})
    parts = [f"status {state.get('Status', container.status)}",
             f"exit code {state.get('ExitCode')}"]
    if state.get("OOMKilled"):
        parts.append("killed by the kernel for lack of memory (OOMKilled)")
    if state.get("Error"):
        parts.append(f"error: {state['Error']}")
    try:
        log = container.logs(tail=LOG_SCAN_LINES).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - the log is a bonus; a removed container has none
        log = ""
    lines = [_cut(line) for line in log.strip().splitlines()]
    before, tail = lines[:-LOG_TAIL_LINES], lines[-LOG_TAIL_LINES:]
    causes = [line for line in before if _CAUSE.search(line)][:LOG_CAUSE_LINES]
    if causes:
        parts.append("earlier in its log:\n" + "\n".join(causes))
    if tail:
        parts.append("its log ends with:\n" + "\n".join(tail))
    return ", ".join(parts)


def _cut(line: str) -> str:
    return line if len(line) <= LOG_LINE_CHARS else line[:LOG_LINE_CHARS] + " [...]"


def gc_containers(
    home: Path, keep_session: Callable[[str], bool], client: Any = None
) -> list[str]:
    """Remove the containers of ``home``'s sessions for which ``keep_session(id)`` is
    False (finished, stopped, or gone from the store); only containers labelled with this
    home's owner, never one it did not label. One labelled ``trouper.keep`` is kept while
    its session exists. Returns the names of the removed containers."""
    client = client or docker_client()
    owner = owner_of_home(home)
    removed = []
    for container in list_containers(client, [f"{LABEL_OWNER}={owner}", LABEL_SESSION]):
        labels = container.labels or {}
        session_id = labels.get(LABEL_SESSION, "")
        if labels.get(LABEL_OWNER) != owner or not session_id:
            continue
        if keep_session(session_id):
            continue
        try:
            container.remove(force=True)
        except Exception as e:  # noqa: BLE001 - removed meanwhile, or the engine refused
            logger.warning("gc: cannot remove container %s of session %s: %s",
                           container.name, session_id, e)
            continue
        logger.info("gc: removed container %s of session %s", container.name, session_id)
        removed.append(str(container.name))
    return removed


def session_keeper(sessions: Iterable[tuple[str, str, bool]]) -> Callable[[str], bool]:
    """``keep_session`` for ``gc_containers`` from ``(session_id, state, keep)`` rows: a
    session's container is kept while the session exists and is not finished or stopped
    (or its config says keep)."""
    rows = {sid: (state, keep) for sid, state, keep in sessions}

    def keep_session(session_id: str) -> bool:
        if session_id not in rows:
            return False
        state, keep = rows[session_id]
        return keep or state not in ("finished", "stopped")

    return keep_session


def gc_sessions(home: Path, records: Iterable[Any], client: Any = None) -> list[str]:
    """``gc_containers`` for the sessions of a store (``SessionRecord``s): containers of
    sessions that are finished, stopped or not in the store are removed."""
    rows = [(r.session_id, r.state.value, bool(getattr(r.config.runtime, "keep", False)))
            for r in records]
    return gc_containers(home, session_keeper(rows), client)


def gc_at_start(home: Path, records: list[Any]) -> None:
    """At a Trouper's start: when any stored session ran in Docker, remove the containers
    of its ended or missing sessions. Never raises (an engine that does not answer is
    logged): the start goes on."""
    if not any(getattr(r.config.runtime, "kind", "") == "docker" for r in records):
        return
    try:
        removed = gc_sessions(home, records, docker_client(10.0))
    except Exception as e:  # noqa: BLE001 - a cleanup must never stop trouper from starting
        logger.warning("gc of the containers of ended sessions skipped: %s", e)
        return
    if removed:
        logger.info("removed %d container(s) of ended sessions: %s", len(removed),
                    ", ".join(removed))


CLOSE_SWEEP_S = 15.0
"""Longest a program's close waits for the sweep of its containers (an engine that does
not answer is left to the sweep's thread, and to the next start's gc)."""


def sweep_at_close(home: Path, sessions: dict[str, bool],
                   deadline_s: float = CLOSE_SWEEP_S) -> list[str]:
    """At a program's close, after its actors are down: remove every container left of
    ``sessions`` (session id -> its config's ``keep``) labelled with ``home``'s owner,
    whatever left it (a replace that could not remove a dead one, a close cut short, a
    session still working at close: it resumes later in a fresh container). A ``keep``
    session keeps its newest. Bounded by ``deadline_s`` and never raises; the names of the
    containers removed within it."""
    removed: list[str] = []

    def sweep() -> None:
        client = docker_client(deadline_s)
        owner = owner_of_home(home)
        seen: set[str] = set()
        for container in sorted(list_containers(client, [f"{LABEL_OWNER}={owner}"]),
                                key=lambda c: c.attrs.get("Created", ""), reverse=True):
            session_id = (container.labels or {}).get(LABEL_SESSION, "")
            if session_id not in sessions:
                continue
            if sessions[session_id] and session_id not in seen:
                seen.add(session_id)  # keep: its newest stays, while the session exists
                continue
            try:
                container.remove(force=True)
            except Exception as e:  # noqa: BLE001 - removed meanwhile, or refused: the rest go on
                logger.warning("cannot remove container %s of session %s: %s",
                               container.name, session_id, e)
                continue
            removed.append(str(container.name))

    def guarded() -> None:
        try:
            sweep()
        except Exception as e:  # noqa: BLE001 - a close goes on; the next start's gc remains
            logger.warning("the sweep of this program's containers at its close failed: %s", e)

    thread = threading.Thread(target=guarded, name="trouper-docker-sweep", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        logger.warning("the sweep of this program's containers did not end within %g s "
                       "(the Docker engine does not answer?); left to run on", deadline_s)
    elif removed:
        logger.info("removed %d container(s) left at close: %s", len(removed),
                    ", ".join(removed))
    return list(removed)
