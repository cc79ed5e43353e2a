"""What a lost daemon leaves of a session that another daemon takes over: its Docker
containers, on an engine the new daemon shares. They are labelled with the old daemon's
home (``docker_support.owner_of_home``); the new daemon removes them before it starts the
session's own, so a container of the dead host never runs beside the new one (nor lives
on, since no daemon of that home may ever start again to sweep it).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..exceptions import RuntimeUnavailable

logger = logging.getLogger(__name__)


def remove_containers(session_id: str, old_home: str) -> list[str]:
    """Remove the session's containers made under ``old_home``; their names (none when
    this host's engine does not answer or has none)."""
    from ..runtimes.docker_support import docker_client, owner_of_home, session_containers

    try:
        client = docker_client(10.0)
    except RuntimeUnavailable as exc:
        logger.info("cluster: session %s: no engine to look for its old containers: %s",
                    session_id, exc)
        return []
    removed = []
    try:
        for container in session_containers(client, session_id,
                                            owner_of_home(Path(old_home))):
            try:
                container.remove(force=True)
                removed.append(container.name)
            except Exception as exc:  # noqa: BLE001 - one that went meanwhile is fine
                logger.info("cluster: container %s: %s", container.name, exc)
    finally:
        client.close()
    if removed:
        logger.info("cluster: session %s: removed the containers its lost daemon left: %s",
                    session_id, ", ".join(removed))
    return removed
