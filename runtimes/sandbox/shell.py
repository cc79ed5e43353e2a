"""The session's persistent shell: one command line at a time, with soft and hard timeouts.

``Shell.run`` sends a command line and waits until its prompt comes back (finished), or
no new output came for ``no_output_timeout_s`` (soft timeout: the command keeps running
and the caller gets what it printed so far), or its hard timeout passes (Ctrl-C, then
SIGKILL of the foreground process group). While a command runs, ``wait_more`` returns
its next output and ``interrupt`` sends Ctrl-C. If bash dies it is started again, and
the result says so.
"""

from __future__ import annotations

import codecs
import logging
import secrets
import threading
import time
from typing import Callable, Dict, Optional

from .bash import BashProcess, Prompt, PromptParser, prompt_string
from .mask import TextMasker
from .output import OutputBuffer, Pending

logger = logging.getLogger(__name__)

Spawn = Callable[[str, Dict[str, str], Optional[int]], BashProcess]
"""Starts the shell process: ``spawn(workspace, env, umask)`` (default: ``BashProcess``)."""


class ShellError(Exception):
    """The shell could not be started."""


class ShellResult:
    """What one call on the shell gives back; the service turns it into an outcome."""

    def __init__(self, status: str, note: str = "", pending: Pending | None = None,
                 source_path: str = "", exit_code: int | None = None,
                 timed_out: str | None = None, still_running: bool = False) -> None:
        self.status = status
        self.note = note
        """Text shown after the output (timeouts, restarts, refusals)."""
        self.pending = pending
        self.source_path = source_path
        """The file holding the whole output of the command ``pending`` belongs to."""
        self.exit_code = exit_code
        self.timed_out = timed_out
        self.still_running = still_running


class _Command:
    """One command line sent to the shell."""

    def __init__(self, line_id: int, bash: BashProcess, buffer: OutputBuffer, timeout_s: float):
        self.line_id = line_id
        self.bash = bash
        self.buffer = buffer
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self.last_output = self.started
        self.done = False
        self.reported = False
        """True once a caller was given its end (exit code)."""
        self.exit_code: int | None = None
        self.shell_exit: int | None = None
        """Set when bash itself exited under this command (the status bash exited with)."""

    def end(self, exit_code: int | None) -> None:
        self.done = True
        self.exit_code = exit_code
        self.buffer.close()


