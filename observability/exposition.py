"""The Prometheus text a program serves: the actor processes' samples summed from the
home's metrics folder, and what is read at scrape time (sessions by state from the store,
open streams, the daemon and its cluster).

Any program holding a ``Trouper`` may serve it: ``render(trouper.home.root,
[SessionStates(lambda: trouper.store)])`` is the whole text. The daemon serves it at
``GET /metrics`` (``daemon_route``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from ..core.states import AgentState
from . import folder

if TYPE_CHECKING:
    from ..cluster.member import Member

logger = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The text format's media type (prometheus-client's latest)."""


class Collector:
    """A scrape-time source of metric families (prometheus_client's collector protocol)."""

    def collect(self) -> Iterator[Metric]:  # pragma: no cover - each subclass has its own
        return iter(())

    def describe(self) -> list[Metric]:
        return []  # read at each scrape: nothing to check names against beforehand


class SessionStates(Collector):
    """``trouper_sessions{state}``: the sessions of the store in each state (every state
    listed, 0 included). ``store``: the store now (None or a TrouperError: left out)."""

    def __init__(self, store: Callable[[], Any]) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        try:
            records = self.store().sessions(replaced=True)  # every one kept
        except Exception as exc:  # noqa: BLE001 - the store's trouble: the rest is served
            logger.warning("metrics: sessions not counted: %s", exc)
            return
        counts = dict.fromkeys((s.value for s in AgentState), 0)
        for record in records:
            counts[AgentState(record.state).value] += 1
        family = GaugeMetricFamily("trouper_sessions", "Sessions in the store, by state "
                                   "(in a cluster: the whole cluster's).", labels=["state"])
        for state, n in counts.items():
            family.add_metric([state], n)
        yield family


class Streams(Collector):
    """``trouper_stream_clients``: the daemon's open event streams (SSE and WebSocket)."""

    def __init__(self, count: Callable[[], int]) -> None:
        self.count = count

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("trouper_stream_clients", "Open event streams (SSE and "
                                "WebSocket) of the daemon.", value=self.count())


class DaemonInfo(Collector):
    """``trouper_daemon_info``: 1, labelled with the daemon's name in its cluster ("" on
    its own) and trouper's version; in a cluster, each daemon's live sessions and
    whether it is alive, from the cluster's registry."""

    def __init__(self, member: Member | None) -> None:
        self.member = member
        try:
            self.version = metadata.version("trouper")
        except metadata.PackageNotFoundError:
            self.version = "unknown"

    def collect(self) -> Iterator[Metric]:
        name = self.member.name if self.member is not None else ""
        info = GaugeMetricFamily("trouper_daemon_info", "This daemon: its name in its "
                                 "cluster and trouper's version.",
                                 labels=["daemon", "cluster", "version"])
        info.add_metric([name, str(self.member is not None).lower(), self.version], 1)
        yield info
        if self.member is None:
            return
        try:
            daemons = self.member.daemons()
        except Exception as exc:  # noqa: BLE001 - the store's trouble: the rest is served
            logger.warning("metrics: the cluster's daemons not read: %s", exc)
            return
        sessions = GaugeMetricFamily("trouper_cluster_sessions", "Live sessions placed "
                                     "on each daemon of the cluster.", labels=["daemon"])
        up = GaugeMetricFamily("trouper_cluster_daemon_up", "1 for each daemon of the "
                               "cluster that is alive, else 0.", labels=["daemon"])
        for daemon in daemons:
            sessions.add_metric([daemon.name], daemon.sessions)
            up.add_metric([daemon.name], 1 if daemon.state == "alive" else 0)  # registry.ALIVE
        yield sessions
        yield up


def render(home: str | os.PathLike[str], collectors: Iterable[Collector] = ()) -> bytes:
    """The text format: the home's metrics folder summed (its dead processes' files
    merged first), then ``collectors``."""
    # the scrape-time sources (the store, a cluster's registry: slow when the database
    # is) are read outside the folder's lock, which an actor system's opening waits on
    scraped = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        scraped.register(collector)
    text = generate_latest(scraped)
    path = folder.folder_of(home)
    if not path.is_dir():
        return text
    counted = CollectorRegistry(auto_describe=False)
    with folder.locked(path):  # no file merged away while the collector reads it
        try:
            folder.compact(path)
        except OSError as exc:  # a full disk: the dead processes' files are summed as they are
            logger.warning("metrics folder %s not compacted: %s", path, exc)
        MultiProcessCollector(counted, path=str(path))
        return generate_latest(counted) + text


def daemon_route(service: Any, streams: Any, member: Member | None) -> Callable[..., Any]:
    """The daemon's ``GET /metrics`` handler (``daemon/app.py``): its Service (the
    ``Trouper``, the store), its Streams and its cluster membership."""
    from fastapi.responses import Response

    collectors = [SessionStates(lambda: service.store), Streams(lambda: streams.count),
                  DaemonInfo(member)]

    def metrics() -> Response:
        """Prometheus metrics in the text format (docs/operations.md, "Metrics")."""
        return Response(render(service.tree.home.root, collectors), media_type=CONTENT_TYPE)

    return metrics
