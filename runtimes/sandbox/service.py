"""What the server does, without HTTP: claim epochs, journal and perform actions.

``Service.execute`` is idempotent by action id: the action is journaled ``started``
before anything runs, then performed in a background thread that journals ``finished``
with the outcome. An id already in the journal is never performed again.

No secret value is written anywhere: the journaled action is masked (the one that runs
keeps its values), output is masked as it arrives, and every outcome's content is masked
again before it is journaled (errors and notes included). A file action has a deadline
(``file_timeout_s``, and never more than the action's own timeout).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Dict

from . import files
from .bash import BashProcess
from .checkpoints import Checkpoints
from .clone import clone
from .container import ContainerShell
from .journal import Journal
from .mask import TextMasker
from .mcp_launch import hub_class, launcher
from .output import fit_pending, fit_text
from .requests import BadRequest, as_int, checkpoint_limits, parse_execute  # noqa: F401 - BadRequest: re-exported
from .shell import Shell, ShellResult, Spawn
from .shell_policy import ShellConfinement, unreadable_refusal
from .util import read_json, write_json_atomic
from .workers import Workers

logger = logging.getLogger(__name__)

Outcome = Dict[str, Any]

CHANGES_FILES = frozenset({"run", "write_file", "edit_file", "clone", "mcp"})
"""Action kinds that may change the workspace: a checkpoint follows each (when asked)."""
START_CHECKPOINT = "start"
"""The snapshot of the workspace before the first action that asked for one."""

GONE_CONFIRM_S = 1.0
"""After its shell exited, how long a container that still reads ``running`` is watched
before the exit is taken for the shell's own (the engine marks a killed container a little
after the streams of its exec processes close)."""
GONE_CONFIRM_TRIES = 5


def _bash(confinement: ShellConfinement | None) -> Spawn | None:
    """The local shell's ``spawn``: bash confined by ``confinement`` (None: bash as is)."""
    return None if confinement is None else functools.partial(
        BashProcess, confined=confinement.prepared)


STOPPED_NOTE = (
    "\n[Interrupted: trouper stopped this sandbox while the command ran (the session was "
    "stopped, or the program running it closed): the command, its shell and every job the "
    "shell started were killed. It was not run again; check its effects before repeating "
    "it.]")
"""The note of a command killed by the sandbox's close."""


class StaleEpoch(Exception):
    """The request carries an older epoch than the one claimed."""


class StorageUnavailable(Exception):
    """The journal cannot be written (disk full, read-only): the action is not run."""


_STORAGE_ERRNOS = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EROFS: "read-only",
                   errno.EACCES: "not writable", errno.EPERM: "not writable",
                   errno.EIO: "failing (I/O error)"}


