"""Start, stop and ask after the daemon process of a home (``trouper daemon ...``).

``start`` runs ``python -m trouper daemon run`` detached (its own session, stdin from
/dev/null, stdout and stderr appended to ``<home>/logs/daemon.log``) and returns once the
daemon answers ``/v1/health`` with the home's token, or raises DaemonError with the
reason it gave (the port in use, a daemon already running, a refused setting) on a pipe
it was handed. The token never goes on a command line or into a log: the daemon reads
it from the home. ``stop`` sends SIGTERM and waits until the home's lock is free.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..home.paths import Home, private_file
from ..security.tls import default_ssl_context
from .cluster_setup import ClusterOptions
from .files import DaemonFiles, lock_is_held, read_token, running_info
from .server import DaemonError

START_TIMEOUT_S = 120.0


def start(home: Home, host: str = "127.0.0.1", port: int = 0,
          timeout_s: float = START_TIMEOUT_S, debug: bool = False,
          popen: Callable[..., Any] = subprocess.Popen,
          cluster: ClusterOptions | None = None) -> dict[str, Any]:
    """Start the home's daemon; return its info (url, pid, port...). Raises DaemonError.

    The store is this process's ``$TROUPER_STORE`` (inherited; never on the command line,
    a URL may hold a password); ``cluster``: its place in the cluster on a shared store.

    ``popen`` starts the process (``subprocess.Popen``'s arguments; a test harness may
    pass its own, as trouper's suite passes its fork server's, ``tests/accel/``)."""
    files = DaemonFiles(home)
    info = running_info(files)
    if info is not None:
        raise DaemonError(f"a daemon already runs for {home.root} (pid {info.get('pid')}, "
                          f"{info.get('url')})")
    log = private_file(files.log)
    read_end, write_end = os.pipe()
    command = [sys.executable, "-m", "trouper", *(["--debug"] if debug else []), "daemon",
               "run", "--home", str(home.root), "--host", host, "--port", str(port),
               "--ready-fd", str(write_end), *(cluster.argv() if cluster else [])]
    try:
        with open(log, "ab") as out:
            proc = popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    pass_fds=(write_end,), start_new_session=True,
                                    cwd=home.root)  # never pins the caller's folder
    finally:
        os.close(write_end)
    threading.Thread(target=proc.wait, daemon=True).start()  # no zombie in a long caller
    try:
        message = _read_ready(read_end, proc, timeout_s)
    finally:
        os.close(read_end)
    if message is None:
        code = proc.poll()
        why = (f"exited with code {code}" if code is not None
               else f"did not answer within {timeout_s:g} s")
        raise DaemonError(f"the daemon {why}; its log: {files.log}{_tail(files)}")
    if "error" in message:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)  # a start that failed leaves nothing running
        raise DaemonError(str(message["error"]))
    health(message["url"], read_token(files) or "", timeout_s=10.0)
    return message


def _read_ready(fd: int, proc: Any, timeout_s: float
                ) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        readable, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:  # the daemon closed the pipe (exited) without a word
            return None
        data += chunk
    try:
        message = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _tail(files: DaemonFiles, lines: int = 5) -> str:
    try:
        last = files.log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"\n  {line}" for line in last)


def health(url: str, token: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """``GET /v1/health``; raises DaemonError when it does not answer 200 in time."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            answer = httpx.get(f"{url}/v1/health", timeout=5.0, trust_env=False,
                               verify=default_ssl_context(),
                               headers={"Authorization": f"Bearer {token}"})
            if answer.status_code == 200:
                return answer.json()  # type: ignore[no-any-return]
            last = f"HTTP {answer.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        if time.monotonic() >= deadline:
            raise DaemonError(f"the daemon at {url} does not answer ({last})")
        time.sleep(0.1)  # a poll interval: the condition is the answer above


def stop(home: Home, timeout_s: float = 60.0) -> dict[str, Any] | None:
    """SIGTERM the home's daemon and wait until it is gone; its info, or None when none
    ran. Sessions stay as they are (resumable); sandboxes are left running."""
    files = DaemonFiles(home)
    if not lock_is_held(files):
        return None
    info = running_info(files) or {}
    pid = int(info.get("pid") or _pid_file(files) or 0)
    if pid <= 0:
        raise DaemonError(f"a daemon holds {files.lock} but published no pid yet; try again")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout_s
    while lock_is_held(files):
        if time.monotonic() >= deadline:
            raise DaemonError(f"the daemon (pid {pid}) did not stop within {timeout_s:g} s; "
                              f"its log: {files.log}")
        time.sleep(0.05)  # a poll interval: the condition is the lock above
    return info or {"pid": pid}


def _pid_file(files: DaemonFiles) -> int | None:
    try:
        return int(files.pid.read_text().strip())
    except (OSError, ValueError):
        return None


def status(home: Home) -> dict[str, Any] | None:
    """The running daemon's info and health, or None when none runs for the home."""
    files = DaemonFiles(home)
    info = running_info(files)
    if info is None:
        return None
    token = read_token(files) or ""
    try:
        info["health"] = health(info["url"], token, timeout_s=2.0)
    except DaemonError as exc:
        info["health"] = {"ok": False, "error": str(exc)}
    if info.get("cluster") and info["health"].get("ok"):
        info["daemons"] = _cluster_view(info["url"], token)
    return info


def _cluster_view(url: str, token: str) -> list[dict[str, Any]]:
    """``GET /v1/cluster``'s daemons (empty when it does not answer)."""
    import httpx

    try:
        answer = httpx.get(f"{url}/v1/cluster", timeout=5.0, trust_env=False,
                           verify=default_ssl_context(),
                           headers={"Authorization": f"Bearer {token}"})
        return list(answer.json().get("daemons", [])) if answer.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return []