class Shell:
    """An interactive bash kept alive across commands, so ``cd`` and ``export`` persist."""

    def __init__(
        self,
        workspace: str,
        env: dict[str, str],
        max_output_chars: int = 10_000,
        interrupt_grace_s: float = 2.0,
        start_timeout_s: float = 10.0,
        masker: TextMasker | None = None,
        umask: int | None = None,
        spawn: Spawn | None = None,
        shown_workspace: str | None = None,
    ) -> None:
        self.workspace = workspace
        self._spawn = spawn or BashProcess
        """Starts the shell process (a local bash, or a ``sh`` in a container)."""
        self.shown_workspace = shown_workspace or workspace
        """The workspace as the agent's commands see it (in notes to the agent)."""
        self.exits = 0
        """How many shells have exited so far (the service asks why when this moves)."""
        self.on_exit: Callable[[], None] | None = None
        """Called (on the reader thread) after a shell exited that was not closed."""
        self._masker = masker
        """Masks secret values in the output, as it arrives (before it is written)."""
        self._umask = umask
        """The umask commands run with (None: the server's own)."""
        self._max_output_chars = max_output_chars
        self._grace_s = interrupt_grace_s
        self._start_timeout_s = start_timeout_s
        self._prefix = f"__TRP{secrets.token_hex(8)}_"
        self._env = dict(env, PS1=prompt_string(self._prefix), PS2="", PWD=workspace)
        self._cond = threading.Condition()
        self._restart_lock = threading.Lock()
        self._bash: BashProcess | None = None
        self._cmd: _Command | None = None
        self._next_line_id = 2
        self._closed = False

    # ---- lifecycle ----

    def start(self) -> None:
        """Start bash and wait until it is ready for commands (raises ShellError)."""
        try:
            bash = self._spawn(self.workspace, self._env, self._umask)
        except OSError as e:  # a confinement the kernel refused
            raise ShellError(f"the shell could not be started: {e}") from e
        parser = PromptParser(self._prefix)
        with self._cond:
            self._bash = bash
        thread = threading.Thread(target=self._read_loop, args=(bash, parser), daemon=True)
        thread.name = f"shell-reader-{bash.pid}"
        thread.start()
        bash.send_init()
        deadline = time.monotonic() + self._start_timeout_s
        with self._cond:
            while bash.last_prompt_id != 1:
                remaining_s = deadline - time.monotonic()
                if bash.exit_status is not None or remaining_s <= 0:
                    bash.kill_all()
                    raise ShellError(
                        f"bash did not become ready within {self._start_timeout_s:g} s "
                        f"(exit status {bash.exit_status})"
                    )
                self._cond.wait(remaining_s)
        logger.info("shell started: pid %d in %s", bash.pid, self.shown_workspace)

    def close(self) -> None:
        """Kill bash and everything it started (idempotent)."""
        with self._cond:
            self._closed = True
            bash = self._bash
        if bash is not None:
            bash.kill_all()

    @property
    def pid(self) -> int:
        """The pid of the current bash (0 before start)."""
        return self._bash.pid if self._bash is not None else 0

    # ---- commands ----

    def run(
        self, command: str, timeout_s: float, no_output_timeout_s: float, output_path: str
    ) -> ShellResult:
        """Run ``command``; its output is appended to ``output_path`` as it arrives."""
        note = self._ensure_alive()
        with self._cond:
            if self._cmd is not None and not self._cmd.done:
                return self._busy_result(self._cmd)
            note += self._unreported_note(self._cmd)
            bash = self._bash
            assert bash is not None
            cmd = _Command(
                self._next_line_id,
                bash,
                OutputBuffer(output_path, self._max_output_chars, self._masker),
                timeout_s,
            )
            self._next_line_id += 1
            self._cmd = cmd
            try:
                bash.apply_modes()
                bash.send(cmd.line_id, command)
            except OSError as e:  # bash just died: its reader ends the command
                logger.warning("cannot write to bash pid %d: %s", bash.pid, e)
        result = self._wait(cmd, no_output_timeout_s)
        result.note = note + result.note
        return result

    def wait_more(self, no_output_timeout_s: float, max_wait_s: float) -> ShellResult:
        """Wait for more output of the running command, or its end, at most ``max_wait_s``.

        The command's own hard timeout still applies; ``max_wait_s`` only bounds this wait.
        """
        with self._cond:
            cmd = self._cmd
            if cmd is None or cmd.reported:
                return ShellResult("ok", "No command is running.")
        return self._wait(cmd, no_output_timeout_s, max_wait_s)

    def interrupt(self) -> ShellResult:
        """Send Ctrl-C to the running command and return what it printed since last time."""
        with self._cond:
            cmd = self._cmd
            if cmd is None or cmd.reported:
                return ShellResult("ok", "No command is running; nothing to interrupt.")
        how = self._stop(cmd) if not cmd.done else ""
        with self._cond:
            result = self._end_result(cmd)
        self._restart_if_exited(cmd)
        result.status = "interrupted" if how else result.status
        if how:
            result.note = f"\n[Interrupted ({how}); exit code {cmd.exit_code}.]"
        return result

    # ---- waiting ----

    def _wait(self, cmd: _Command, soft_s: float, max_wait_s: float = float("inf")) -> ShellResult:
        began = time.monotonic()
        with self._cond:
            while not cmd.done:
                now = time.monotonic()
                if now >= cmd.deadline:
                    break
                quiet_since = max(cmd.last_output, began)
                if soft_s > 0 and now - quiet_since >= soft_s:
                    return self._soft_result(cmd, f"no new output for {soft_s:g} s")
                if now - began >= max_wait_s:
                    return self._soft_result(cmd, f"still going after {max_wait_s:g} s of waiting")
                until = min(cmd.deadline, began + max_wait_s)
                if soft_s > 0:
                    until = min(until, quiet_since + soft_s)
                self._cond.wait(until - now)
            if cmd.done:
                result = self._end_result(cmd)
        if cmd.done:
            self._restart_if_exited(cmd)
            return result
        how = self._stop(cmd)
        with self._cond:
            result = self._end_result(cmd)
        self._restart_if_exited(cmd)
        result.status = "error"
        result.timed_out = "hard"
        result.note = (
            f"\n[The command timed out after {cmd.timeout_s:g} s and was stopped ({how}); "
            f"exit code {cmd.exit_code}.]"
        )
        return result

    def _restart_if_exited(self, cmd: _Command) -> None:
        if cmd.shell_exit is not None:
            self._restart(cmd.bash)

    def _stop(self, cmd: _Command) -> str:
        """Ctrl-C, then SIGKILL of the foreground group, then a new shell; says which."""
        try:
            cmd.bash.interrupt()
        except OSError:
            pass
        if self._wait_done(cmd, self._grace_s):
            return "Ctrl-C"
        if cmd.bash.kill_foreground() and self._wait_done(cmd, self._grace_s):
            return f"Ctrl-C did not stop it within {self._grace_s:g} s, so it was killed"
        self._restart(cmd.bash)
        self._wait_done(cmd, self._grace_s)
        return "the shell did not recover, so it was killed and started again"

    def _wait_done(self, cmd: _Command, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not cmd.done and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            return cmd.done

    # ---- results (called with the lock held) ----

    def _end_result(self, cmd: _Command) -> ShellResult:
        cmd.reported = True
        result = ShellResult(
            "ok", pending=cmd.buffer.take(), source_path=cmd.buffer.path, exit_code=cmd.exit_code
        )
        if cmd.shell_exit is not None:
            result.status = "error"
            result.note = (
                f"\n[The shell exited (status {cmd.shell_exit}). A new shell was started in "
                f"{self.shown_workspace}: cd and exported variables were reset.]"
            )
        elif cmd.exit_code:
            result.note = f"\n[exit code {cmd.exit_code}]"
        return result

    def _soft_result(self, cmd: _Command, why: str) -> ShellResult:
        left_s = max(0.0, cmd.deadline - time.monotonic())
        note = (
            f"\n[The command is still running ({why}). Run an empty "
            "command to wait for more output, or run with interrupt: true to send Ctrl-C. "
            f"Its timeout stops it in {left_s:.0f} s.]"
        )
        return ShellResult(
            "ok", note, cmd.buffer.take(), cmd.buffer.path, timed_out="soft", still_running=True
        )

    def _busy_result(self, cmd: _Command) -> ShellResult:
        age_s = time.monotonic() - cmd.started
        return ShellResult(
            "error",
            f"A command is still running (started {age_s:.0f} s ago); nothing was sent to the "
            "shell. Run an empty command to wait for its output, or run with interrupt: true "
            "to send it Ctrl-C.",
        )

    def _unreported_note(self, cmd: _Command | None) -> str:
        if cmd is None or cmd.reported:
            return ""
        cmd.reported = True
        unseen = cmd.buffer.take().total_chars
        lost = f"; {unseen} characters of its output were not shown" if unseen else ""
        return (
            f"[The previous command ended with exit code {cmd.exit_code} after you last saw "
            f"it{lost}.]\n"
        )

    # ---- the reader thread and restarts ----

    def _read_loop(self, bash: BashProcess, parser: PromptParser) -> None:
        # lossless: an undecodable byte becomes a lone surrogate that encodes back to it,
        # so the output file keeps the raw bytes (OutputBuffer says how it is shown)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        # no timeout where bash's exit can be waited on: an idle shell costs no CPU
        timeout_s = None if bash.exit_watch() is not None else 0.5
        while True:
            data = bash.read(timeout_s)
            if data is None:
                break
            if not data and bash.reap() is not None:
                break  # bash is gone, though a job it left may still hold the pty open
            if data:
                events = parser.feed(decoder.decode(data))
                with self._cond:
                    for output, prompt in events:
                        self._deliver(bash, output, prompt)
                    self._cond.notify_all()
        self._on_exit(bash, decoder.decode(b"", final=True) + parser.flush())

    def _deliver(self, bash: BashProcess, output: str, prompt: Prompt | None) -> None:
        """Route output and prompts from ``bash`` to the command running on it, if any."""
        cmd = self._cmd
        if cmd is None or cmd.bash is not bash or cmd.done:
            cmd = None
        if output and cmd is not None:
            cmd.buffer.append(output)
            cmd.last_output = time.monotonic()
        elif output:
            logger.debug("shell output outside a command: %r", output[:200])
        if prompt is not None:
            bash.last_prompt_id = prompt[1]
            if cmd is not None and prompt[1] == cmd.line_id:
                cmd.end(prompt[0])

    def _on_exit(self, bash: BashProcess, tail: str) -> None:
        status = bash.reap_within(1.0)
        self.exits += 1
        bash.kill_all()  # the jobs it left behind
        bash.close()
        with self._cond:
            self._deliver(bash, tail, None)
            cmd = self._cmd
            if cmd is not None and cmd.bash is bash and not cmd.done:
                cmd.shell_exit = status
                cmd.end(status if status >= 0 else None)
            self._cond.notify_all()
            closed = self._closed
        if not closed:
            logger.warning("shell pid %d exited with status %d", bash.pid, status)
            if self.on_exit is not None:
                self.on_exit()

    def _ensure_alive(self) -> str:
        """Start a new shell if the current one died; returns a note for the agent."""
        with self._cond:
            bash = self._bash
        if bash is not None and bash.exit_status is None:
            return ""
        self._restart(bash)
        return (
            f"[The shell had exited; a new shell was started in {self.shown_workspace}: cd and "
            "exported variables were reset.]\n"
        )

    def _restart(self, old: BashProcess | None) -> None:
        with self._restart_lock:
            if self._closed or self._bash is not old:
                return
            if old is not None:
                old.kill_all()
            logger.warning("restarting the shell (old bash pid %s)", old.pid if old else None)
            self.start()