class Service:
    """One sandbox: its journal, its shell, its workspace and the claimed epoch."""

    def __init__(
        self,
        state_dir: str,
        workspace: str,
        env: dict[str, str],
        boot_id: str,
        epoch: int = 0,
        max_output_chars: int = 10_000,
        interrupt_grace_s: float = 2.0,
        *,
        masker: TextMasker | None = None,
        shell_umask: int | None = None,
        file_timeout_s: float = files.FILE_TIMEOUT_S,
        container: ContainerShell | None = None,
        journal_class: type[Journal] = Journal,
        confinement: ShellConfinement | None = None,
    ) -> None:
        self.workspace = os.path.realpath(workspace)
        self.container = container
        """Where the shell runs when it runs in a container (None: here, as bash)."""
        self.on_gone: Callable[[], None] | None = None
        """Called once the container is found gone (the server then shuts down)."""
        self.journal = journal_class(os.path.join(state_dir, "journal"), boot_id)
        self.checkpoints = Checkpoints(os.path.join(state_dir, "checkpoints"), self.workspace)
        """Snapshots of the workspace, taken after an action asked for one."""
        self._start_kept = False
        self.masker = masker or TextMasker({})
        """Masks the session's secret values in everything the server writes."""
        self.shell_umask = shell_umask
        """The umask of the agent's shell and of the files write_file creates."""
        self.file_timeout_s = file_timeout_s
        """Deadline of one file action, in seconds."""
        self.shell = Shell(
            self.workspace,
            env,
            max_output_chars,
            interrupt_grace_s,
            masker=self.masker,
            umask=shell_umask,
            spawn=container.spawn if container is not None else _bash(confinement),
            shown_workspace=container.workdir if container is not None else None,
        )
        if container is not None:  # a shell dying with its container, even when idle
            self.shell.on_exit = lambda: self._container_gone(None)
        self.max_output_chars = max_output_chars
        self.unreadable = confinement.unreadable_real if (
            confinement and not container) else ()
        """What the file tools refuse as the confined shell would (its unreadable paths)."""
        self._epoch_path = os.path.join(state_dir, "epoch.json")
        stored = read_json(self._epoch_path) or {}
        self.epoch = max(epoch, int(stored.get("epoch", 0)))
        self._lock = threading.Lock()
        self._mcp: Any = None
        """The sandbox's MCP servers (``mcp_hub.McpHub``), made by the first MCP action."""
        self._mcp_lock = threading.Lock()
        self._launch_mcp = launcher(self.workspace, env, shell_umask, container, confinement)
        self._workers = Workers()
        """Threads performing an action, until its outcome is journaled."""
        self.closing = False
        """``close`` began: a command that ends now was killed by it (a container's shell
        reports its killed job as a plain exit 137, a local one its own death)."""

    def start(self) -> None:
        """Start the shell and persist the epoch claimed at launch."""
        self.shell.start()
        write_json_atomic(self._epoch_path, {"epoch": self.epoch})

    def close(self, journal_wait_s: float = 3.0) -> None:
        """Kill the shell and everything it started, then give the actions that ran in it
        up to ``journal_wait_s`` to journal their outcome (killed: ``interrupted``, saying
        the sandbox was stopped; not unknown)."""
        with self._mcp_lock:  # an MCP action after this line makes no hub
            self.closing = True
            hub = self._mcp
        self.shell.close()
        if hub is not None:  # its calls in flight end interrupted
            hub.close()
        deadline = time.monotonic() + journal_wait_s
        for done in self._workers.running():
            done.wait(max(0.0, deadline - time.monotonic()))

    # ---- epochs ----

    def claim(self, epoch: Any) -> int:
        """Claim the sandbox for ``epoch`` (>= the current one), or for ``"next"``: one past
        the current, counted here, so a new proxy's claim never depends on a clock. Returns
        the epoch claimed."""
        with self._lock:
            epoch = self.epoch + 1 if epoch == "next" else as_int(epoch, "epoch")
            self._check(epoch)
            if epoch > self.epoch:
                self.epoch = epoch
                write_json_atomic(self._epoch_path, {"epoch": epoch})
            return self.epoch

    def check_epoch(self, epoch: Any) -> None:
        """Raise StaleEpoch when ``epoch`` (if given) is older than the claimed one."""
        if epoch is not None:
            with self._lock:
                self._check(as_int(epoch, "epoch"))

    def _check(self, epoch: int) -> None:
        if epoch < self.epoch:
            raise StaleEpoch(
                f"epoch {epoch} is older than the claimed epoch {self.epoch}: a newer proxy "
                "owns this sandbox"
            )

    # ---- actions ----

    def execute(self, request: dict[str, Any]) -> dict[str, Any]:
        """Journal and start an action (once per id); returns its journal record."""
        action_id, action, timeout_s, soft_s = parse_execute(request)
        limits = checkpoint_limits(request.get("checkpoint"))
        epoch = self.claim(request.get("epoch"))
        try:
            started = self.journal.start(action_id, epoch, self.mask_data(action))
        except OSError as e:
            if e.errno not in _STORAGE_ERRNOS:
                raise
            raise StorageUnavailable(
                f"the disk holding the sandbox's journal is {_STORAGE_ERRNOS[e.errno]} "
                f"({e.strerror}); the action was not run") from e
        if started:
            self._workers.submit(self._journal_outcome, action_id, action, timeout_s, soft_s,
                                 limits)
        return self.journal.read(action_id)

    def _journal_outcome(
        self, action_id: str, action: dict[str, Any], timeout_s: float, soft_s: float,
        checkpoint: dict[str, Any] | None = None,
    ) -> None:
        if checkpoint is not None and not self._start_kept:  # as the first action found it
            self._start_kept = self.checkpoints.manifest(START_CHECKPOINT) is not None or (
                self._checkpoint(START_CHECKPOINT, checkpoint) is not None)
        began, exits = time.monotonic(), self.shell.exits
        try:
            outcome = self.perform(action_id, action, timeout_s, soft_s)
        except Exception as e:  # noqa: BLE001 - the action must end with an outcome
            if self._container_gone(action_id):
                return
            logger.exception("action %s failed inside the sandbox", action_id)
            outcome = {"status": "error", "content": f"The sandbox failed: {type(e).__name__}: {e}"}
        if self.shell.exits != exits and self._container_gone(action_id):
            return
        outcome["content"] = self.masker.mask(str(outcome.get("content", "")))
        outcome["duration_s"] = round(time.monotonic() - began, 6)
        # who ran it, for the audit trail (client/audit.py); the epoch is in the record
        outcome["server_pid"], outcome["boot_id"] = os.getpid(), self.journal.boot_id
        if checkpoint is not None and action["kind"] in CHANGES_FILES:
            outcome["checkpoint"] = self._checkpoint(action_id, checkpoint)
        self.journal.finish(action_id, outcome)

    def _checkpoint(self, name: str, limits: dict[str, Any]) -> str | None:
        """Snapshot the workspace as ``name`` within ``limits``; the name, or None when it
        could not be kept (the action's outcome stands; a fork from it says so)."""
        try:
            return str(self.checkpoints.take(name, **limits)["name"])
        except OSError as e:
            logger.warning("no checkpoint %s: %s", name, e)
            return None

    def _container_gone(self, action_id: str | None) -> bool:
        """True (and the server told to stop) when the shell's container is not running:
        what the action did is then unknown, so it is NOT journaled as finished (it reads
        ``unknown`` to the next server, and is recorded lost), never as a made-up error."""
        if self.container is None:
            return False
        state = self.container.state()
        for _ in range(GONE_CONFIRM_TRIES):  # the engine may not know yet that it died
            if state != "running":
                break
            time.sleep(GONE_CONFIRM_S / GONE_CONFIRM_TRIES)
            state = self.container.state()
        if state == "running":
            return False
        what = f"action {action_id}: its outcome is unknown (not journaled)" if action_id else (
            "the shell exited with it")
        logger.warning("the container is %s (%s); shutting down", state, what)
        if self.on_gone is not None:
            self.on_gone()
        return True

    def mask_data(self, value: Any) -> Any:
        """A copy of JSON-like ``value`` with every string in it (keys too) masked."""
        if isinstance(value, str):
            return self.masker.mask(value)
        if isinstance(value, dict):
            return {self.mask_data(k): self.mask_data(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.mask_data(item) for item in value]
        return value

    def perform(
        self, action_id: str, action: dict[str, Any], timeout_s: float, soft_s: float
    ) -> Outcome:
        """Do one action and return its outcome (never raises for the agent's mistakes)."""
        if action["kind"] == "run":
            return self._run(action_id, action, timeout_s, soft_s)
        if action["kind"] == "clone":
            return clone(self.workspace, action["url"], action.get("branch"), timeout_s,
                         self.shell_umask)
        if action["kind"] in ("mcp", "mcp_tools"):
            return self._mcp_action(action_id, action, timeout_s)
        refused = unreadable_refusal(self.workspace, action["path"], self.unreadable)
        if refused is not None:
            return {"status": "error", "content": refused}
        do = self._file_action(action)

        def whole() -> Outcome:  # the deadline covers saving the full text too (same disk)
            content, elided, full_path = fit_text(
                self.masker.mask(do()), self.max_output_chars, self.workspace, action_id
            )
            return {
                "status": "ok",
                "content": content,
                "elided_chars": elided,
                "full_output_path": full_path,
            }

        try:
            return files.call_with_deadline(
                whole, min(self.file_timeout_s, timeout_s), action["kind"]
            )
        except files.FileError as e:
            return {"status": "error", "content": self._shown(str(e))}

    def _mcp_action(self, action_id: str, action: dict[str, Any], timeout_s: float) -> Outcome:
        with self._mcp_lock:
            if self.closing:  # no hub made after close: nothing would ever stop it
                return {"status": "interrupted", "content": (
                    "Not run: trouper was stopping this sandbox and its MCP servers.")}
            if self._mcp is None:
                try:  # the mcp package: imported only by a sandbox that uses a server
                    hub = hub_class()
                except ImportError as e:
                    return {"status": "error", "content": (
                        "MCP servers need the Python package mcp where the sandbox server "
                        f"runs ({sys.executable}), and it is missing: {e}")}
                self._mcp = hub(self._launch_mcp, self.masker.mask, self.workspace,
                                   self.max_output_chars)
        return self._mcp.perform(action_id, action, timeout_s)

    def _host_path(self, path: str) -> str:
        """A path as the container's commands see it (``/workspace/x``), on this host."""
        workdir = self.container.workdir.rstrip("/") if self.container is not None else ""
        if workdir and (path == workdir or path.startswith(workdir + "/")):
            return self.workspace + path[len(workdir):]
        return path

    def _shown(self, text: str) -> str:
        """``text`` with this host's workspace path written as the container's."""
        if self.container is None:
            return text
        return text.replace(self.workspace, self.container.workdir.rstrip("/") or "/")

    def _file_action(self, action: dict[str, Any]) -> Callable[[], str]:
        kind, workspace = action["kind"], self.workspace
        if self.container is not None:
            action = dict(action, path=self._host_path(action["path"]))
        if kind == "read_file":
            return lambda: files.read_file(
                workspace, action["path"], action.get("start_line"), action.get("end_line")
            )
        if kind == "write_file":
            return lambda: self._shown(files.write_file(
                workspace, action["path"], action["content"], self.shell_umask
            ))
        return lambda: self._shown(
            files.edit_file(workspace, action["path"], action["old"], action["new"]))

    def _run(
        self, action_id: str, action: dict[str, Any], timeout_s: float, soft_s: float
    ) -> Outcome:
        if action.get("interrupt"):
            result = self.shell.interrupt()
        elif action["command"].strip() == "":
            result = self.shell.wait_more(soft_s, max_wait_s=timeout_s)
        else:
            hard_s = action.get("timeout_s") or timeout_s
            result = self.shell.run(
                action["command"], hard_s, soft_s, self.journal.output_path(action_id)
            )
        return self._outcome(action_id, result)

    def _outcome(self, action_id: str, result: ShellResult) -> Outcome:
        if self.closing and result.timed_out is None:  # it ended as the close killed it
            result.status, result.note = "interrupted", STOPPED_NOTE
        output, elided, full_path = "", 0, None
        if result.pending is not None:
            output, elided, full_path = fit_pending(
                result.pending, result.source_path, self.max_output_chars, self.workspace, action_id
            )
        return {
            "status": result.status,
            "content": _join(output, result.note),
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "still_running": result.still_running,
            "elided_chars": elided,
            "full_output_path": full_path,
        }


def _join(output: str, note: str) -> str:
    if not note:
        return output if output else "(no output)"
    if not output.strip("\n"):
        return note.strip("\n")
    return output.rstrip("\n") + "\n" + note.lstrip("\n")
