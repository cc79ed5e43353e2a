"""A daemon on a shared (PostgreSQL) store joins its cluster: its key, its name, its
capabilities, and what it does when it stops or finds itself fenced (``cluster/``).

Nothing here loads psycopg until a daemon is started on a ``postgresql://`` store.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError, RuntimeUnavailable, TrouperError
from ..home.paths import Home, write_private

if TYPE_CHECKING:
    from ..client.embedded import Trouper
    from ..cluster.member import Member

logger = logging.getLogger("trouper.daemon")

HEARTBEAT_S = 1.0
"""How often a daemon of a cluster says it lives (``--heartbeat``)."""
DEAD_AFTER_HEARTBEATS = 3
"""A daemon silent this many heartbeats is declared dead, its sessions taken over."""


@dataclass(frozen=True)
class ClusterOptions:
    """What ``trouper daemon start`` is told about its place in a cluster."""

    name: str | None = None
    """Unique in the cluster; default: this host's name and the home's folder name."""
    capabilities: tuple[str, ...] = ()
    """Declared besides those found (``local`` always, ``docker`` when an engine answers)."""
    labels: tuple[str, ...] = ()
    """``name=value`` pairs a create may ask for (``gpu=a100``)."""
    heartbeat_s: float = HEARTBEAT_S
    key_file: str | None = None
    """The cluster key's file (default ``$TROUPER_CLUSTER_KEY_FILE``, else the home's)."""
    detect: bool = field(default=True)
    """Find ``docker`` by asking the engine (off in tests that declare it)."""

    def argv(self) -> list[str]:
        """These options as ``trouper daemon run`` takes them."""
        out = [*(["--name", self.name] if self.name else []),
               "--heartbeat", str(self.heartbeat_s)]
        for capability in self.capabilities:
            out += ["--capability", capability]
        for label in self.labels:
            out += ["--label", label]
        if self.key_file:
            out += ["--cluster-key", self.key_file]
        if not self.detect:
            out.append("--no-detect")
        return out


def found_capabilities(detect: bool) -> list[str]:
    """What this host can run: ``local`` always, ``docker`` when its engine answers."""
    found = ["local"]
    if detect:
        from ..runtimes.docker_support import docker_client

        try:
            docker_client(2.0).close()
            found.append("docker")
        except RuntimeUnavailable as exc:
            logger.info("cluster: no docker capability: %s", exc)
    return found


def join(home: Home, store_url: str, options: ClusterOptions, url: str) -> Member:
    """This daemon's membership, joined; ConfigError when it may not join (another
    cluster's key, no key while the cluster has one, a name a live daemon elsewhere has)."""
    from ..cluster.key import ClusterKey, key_path
    from ..cluster.member import Member, default_name
    from ..cluster.registry import Registry
    from ..store import open_store

    for label in options.labels:
        if "=" not in label or label.startswith("="):
            raise ConfigError(f"--label {label!r}: a label is name=value", field="label")
    probe = open_store(store_url)
    try:
        first = not Registry(probe).has_cluster()  # type: ignore[arg-type]
    finally:
        probe.close()
    key = ClusterKey.load(key_path(home.root, options.key_file), create=first)
    capabilities = [*found_capabilities(options.detect), *options.capabilities,
                    *(f"label:{label}" for label in options.labels)]
    member = Member(store_url, key, home, name=options.name or default_name(home), url=url,
                    capabilities=capabilities, heartbeat_s=options.heartbeat_s,
                    dead_after_s=options.heartbeat_s * DEAD_AFTER_HEARTBEATS)
    try:
        member.join()
    except BaseException:
        member.close()
        raise
    return member


def use_cluster_token(token_path: Any, member: Member) -> str:
    """The cluster's token, written as this home's (so the home's clients use it)."""
    write_private(token_path, member.key.token + "\n")
    return member.key.token


class Fencing:
    """A fenced daemon's way back: its actors stop (so nothing it ran goes on beside the
    peers that took its sessions), and once the store answers a fresh tree opens for what
    is placed on it then. Meanwhile its routes answer that the daemon is closed."""

    def __init__(self, open_trouper: Callable[[], Trouper], service: Any, member: Member) -> None:
        self._open, self._service, self._member = open_trouper, service, member
        member.on_fenced, member.on_rejoin = self.fence, self.reopen

    def fence(self) -> None:
        with contextlib.suppress(TrouperError):
            self._service.tree.close(stop_sandboxes=False)

    def reopen(self) -> None:
        """A new tree, unless one is open (raises StoreError while the store is away)."""
        if not self._service.tree.closed:
            return
        fresh = self._open()
        self._service.tree = fresh
        self._member.restore = fresh.restore


def drain(member: Member, trouper: Trouper) -> None:
    """SIGTERM in a cluster: the sessions go to the peers, then the member leaves."""
    try:
        moved = member.drain(lambda: trouper.close(stop_sandboxes=False))
        for session_id, peer in sorted(moved.items()):
            logger.info("cluster: session %s handed to %s", session_id, peer)
    except TrouperError as exc:
        logger.error("cluster: the drain failed (%s); the peers take the sessions once "
                     "this daemon's heartbeat lapses", exc)
    finally:
        trouper.close(stop_sandboxes=False)
        member.close()
