"""A real daemon process for tests: started on loopback, killed or stopped on purpose,
always ended at the end.

    with running_daemon(tmp_path / "home") as d:
        client = d.client()                  # Trouper.connect() to it
        d.http().get("/v1/health")           # an httpx.Client with the token
        d.kill()                             # SIGKILL, as a crash would
        d.start()                            # again, on the same port
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from ..home.paths import Home
from ..security.tls import default_ssl_context
from .faults import wait_until


class TestDaemon:
    """One home's daemon process, as a test drives it."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    popen: Callable[..., Any] = subprocess.Popen
    """What starts the daemon process (``subprocess.Popen``'s arguments): a suite may set
    a faster starter here once (trouper's own sets its fork server's ``Popen``, from a
    pre-imported zygote), so that its daemons skip the imports."""

    def __init__(self, home: Path, port: int = 0, env: dict[str, str] | None = None,
                 popen: Callable[..., Any] | None = None, cluster: Any = None) -> None:
        """``cluster``: a ``ClusterOptions`` (its store is ``env``'s ``TROUPER_STORE``)."""
        from ..daemon.files import DaemonFiles

        self.home = Home.at(home)
        self.files = DaemonFiles(self.home)
        self.port = port
        self.env = dict(env or {})
        self._popen = popen or type(self).popen
        self.cluster = cluster
        self.info: dict[str, Any] = {}
        self._clients: list[Any] = []
        self._client: tuple[tuple[str, str], Any] | None = None

    @property
    def url(self) -> str:
        return str(self.info["url"])

    @property
    def pid(self) -> int:
        return int(self.info["pid"])

    @property
    def token(self) -> str:
        from ..daemon.files import read_token

        return read_token(self.files) or ""

    def start(self, timeout_s: float = 120.0) -> TestDaemon:
        """Start it (on the port it had, once it had one); returns once it answers."""
        from ..daemon.process import start

        with _environment(self.env):
            self.info = start(self.home, "127.0.0.1", self.port, timeout_s=timeout_s,
                              popen=self._popen, cluster=self.cluster)
        self.port = int(self.info["port"])
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """``trouper daemon stop``: SIGTERM, and wait until it is gone."""
        from ..daemon.process import stop

        stop(self.home, timeout_s)

    def kill(self) -> None:
        """SIGKILL the daemon process; wait until its lock is free and its actor system
        has ended (its admin watches the daemon's pid and ends its process group)."""
        from ..daemon.files import lock_is_held
        from ..host.processes import pid_alive

        admin = _admin_pid(self.home)
        os.kill(self.pid, signal.SIGKILL)
        wait_until(lambda: not lock_is_held(self.files), 30, "the killed daemon's lock")
        if admin is not None:
            wait_until(lambda: not pid_alive(admin), 30, "the killed daemon's actors")

    def running(self) -> bool:
        from ..daemon.files import lock_is_held

        return lock_is_held(self.files)

    def client(self) -> Any:
        """A ``RemoteTrouper`` of this daemon (closed with the daemon): the same one while
        the daemon's address and token stay, so a test that asks for one in a polled
        condition does not open a connection per poll (each keeps one, and the daemon
        answers 503 past 128 from one address)."""
        from ..client.daemon import RemoteTrouper

        key = (self.url, self.token)
        cached = self._client
        if cached is not None and cached[0] == key and not cached[1]._http.is_closed:
            return cached[1]
        client = RemoteTrouper(self.url, self.token)
        self._clients.append(client)
        self._client = (key, client)
        return client

    def http(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        """An httpx client of the daemon, sending ``token`` (default: the right one)."""
        headers = {"Authorization": f"Bearer {self.token if token is None else token}"}
        kwargs.setdefault("verify", default_ssl_context())
        client = httpx.Client(base_url=self.url, headers=headers,
                              timeout=kwargs.pop("timeout", 30.0), **kwargs)
        self._clients.append(client)
        return client

    def close(self) -> None:
        """Stop the daemon if it runs (kill it if it will not stop); close the clients."""
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        if self.running():
            try:
                self.stop(timeout_s=30)
            except Exception:  # noqa: BLE001 - a test's cleanup must end it anyway
                with contextlib.suppress(ProcessLookupError, KeyError, ValueError):
                    self.kill()
        self._stop_sandboxes()

    def _stop_sandboxes(self) -> None:
        """A stopped daemon leaves its sessions' sandbox servers running (so they resume);
        a test's end stops them, so nothing it started outlives it."""
        from ..runtimes.local import LocalSandbox

        for info in self.home.root.glob("sessions/*/runtime/server.json"):
            state_dir = info.parent
            session_dir = state_dir.parent
            with contextlib.suppress(Exception):
                LocalSandbox(session_dir.name, session_dir / "workspace", state_dir).stop()


def _admin_pid(home: Home) -> int | None:
    """The pid of the actor system's admin on ``home`` (``actors/admin.pid``), if any."""
    try:
        return int((home.root / "actors" / "admin.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def running_daemon(home: Path, port: int = 0, env: dict[str, str] | None = None,
                   popen: Callable[..., Any] | None = None, cluster: Any = None
                   ) -> Iterator[TestDaemon]:
    """A started ``TestDaemon``, stopped (or killed) at the end, whatever happened."""
    daemon = TestDaemon(home, port, env, popen, cluster)
    try:
        yield daemon.start()
    finally:
        daemon.close()


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
