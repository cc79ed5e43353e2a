"""``LocalSandbox``: the session's shell in a detached sandbox server on this machine.

The server (the ``sandbox`` package next to this file) runs in its own session, so it
outlives the actor that started it: a restarted proxy finds it through
``<state_dir>/server.json``, attaches, claims a newer epoch and resolves in-flight
actions from its journal. A server nobody talks to exits after ``idle_timeout_s``.

The state folder is owner-only (0700; server.log and everything the server writes
0600). The secrets among ``env`` are named to the server (``--secret-env NAME``: names
in argv, values only in its environment), which masks them in all it writes. The shell
runs with the umask of the program that started trouper (``shell_umask``).

    sandbox = LocalSandbox("s1", Path("/tmp/ws"), Path("/tmp/rt"), env={"MY_TOKEN": "x"})
    attached = sandbox.start()  # claims the next epoch the server counts
    outcome = sandbox.runtime.execute("a1", RunCommand(command="pwd"), timeout_s=60,
                                      no_output_timeout_s=10)
    sandbox.stop()
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config.settings import settings
from ..exceptions import RuntimeUnavailable, StaleEpoch
from ..home.paths import creator_umask, private_dir
from ..host.processes import (
    children_of,
    end_processes,
    is_bash,
    lock_holder,
    pid_alive,
    process_group,
    process_name,
    session_members,
    signal_quietly,
)
from ..messages.causes import RuntimeFailure
from .base import SandboxHealth
from .launch import Launched, launch_server, server_log_env
from .misconfigured import prepare_workspace
from .sandbox import EXIT_LOCKED
from .sandbox_client import SandboxClient
from .shell_confinement import confinement_args, unconfined_warning

logger = logging.getLogger(__name__)

PASSED_ENV = tuple("PATH HOME USER LOGNAME SHELL LANG LC_ALL LC_CTYPE TZ TMPDIR".split())
"""Variables of this process the shell inherits; everything else comes from ``env``."""


class LocalSandbox:
    """A persistent shell in ``workspace``, served by a detached process on loopback."""

    def __init__(
        self,
        session_id: str,
        workspace: Path,
        state_dir: Path,
        env: dict[str, str] | None = None,
        max_output_chars: int = 10_000,
        idle_timeout_s: float | None = None,
        *,
        start_timeout_s: float = 15.0,
        interrupt_grace_s: float = 2.0,
        secret_names: tuple[str, ...] | None = None,
        shell_umask: int | None = None,
        config: Any = None,
    ) -> None:
        self.session_id = session_id
        self.config = config
        """The runtime's config (``LocalRuntime``; None: its defaults)."""
        self.workspace = Path(workspace).resolve()
        self.state_dir = Path(state_dir).resolve()
        self.env = dict(env or {})
        """Extra environment for the shell (the session's secrets among them)."""
        self.secret_names = tuple(self.env) if secret_names is None else tuple(secret_names)
        """Names of the variables of ``env`` whose values the server masks in everything
        it writes; ``None`` (the default) means every one of ``env``."""
        self.shell_umask = creator_umask() if shell_umask is None else shell_umask
        """The umask of the agent's shell; default: the program's that started trouper."""
        self.max_output_chars = max_output_chars
        self.idle_timeout_s = (settings().sandbox_idle_timeout_s if idle_timeout_s is None
                               else idle_timeout_s)
        self.start_timeout_s = start_timeout_s
        self.interrupt_grace_s = interrupt_grace_s
        self._client: SandboxClient | None = None
        self._info: dict[str, Any] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._spawned: int | None = None
        """The pid of the server this object last started (forked or started afresh)."""
        self.progress: Callable[[str, str], None] | None = None
        """Told of what a start has to say (``progress(phase, detail)``): for this backend,
        a confinement that could not be applied; the RuntimeProxy sets it."""
        self._epoch: int | None = None
        """The epoch of the last ``start``; ``stop`` sends it, so a stale proxy cannot stop
        a sandbox a newer one claimed. ``None`` (never started) stops whatever runs."""

    @property
    def info_path(self) -> Path:
        """``server.json``: where a live server says how to reach it."""
        return self.state_dir / "server.json"

    # ---- Sandbox ----

    @property
    def epoch(self) -> int | None:
        """The epoch this object claimed at its last ``start``; None before one."""
        return self._epoch

    def start(self, epoch: int | None = None) -> bool:
        """Attach to the live server or start one; claim ``epoch``, or (None) the next one
        the server counts, which no clock can make go back. True when attached."""
        self._epoch = epoch  # a refused claim must not leave this object stopping others
        prepare_workspace(self.workspace)
        private_dir(self.state_dir)
        os.chmod(self.state_dir, 0o700)  # made by someone else, or before this was so
        self._close_client()
        info = self._live_server()
        attached = info is not None
        if info is None:
            info, attached = self._spawn(epoch or 0)
        client = self._client_for(info, epoch)
        try:
            self._epoch = client.claim()
        except RuntimeUnavailable:
            client.close()
            raise
        self._client, self._info = client, info
        logger.info("session %s: sandbox %s pid %s on port %s (epoch %d)", self.session_id,
                    "attached" if attached else "started", info["pid"], info["port"], self._epoch)
        line = None if attached else unconfined_warning(self.config, info.get("confinement"))
        if line is not None:
            logger.warning("session %s: %s", self.session_id, line)
            if self.progress is not None:
                self.progress("confinement", line)
        return attached

    def running(self) -> bool:
        """Whether a server for this session runs (from its ``server.json``; no request)."""
        return self.server_pid() is not None

    def kill(self) -> int | None:
        """Crash the sandbox the hard way, for fault injection: SIGKILL its server, its
        shell and the shell's jobs (what ran in it is lost). The server's pid, or None
        when none runs."""
        pid = self.server_pid()
        if pid is None:
            return None
        children = sorted({g for g in map(process_group, children_of(pid)) if g is not None})
        # the server first: dead, it cannot see its shell die and journal an outcome
        for group in [g for g in [process_group(pid), *children] if g not in (None, os.getpgid(0))]:
            try:
                os.killpg(group, signal.SIGKILL)  # type: ignore[arg-type]
            except ProcessLookupError:
                pass
        return pid

    def server_pid(self) -> int | None:
        """The pid of this session's live server, from its ``server.json``; else None."""
        info = _read_json(self.info_path)
        pid = int(info.get("pid", 0)) if info else 0
        return pid if pid and pid_alive(pid) else None

    @property
    def runtime(self) -> SandboxClient:
        """The action runtime of the started sandbox."""
        if self._client is None:
            raise RuntimeUnavailable(f"session {self.session_id}: the sandbox is not started")
        return self._client

    def alive(self) -> SandboxHealth:
        """Whether the server still runs and answers."""
        client, info = self._client, self._info
        if client is None or info is None:
            return SandboxHealth(alive=False, cause=RuntimeFailure.NOT_STARTED,
                                 detail="start() was not called")
        pid = int(info["pid"])
        if not self.pid_alive(pid):
            return SandboxHealth(alive=False, cause=RuntimeFailure.EXITED,
                                 detail=self._exit_detail(pid))
        try:
            answer = client.alive()
        except RuntimeUnavailable as e:
            return SandboxHealth(alive=False, cause=RuntimeFailure.UNREACHABLE, detail=str(e))
        if client.epoch is not None and int(answer.get("epoch", 0)) > client.epoch:
            detail = f"claimed by epoch {answer['epoch']} (this proxy has {client.epoch})"
            return SandboxHealth(alive=False, cause=RuntimeFailure.SUPERSEDED, detail=detail)
        return SandboxHealth(alive=True)

    def stop(self) -> None:
        """Shut the server and its shell down (idempotent, bounded to a few seconds).

        A server claimed by a newer epoch is left alone: it belongs to another proxy.
        """
        info = self._info or self._live_server(ping=False)
        client = self._client or (self._client_for(info, self._epoch) if info else None)
        self._client, self._info = None, None
        if info is None or client is None:
            return
        pid = int(info["pid"])
        shell_pid, shell = None, {}
        try:
            shell_pid = client.alive().get("shell_pid")
            shell = session_members(int(shell_pid)) if shell_pid else {}  # its jobs too
            client.shutdown()
        except StaleEpoch:
            logger.warning(
                "session %s: sandbox pid %d belongs to a newer epoch; left running",
                self.session_id,
                pid,
            )
            return
        except RuntimeUnavailable as e:
            logger.info(
                "session %s: sandbox pid %d did not take a shutdown: %s", self.session_id, pid, e
            )
        finally:
            client.close()
        if not self._wait_exit(pid, 3.0):
            self._kill_server(pid, shell_pid)
        end_processes(shell, 2.0)  # the server killed them: gone before this returns
        self._forget_info(pid)

    # ---- finding, starting, killing ----

    def _live_server(self, ping: bool = True) -> dict[str, Any] | None:
        """The ``server.json`` of a server that runs (and answers, when ``ping``). An
        answer carrying the file's ``boot_id`` (asked with the file's token) is proof
        enough of which server it is; the folder's lock (``_is_our_server``) is read only
        where that proof is missing: without a ping, and before killing one that does not
        answer (its pid may have been reused). Reading ``/proc/locks`` after a quiet spell
        takes this kernel 8-15 ms, which a proxy restart otherwise waited for. The ping
        never gives away a live token: each server boot makes its own, and a live server
        holds the port its file names."""
        info = _read_json(self.info_path)
        if info is None or not self.pid_alive(int(info.get("pid", 0))):
            return None
        pid = int(info["pid"])
        if not ping:
            return info if self._is_our_server(pid) else None
        client = self._client_for(info, None)
        try:
            answer = client.alive(timeout_s=3.0)
        except RuntimeUnavailable as e:
            if self._is_our_server(pid):
                logger.warning("session %s: sandbox pid %s does not answer (%s); killing it",
                               self.session_id, pid, e)
                self._kill_server(pid, None)
            return None
        finally:
            client.close()
        return info if answer.get("boot_id") == info.get("boot_id") else None

    def _spawn(self, epoch: int) -> tuple[dict[str, Any], bool]:
        """Start a server; returns its info, or a live one's (attached) if it won a race."""
        options = {
            "--state-dir": self.state_dir,
            "--workspace": self.workspace,
            "--idle-timeout-s": self.idle_timeout_s,
            "--max-output-chars": self.max_output_chars,
            "--interrupt-grace-s": self.interrupt_grace_s,
            "--epoch": epoch,
            "--shell-umask": f"{self.shell_umask:03o}",
        }
        args = [str(part) for option in options.items() for part in option]
        args += self._server_args()
        deadline = time.monotonic() + self.start_timeout_s
        launched = self._launch(args)
        try:
            while time.monotonic() < deadline:
                info = _read_json(self.info_path)
                if info is not None and info.get("pid") == launched.pid:
                    return info, False
                code = launched.exit_code()
                if code == EXIT_LOCKED:  # another server holds the folder: attach to it...
                    other = self._live_server()
                    if other is not None:
                        return other, True
                    # ...or, when it let go without a server.json (a killed one that was
                    # still exiting), start again; else it is starting: wait for its file
                    if lock_holder(self.state_dir / "server.lock") is None:
                        launched.close()
                        launched = self._launch(args)
                elif code is not None:
                    raise RuntimeUnavailable(self._start_failure(launched.describe(code)))
                time.sleep(0.005)
            self._kill_server(launched.pid, None)
        finally:
            launched.close()
        what = f"wrote no server.json within {self.start_timeout_s:g} s"
        raise RuntimeUnavailable(self._start_failure(what))

    def _launch(self, args: list[str]) -> Launched:
        launched = launch_server(args, self._server_env(), self.state_dir)
        self._proc, self._spawned = launched.proc, launched.pid
        return launched

    def _server_args(self) -> list[str]:
        """More options of the server's command line (the secrets' names, the shell's
        confinement; a backend that runs the shell elsewhere adds where)."""
        args = [part for name in self.secret_names for part in ("--secret-env", name)]
        return args + confinement_args(self.config, self.state_dir)

    def _start_failure(self, what: str) -> str:
        tail = _tail(self.state_dir / "server.log", 2000)
        return (
            f"session {self.session_id}: the sandbox server {what}; server.log ends with:\n{tail}"
        )

    def _server_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.setdefault("PATH", os.defpath)
        env.update(server_log_env(self.session_id))
        env.update(self.env)
        return env

    def _client_for(self, info: dict[str, Any], epoch: int | None) -> SandboxClient:
        return SandboxClient(
            str(info.get("host", "127.0.0.1")), int(info["port"]), str(info["token"]), epoch
        )

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client, self._info = None, None

    def pid_alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            # poll() answers None while another thread holds the Popen's wait lock, so a
            # zombie or a reaped server could pass for alive: ask the kernel as well.
            return self._proc.poll() is None and pid_alive(pid)
        return pid_alive(pid)

    def _exit_detail(self, pid: int) -> str:
        code = self._proc.poll() if self._proc is not None and self._proc.pid == pid else None
        status = f" with status {code}" if code is not None else ""
        return f"sandbox server pid {pid} exited{status}"

    def _is_our_server(self, pid: int) -> bool:
        """True when ``pid`` runs a sandbox server on this state folder: it holds the
        folder's lock (a forked server's argv is its zygote's); before any server holds
        it, the server this object started (by pid and name) or, started afresh, a
        process whose argv names the folder."""
        holder = lock_holder(self.state_dir / "server.lock")
        if holder is not None:
            return holder == pid
        if pid == self._spawned and process_name(pid) == "trouper-sandbox":
            return True
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            return not Path("/proc/self").exists()
        except OSError:
            return False
        return b"--state-dir" in argv and os.fsencode(str(self.state_dir)) in argv

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def _kill_server(self, pid: int, shell_pid: int | None) -> None:
        if self.pid_alive(pid) and self._is_our_server(pid):
            logger.warning("session %s: killing sandbox pid %d", self.session_id, pid)
            signal_quietly(pid, signal.SIGKILL)
        if shell_pid and is_bash(int(shell_pid)):  # bash leads its own process group
            signal_quietly(-int(shell_pid), signal.SIGKILL)
        self._wait_exit(pid, 2.0)

    def _forget_info(self, pid: int) -> None:
        info = _read_json(self.info_path)
        if info is not None and info.get("pid") == pid and not self.pid_alive(pid):
            self.info_path.unlink(missing_ok=True)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError as e:
        return f"(cannot read {path}: {e})"
