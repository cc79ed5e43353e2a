"""Approving actions from the command line, as a user would: at the prompt of `trouper run`
in a (pseudo-)terminal, with the one command a run without a terminal prints, and with
`trouper approve` / `trouper reject` with and without a daemon."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trouper import ConfirmationEvent, ObservationEvent
from trouper.client.store_reader import StoreReader
from trouper.testing import wait_until
from trouper.testing.daemon import running_daemon

from accel import forkserver

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
FINISH = {"tool": "finish", "args": {"message": "done"}}


def run_step(command: str) -> dict:
    return {"tool": "run", "args": {"command": command}}


class Terminal:
    """A ``python -m trouper`` command whose stdin, stdout and stderr are a pseudo-terminal:
    what it printed (``text``, without ANSI codes), and typing into it."""

    def __init__(self, args: list[str], env: dict[str, str], fresh: bool = False) -> None:
        """``fresh``: start it afresh, not forked from the suite's zygote (whose imports
        were made under another TERM)."""
        self._master, slave = pty.openpty()
        popen = subprocess.Popen if fresh else forkserver.Popen
        try:
            self.proc = popen([sys.executable, "-m", "trouper", *args], stdin=slave,
                              stdout=slave, stderr=slave, env=env, start_new_session=True)
        finally:
            os.close(slave)
        self.raw = b""

    @property
    def text(self) -> str:
        return ANSI.sub(b"", self.raw).decode(errors="replace").replace("\r", "")

    def _read(self) -> None:
        while select.select([self._master], [], [], 0.05)[0]:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: nothing holds the terminal open any more
                return
            if not chunk:
                return
            self.raw += chunk

    def read_until(self, text: str, count: int = 1, timeout_s: float = 60) -> None:
        """Read until ``text`` was printed ``count`` times."""
        def seen() -> bool:
            self._read()
            return self.text.count(text) >= count
        try:
            wait_until(seen, timeout_s, f"{text!r} printed {count} time(s)")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; the terminal shows:\n{self.text[-3000:]}") from None

    def type(self, line: str) -> None:
        os.write(self._master, line.encode() + b"\n")

    def wait(self, timeout_s: float = 120) -> int:
        code = self.proc.wait(timeout_s)
        self._read()
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        os.close(self._master)


def environment(home: Path | None = None, **extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    for name in ("TROUPER_MODEL", "NO_COLOR", "COLUMNS"):
        env.pop(name, None)
    env.pop("TROUPER_HOME", None)
    if home is not None:
        env["TROUPER_HOME"] = str(home)
    return env


def write_script(tmp_path: Path, steps: list[dict]) -> Path:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(steps))
    return script


def answers(home: Path, session_id: str) -> tuple[list[tuple[bool, str]], dict[str, str]]:
    """The user's answers in the session's log, and each action's outcome status."""
    with StoreReader(home) as reader:
        events = list(reader.session(session_id).events())
    given = [(e.approved, e.reason) for e in events if isinstance(e, ConfirmationEvent)]
    outcomes = {e.action_id: e.outcome.status for e in events if isinstance(e, ObservationEvent)}
    return given, outcomes


def session_id_in(text: str) -> str:
    return re.search(r"session (s-[0-9a-f]+)", text).group(1)


def test_each_waiting_action_is_asked_at_the_prompt_and_the_run_carries_on(tmp_path):
    script = write_script(tmp_path, [run_step("rm -rf a.txt"), run_step("rm -rf b.txt"),
                                     run_step("git push origin main"), FINISH])
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a\n")
    (workspace / "b.txt").write_text("b\n")
    terminal = Terminal(["run", "tidy", "--script", str(script), "--workspace", str(workspace),
                         "--confirm", "risky"], environment(home))
    try:
        terminal.read_until("Run it? [y]es / [n]o / n with a reason:")
        assert "action  run: rm -rf a.txt" in terminal.text
        assert "held    the command deletes recursively or by force" in terminal.text
        assert (workspace / "a.txt").exists()  # nothing ran before the answer
        terminal.type("y")
        terminal.read_until("Run it?", count=2)
        assert not (workspace / "a.txt").exists()
        assert "action  run: rm -rf b.txt" in terminal.text.rsplit("user approved", 1)[1]
        terminal.type("maybe")  # no answer: asked again, nothing done
        terminal.read_until("answer y, n, or n followed by the reason")
        terminal.read_until("Run it?", count=3)
        terminal.type("n not on main")
        terminal.read_until("Run it?", count=4)
        assert "action  run: git push origin main" in terminal.text
        terminal.type("n")  # a bare no: the reason is asked for next
        terminal.read_until("Why not?")
        terminal.type("no pushing")
        assert terminal.wait() == 0, terminal.text
    finally:
        terminal.close()
    assert "state      finished" in terminal.text
    assert (workspace / "b.txt").read_text() == "b\n"
    given, outcomes = answers(home, session_id_in(terminal.text))
    assert given == [(True, ""), (False, "not on main"), (False, "no pushing")]
    assert sorted(outcomes.values()) == ["ok", "ok", "rejected", "rejected"]


def test_ctrl_c_at_the_prompt_leaves_the_action_waiting_and_says_how_to_answer(tmp_path):
    script = write_script(tmp_path, [run_step("rm -rf a.txt"), FINISH])
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a\n")
    terminal = Terminal(["run", "tidy", "--script", str(script), "--workspace", str(workspace),
                         "--confirm", "risky"], environment(home))
    try:
        terminal.type("y")  # typed before the question: it never answers it
        terminal.read_until("Run it?")
        terminal.proc.send_signal(signal.SIGINT)  # what Ctrl-C in its terminal sends
        assert terminal.wait() == 130, terminal.text
    finally:
        terminal.close()
    session_id = session_id_in(terminal.text)
    assert (f"trouper: interrupted by SIGINT: session {session_id} waits for your approval: "
            f"trouper approve {session_id} --script {script}") in terminal.text
    assert (workspace / "a.txt").exists()
    with StoreReader(home) as reader:
        assert reader.session(session_id).state.value == "awaiting_user_confirmation"


