"""The sandboxes a runtime server hosts, by session id: one ``Service`` each, in-process.

Each session has ``<workdir>/<session id>/`` (0700) holding ``workspace/`` (the agent's
folder, where its shell starts) and ``state/`` (the journal, the claimed epoch, and
``shell.json``: which bash this server boot started, so the next boot can kill what a
SIGKILLed one left behind). The journal is the sandbox package's, on disk: a server
killed and started again answers ``finished`` for what finished and ``unknown`` for what
was running (a new boot id), and never runs an action id twice.

A session's sandbox starts on its first ``start`` (which claims an epoch) and runs until
it is stopped, crashed on purpose (``crash``: fault injection), idle for
``idle_timeout_s``, or the server exits. Its journal and epoch outlive all of those.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...host.processes import start_time
from ..sandbox.checkpoints import Checkpoints
from ..sandbox.journal import Journal
from ..sandbox.mask import TextMasker
from ..sandbox.service import BadRequest, Service
from ..sandbox.shell_policy import ShellConfinement
from ..sandbox.util import private_dir, read_json, write_json_atomic
from .shell_rules import ShellRules

logger = logging.getLogger(__name__)

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
"""What a session id may be: it names a folder under the workdir."""
PASSED_ENV = tuple("PATH HOME USER LOGNAME SHELL LANG LC_ALL LC_CTYPE TZ TMPDIR".split())
"""Variables of the server's environment a session's shell inherits; the rest comes from
the start request (the session's secrets)."""
SHELL_ENV = {"TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat", "HISTFILE": "/dev/null"}
TOKEN_NAME = "TROUPER_RUNTIME_TOKEN"
"""The placeholder of the server's own token in what a sandbox writes (a command that
prints the token file shows ``<secret:TROUPER_RUNTIME_TOKEN>``)."""


class NotRunning(Exception):
    """The session's sandbox does not run on this server (never started, stopped, crashed,
    or the server restarted since): start it again."""


class FencedJournal(Journal):
    """A journal that stops taking outcomes once its sandbox was crashed on purpose: what
    ran in a crashed sandbox is lost, so the next boot must read it ``unknown``."""

    def __init__(self, root: str, boot_id: str) -> None:
        super().__init__(root, boot_id)
        self.dead = False

    def kill(self) -> None:
        """Take no more outcomes, and wake every waiter."""
        with self._cond:
            self.dead = True
            self._cond.notify_all()

    def finish(self, action_id: str, outcome: dict[str, Any]) -> None:
        if not self.dead:
            super().finish(action_id, outcome)

    def fenced(self) -> bool:
        return self.dead


class Hosted:
    """One session's running sandbox."""

    def __init__(self, session_id: str, service: Service, journal: FencedJournal,
                 confined: ShellConfinement) -> None:
        self.session_id = session_id
        self.service = service
        self.journal = journal
        self.confined = confined
        """The shell's confinement (its rule set and private temporary folder go with the
        sandbox)."""
        self.last_used = time.monotonic()
        self.busy = 0
        """Requests in progress (a long-poll keeps the sandbox from idling out)."""
        self._busy_lock = threading.Lock()

    def enter(self) -> None:
        """A request on this sandbox began."""
        with self._busy_lock:
            self.busy += 1

    def leave(self) -> None:
        """A request on this sandbox ended."""
        with self._busy_lock:
            self.busy -= 1
            self.last_used = time.monotonic()

    @property
    def dead(self) -> bool:
        return self.journal.dead

    def close(self) -> None:
        """Kill the shell and its jobs; remove the shell's private temporary folder."""
        self.service.close()
        self.confined.close()

    def health(self) -> dict[str, Any]:
        return {"running": not self.dead, "epoch": self.service.epoch,
                "boot_id": self.journal.boot_id, "shell_pid": self.service.shell.pid}


class Sessions:
    """The registry: starts, finds, stops and crashes sessions' sandboxes."""

    def __init__(self, workdir: Path, server_token: str = "", *, shell_umask: int = 0o022,
                 idle_timeout_s: float = 0.0, max_output_chars: int = 10_000,
                 shells: ShellRules | None = None) -> None:
        self.workdir = Path(workdir).resolve()
        self.shells = shells or ShellRules()
        """How the sessions' shells are confined (and whom they run as, when root)."""
        self.boot_id = secrets.token_hex(8)
        self.server_token = server_token
        self.shell_umask = shell_umask
        self.idle_timeout_s = idle_timeout_s
        """Close a session's shell after this long without a request; 0 never does."""
        self.max_output_chars = max_output_chars
        self._lock = threading.Lock()
        self._starting: dict[str, threading.Lock] = {}
        self._hosted: dict[str, Hosted] = {}
        self._stopping = threading.Event()
        private_dir(str(self.workdir))

    # ---- paths ----

    def session_dir(self, session_id: str) -> Path:
        if not isinstance(session_id, str) or not SESSION_ID.match(session_id):
            raise BadRequest("a session id is 1-128 letters, digits, '.', '_' or '-', "
                             "starting with a letter or digit")
        return self.workdir / session_id

    def workspace(self, session_id: str) -> Path:
        return self.session_dir(session_id) / "workspace"

    # ---- lifecycle ----

    def start(self, session_id: str, epoch: Any, env: Mapping[str, str],
              secret_names: list[str], max_output_chars: int | None) -> dict[str, Any]:
        """Start the session's sandbox unless it runs; claim ``epoch`` (or ``"next"``)."""
        folder = self.session_dir(session_id)
        with self._lock:
            gate = self._starting.setdefault(session_id, threading.Lock())
        with gate:
            hosted = self._alive(session_id)
            attached = hosted is not None
            if hosted is None:
                hosted = self._boot(session_id, folder, env, secret_names, max_output_chars)
            claimed = hosted.service.claim(epoch)
            hosted.last_used = time.monotonic()
        logger.info("session %s: sandbox %s, epoch %d", session_id,
                    "attached" if attached else "started", claimed)
        return {**hosted.health(), "attached": attached, "epoch": claimed,
                "workspace": str(folder / "workspace")}

    def restore(self, session_id: str, from_session: str, checkpoint: Any) -> dict[str, Any]:
        """Write checkpoint ``checkpoint`` of ``from_session`` as the workspace of
        ``session_id``, a session not started yet (a fork: docs/time-travel.md); what the
        checkpoint left out, per path. NotRunning for an unknown checkpoint."""
        if not isinstance(checkpoint, str) or not checkpoint or len(checkpoint) > 200:
            raise BadRequest("checkpoint must be a checkpoint's name")
        source, target = self.session_dir(from_session), self.session_dir(session_id)
        store = Checkpoints(str(source / "state" / "checkpoints"), str(source / "workspace"))
        if store.manifest(checkpoint) is None:
            raise NotRunning(f"session {from_session} has no checkpoint {checkpoint!r}")
        with self._lock:
            gate = self._starting.setdefault(session_id, threading.Lock())
        # the session's start gate, not the server's lock: a long copy holds up no other
        # session, and no start of this one runs meanwhile
        with gate:
            if self._alive(session_id) is not None:
                raise BadRequest(f"session {session_id} has started: a checkpoint is "
                                 "restored before its sandbox starts")
            private_dir(str(target))
            workspace = target / "workspace"
            if workspace.exists() and any(workspace.iterdir()):
                raise BadRequest(f"session {session_id}'s workspace is not empty")
            building = target / f"workspace.restoring-{os.getpid()}"
            shutil.rmtree(building, ignore_errors=True)  # a restore cut short before
            skipped = store.restore(checkpoint, str(building))
            os.chmod(building, 0o777 & ~self.shell_umask)
            if workspace.exists():
                workspace.rmdir()  # empty, checked above
            os.rename(building, workspace)  # whole, or not there: a retry can go on
        return {"restored": checkpoint, "skipped": skipped}

    def get(self, session_id: str) -> Hosted:
        """The running sandbox of ``session_id``; NotRunning if none."""
        self.session_dir(session_id)
        hosted = self._alive(session_id)
        if hosted is None:
            raise NotRunning(f"session {session_id}: no sandbox runs on this server (it was "
                             "never started, was stopped or crashed, or the server restarted)")
        hosted.last_used = time.monotonic()
        return hosted

    def health(self, session_id: str) -> dict[str, Any]:
        """The session's sandbox as a health answer (``running`` False when none runs)."""
        self.session_dir(session_id)
        hosted = self._alive(session_id)
        if hosted is not None:
            return hosted.health()
        stored = read_json(str(self.session_dir(session_id) / "state" / "epoch.json")) or {}
        return {"running": False, "epoch": int(stored.get("epoch", 0)), "boot_id": None,
                "shell_pid": None}

    def stop(self, session_id: str, epoch: Any) -> bool:
        """Stop the sandbox (its shell and jobs); its journal stays. False if none ran."""
        hosted = self._alive(session_id)
        if hosted is None:
            return False
        hosted.service.check_epoch(epoch)
        self._drop(hosted)
        hosted.close()
        _forget_shell(self.session_dir(session_id) / "state")
        logger.info("session %s: sandbox stopped", session_id)
        return True

    def crash(self, session_id: str) -> int | None:
        """Fault injection: SIGKILL the session's shell and its jobs, and drop the sandbox
        as a crash would (what was running is never journaled as finished: it reads
        ``unknown`` once the sandbox starts again). The killed shell's pid, or None."""
        hosted = self._alive(session_id)
        if hosted is None:
            return None
        pid = hosted.service.shell.pid
        hosted.journal.kill()
        self._drop(hosted)
        hosted.close()
        _forget_shell(self.session_dir(session_id) / "state")
        logger.warning("session %s: sandbox crashed on request (shell pid %d)", session_id, pid)
        return pid

    def close(self) -> None:
        """Stop every sandbox (the server is exiting)."""
        self._stopping.set()
        with self._lock:
            hosted, self._hosted = list(self._hosted.values()), {}
        for one in hosted:
            one.close()
            _forget_shell(self.session_dir(one.session_id) / "state")

    def count(self) -> int:
        with self._lock:
            return len(self._hosted)

    # ---- leftovers and idling ----

    def kill_leftovers(self) -> list[int]:
        """Kill the shells (and their jobs) a previous boot of this server left running:
        a SIGKILLed server cannot close them. Their pids."""
        killed = []
        for state in sorted(self.workdir.glob("*/state")):
            info = read_json(str(state / "shell.json")) or {}
            pid, started = int(info.get("pid") or 0), info.get("start_time")
            now = start_time(pid) if pid else None
            # bash may have died (its pty closed) while jobs that ignore SIGHUP live on in
            # its session: that session id is still its pid, and no other can take it
            # while the pid is free
            if pid and (now is None or now == started) and _kill_session(pid):
                logger.warning("killed the shell session %d an earlier server boot left", pid)
                killed.append(pid)
            _forget_shell(state)
        return killed

    def watch_idle(self) -> None:
        """Close shells idle for ``idle_timeout_s`` (run in a thread; returns on close)."""
        if self.idle_timeout_s <= 0:
            return
        period_s = max(0.05, min(30.0, self.idle_timeout_s / 4))
        while not self._stopping.wait(period_s):
            now = time.monotonic()
            with self._lock:
                idle = [h for h in self._hosted.values()
                        if not h.busy and now - h.last_used >= self.idle_timeout_s]
            for hosted in idle:
                logger.info("session %s: idle for %.0f s, closing its shell",
                            hosted.session_id, self.idle_timeout_s)
                self.stop(hosted.session_id, None)

    # ---- inside ----

    def _alive(self, session_id: str) -> Hosted | None:
        with self._lock:
            hosted = self._hosted.get(session_id)
        return hosted if hosted is not None and not hosted.dead else None

    def _drop(self, hosted: Hosted) -> None:
        with self._lock:
            if self._hosted.get(hosted.session_id) is hosted:
                del self._hosted[hosted.session_id]

    def _boot(self, session_id: str, folder: Path, env: Mapping[str, str],
              secret_names: list[str], max_output_chars: int | None) -> Hosted:
        if self._stopping.is_set():
            raise NotRunning("the runtime server is shutting down")
        private_dir(str(folder))
        state, workspace = folder / "state", folder / "workspace"
        private_dir(str(state))
        if not workspace.is_dir():  # the agent's folder: the modes its shell would give
            workspace.mkdir()
            os.chmod(workspace, 0o777 & ~self.shell_umask)
        shell_env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        shell_env.setdefault("PATH", os.defpath)
        shell_env.update(env)
        shell_env.update(SHELL_ENV)
        masked = {n: env[n] for n in secret_names if n in env}
        if self.server_token:
            masked[TOKEN_NAME] = self.server_token
        boot_id = f"{self.boot_id}-{secrets.token_hex(4)}"
        confined = self.shells.confine(workspace, self.workdir, shell_env)
        service = Service(
            str(state), str(workspace), shell_env, boot_id, 0,
            max_output_chars or self.max_output_chars, masker=TextMasker(masked),
            shell_umask=self.shell_umask, journal_class=FencedJournal,
            confinement=confined)
        journal = service.journal
        assert isinstance(journal, FencedJournal)
        try:
            service.start()
        except BaseException:
            confined.close()
            raise
        _remember_shell(state, service.shell.pid)
        hosted = Hosted(session_id, service, journal, confined)
        with self._lock:
            self._hosted[session_id] = hosted
        return hosted


def _remember_shell(state: Path, pid: int) -> None:
    write_json_atomic(str(state / "shell.json"), {"pid": pid, "start_time": start_time(pid)})


def _forget_shell(state: Path) -> None:
    try:
        (state / "shell.json").unlink()
    except OSError:
        pass


def _kill_session(leader: int) -> bool:
    """SIGKILL every process of the session ``leader`` led (bash leads its own); whether
    there was any."""
    found = False
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) == leader:
                    os.kill(int(name), signal.SIGKILL)
                    found = True
            except OSError:
                continue
    return found