@pytest.mark.parametrize(("setting", "unwanted"), [
    ({"TERM": "dumb"}, rb"\x1b\["),  # no control code at all
    ({"NO_COLOR": "1"}, rb"\x1b\[[0-9;]*m"),  # no colour or style (the spinner may draw)
])
def test_a_terminal_that_asks_for_no_colour_gets_none(tmp_path, setting, unwanted):
    script = write_script(tmp_path, [run_step("echo hello"), FINISH])
    terminal = Terminal(["run", "greet", "--script", str(script)],
                        {**environment(tmp_path / "home"), **setting}, fresh=True)
    try:
        assert terminal.wait() == 0, terminal.text
    finally:
        terminal.close()
    assert "state      finished" in terminal.text
    assert re.search(unwanted, terminal.raw) is None


def cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "trouper", *args], env=env, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def as_printed(command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a ``trouper ...`` line as the user pastes it into a shell."""
    argv = shlex.split(command)
    assert argv[0] == "trouper", command
    return cli(*argv[1:], env=env)


def summary(stdout: str) -> dict[str, str]:
    rows = stdout.split("── summary", 1)[1].strip().splitlines()
    return dict(line.split(None, 1) for line in rows)


def test_without_a_terminal_the_run_prints_the_command_that_answers_and_it_works(tmp_path):
    script = write_script(tmp_path, [run_step("rm -rf a.txt"), run_step("rm -rf b.txt"),
                                     FINISH])
    workspace, home = tmp_path / "ws", tmp_path / "my home"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a\n")
    (workspace / "b.txt").write_text("b\n")
    env = environment()  # the home is named on the command line only: the commands say it
    ran = cli("run", "tidy", "--script", str(script), "--workspace", str(workspace),
              "--confirm", "risky", "--home", str(home), env=env)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    rows = summary(ran.stdout)
    session_id = rows["session"]
    flags = f" --script {script} --home '{home}'"
    assert rows["approve"] == f"trouper approve {session_id}{flags}"
    assert rows["reject"] == f"trouper reject {session_id} 'WHY'{flags}"
    assert "Run it?" not in ran.stdout

    approved = as_printed(rows["approve"], env)  # no daemon runs: answered here, followed on
    assert approved.returncode == 1, approved.stdout + approved.stderr
    assert "user approved the action" in approved.stdout
    assert not (workspace / "a.txt").exists()
    rows = summary(approved.stdout)
    assert rows["state"] == "awaiting_user_confirmation" and "rm -rf b.txt" in rows["reason"]
    rejected = as_printed(rows["reject"], env)
    assert rejected.returncode == 0, rejected.stdout + rejected.stderr
    assert summary(rejected.stdout)["state"] == "finished"
    assert (workspace / "b.txt").exists()
    given, _ = answers(home, session_id)
    assert given == [(True, ""), (False, "WHY")]

    again = cli("approve", session_id, "--home", str(home), env=env)
    assert again.returncode == 2
    assert again.stderr.strip() == (f"trouper: error: no action of session {session_id} "
                                    "waits for approval (the session is finished)")
    unknown = cli("reject", "s-000000000000", "--home", str(home), env=env)
    assert unknown.returncode == 2 and "no session has the id 's-000000000000'" in unknown.stderr


def test_approve_reject_and_events_follow_through_a_daemon(tmp_path, scripted):
    server, llm = scripted([run_step("echo one > one.txt"), run_step("echo two > two.txt"),
                            FINISH])
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with running_daemon(tmp_path / "home") as daemon:
        env = environment(daemon.home.root)
        ran = cli("run", "count", "--daemon", "--model", llm["model"], "--base-url",
                  server.url, "--api-key", llm["api_key"], "--workspace", str(workspace),
                  "--confirm", "always", env=env)
        assert ran.returncode == 1, ran.stdout + ran.stderr
        rows = summary(ran.stdout)
        session_id = rows["session"]
        assert rows["approve"] == f"trouper approve {session_id}"

        followed = cli("events", session_id, "--follow", "--json", env=env)
        assert followed.returncode == 0, followed.stderr
        assert [json.loads(line) for line in followed.stdout.splitlines()]  # stdout: JSON
        assert followed.stderr.strip() == (
            f"trouper: session {session_id} waits for your approval: trouper approve "
            f"{session_id}  (or, to refuse it: trouper reject {session_id} 'WHY')")

        approved = cli("approve", session_id, env=env)
        assert approved.returncode == 0, approved.stderr
        assert approved.stdout.startswith(f"{session_id}: ")
        session = daemon.client().session(session_id)
        assert session.wait(timeout=60).value == "awaiting_user_confirmation"
        assert (workspace / "one.txt").exists()
        rejected = cli("reject", session_id, "not two", env=env)
        assert rejected.returncode == 0, rejected.stderr
        assert session.wait(timeout=60).value == "finished"
        assert not (workspace / "two.txt").exists()
        answered = [(e.approved, e.reason) for e in session.events()
                    if isinstance(e, ConfirmationEvent)]
        assert answered == [(True, ""), (False, "not two")]
        nothing = cli("reject", session_id, env=env)
        assert nothing.returncode == 2 and "no action waits for approval" in nothing.stderr
