"""The persistent shell of the local sandbox, driven through a real server over HTTP."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from trouper.host.processes import pid_alive
from trouper.messages.actions import RunCommand
from trouper.messages.outcomes import Outcome
from trouper.runtimes.local import LocalSandbox
from trouper.testing import wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

_ids = itertools.count(1)


@pytest.fixture
def sandbox(make_sandbox: Callable[..., LocalSandbox]) -> LocalSandbox:
    return make_sandbox()


def run(
    sandbox: LocalSandbox,
    command: str,
    timeout_s: float = 10.0,
    soft_s: float = 5.0,
    interrupt: bool = False,
) -> Outcome:
    action = RunCommand(command=command, interrupt=interrupt)
    return sandbox.runtime.execute(
        f"act-{next(_ids)}", action, timeout_s=timeout_s, no_output_timeout_s=soft_s
    )


def test_cd_and_export_persist_between_commands(sandbox: LocalSandbox) -> None:
    assert run(sandbox, "mkdir -p sub && cd sub && export GREETING=hello").status == "ok"
    outcome = run(sandbox, "pwd; echo $GREETING")
    assert outcome.content == f"{sandbox.workspace / 'sub'}\nhello\n"
    assert outcome.exit_code == 0


def test_exit_codes_are_data_not_errors(sandbox: LocalSandbox) -> None:
    failed = run(sandbox, "false")
    assert (failed.status, failed.exit_code) == ("ok", 1)
    assert run(sandbox, "(exit 7)").exit_code == 7
    assert run(sandbox, "true").exit_code == 0


def test_multi_line_command_runs_whole_and_gives_one_outcome(sandbox: LocalSandbox) -> None:
    command = "for i in 1 2 3; do\n  echo line $i\ndone\ncat <<'EOF'\nhere $doc\nEOF\necho end"
    outcome = run(sandbox, command)
    assert outcome.content == "line 1\nline 2\nline 3\nhere $doc\nend\n"
    assert run(sandbox, "echo next").content == "next\n"


def test_quotes_specials_unicode_and_long_lines_pass_unchanged(sandbox: LocalSandbox) -> None:
    text = 'it\'s "quoted" \\ back $HOME! ünï 日本 `tick`'
    assert run(sandbox, f"cat <<'EOF'\n{text}\nEOF").content == text + "\n"
    long_word = "x" * 20_000  # far past the 4 KiB line limit of a canonical tty
    assert run(sandbox, f"echo {long_word} | wc -c").content.strip() == "20001"


def test_output_without_newline_and_marker_lookalikes(sandbox: LocalSandbox) -> None:
    assert run(sandbox, "printf abc").content == "abc"
    assert run(sandbox, "printf '__TRP'").content == "__TRP"
    assert run(sandbox, "echo '$PS1 is' \"$PS1\"").exit_code == 0
    assert run(sandbox, "echo still fine").content == "still fine\n"


def test_stdin_is_empty_so_readers_do_not_hang(sandbox: LocalSandbox) -> None:
    outcome = run(sandbox, "cat; read -r x; echo done $?", timeout_s=5)
    assert outcome.content == "done 1\n"


def test_hard_timeout_interrupts_with_ctrl_c(sandbox: LocalSandbox) -> None:
    run(sandbox, "export KEPT=yes")
    started = time.monotonic()
    outcome = run(sandbox, "echo before; sh -c 'echo $$ > sleeper.pid; exec sleep 30'", 0.5)
    assert time.monotonic() - started < 3
    assert (outcome.status, outcome.timed_out, outcome.exit_code) == ("error", "hard", 130)
    assert "before" in outcome.content and "timed out after 0.5 s" in outcome.content
    pid = int((sandbox.workspace / "sleeper.pid").read_text())
    wait_until(lambda: not pid_alive(pid))
    assert run(sandbox, "echo $KEPT").content == "yes\n"


def test_ctrl_c_works_when_the_launcher_ignored_sigint(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a `cmd &` shell leaves it
    try:
        sandbox = make_sandbox()
    finally:
        signal.signal(signal.SIGINT, previous)
    outcome = run(sandbox, "sleep 30", timeout_s=0.5)
    assert (outcome.timed_out, outcome.exit_code) == ("hard", 130)
    assert outcome.content.startswith("[The command timed out after 0.5 s and was stopped (Ctrl-C)")


def test_hard_timeout_kills_a_group_that_ignores_ctrl_c(sandbox: LocalSandbox) -> None:
    command = "bash -c 'trap \"\" INT; sleep 30 & echo $! > sleeper.pid; wait'"
    outcome = run(sandbox, command, timeout_s=0.5)
    assert (outcome.status, outcome.timed_out, outcome.exit_code) == ("error", "hard", 137)
    assert "killed" in outcome.content
    pid = int((sandbox.workspace / "sleeper.pid").read_text())
    wait_until(lambda: not pid_alive(pid))
    assert run(sandbox, "echo alive").content == "alive\n"


def test_soft_timeout_returns_partial_output_then_the_rest(sandbox: LocalSandbox) -> None:
    command = "echo first; sleep 1.5; echo second; ret() { return 4; }; ret"
    first = run(sandbox, command, soft_s=0.5)
    assert (first.status, first.timed_out, first.still_running) == ("ok", "soft", True)
    assert first.exit_code is None
    assert first.content.startswith("first\n") and "second" not in first.content
    assert "still running" in first.content and "interrupt" in first.content
    rest = run(sandbox, "", soft_s=5)
    assert rest.content.startswith("second\n")
    assert (rest.exit_code, rest.still_running, rest.timed_out) == (4, False, None)
    assert run(sandbox, "").content == "No command is running."


def test_an_empty_run_waits_no_longer_than_its_own_timeout(sandbox: LocalSandbox) -> None:
    command = "sleep 0.5; for i in 1 2 3 4 5 6 7 8 9 10; do echo $i; sleep 0.1; done"
    assert run(sandbox, command, soft_s=0.3).still_running
    started = time.monotonic()
    middle = run(sandbox, "", timeout_s=0.5, soft_s=5)
    assert time.monotonic() - started < 1.5
    assert middle.still_running and "still going after 0.5 s" in middle.content
    rest = run(sandbox, "", timeout_s=10, soft_s=5)
    assert rest.exit_code == 0
    assert (middle.content.split("[")[0] + rest.content).split() == [str(i) for i in range(1, 11)]


def test_new_command_while_busy_is_refused_and_not_run(sandbox: LocalSandbox) -> None:
    assert run(sandbox, "sleep 1.5", soft_s=0.3).still_running
    refused = run(sandbox, "touch should-not-exist")
    assert refused.status == "error" and "still running" in refused.content
    assert run(sandbox, "", soft_s=5).exit_code == 0
    assert not (sandbox.workspace / "should-not-exist").exists()


def test_interrupt_sends_ctrl_c_and_returns_what_remains(sandbox: LocalSandbox) -> None:
    assert run(sandbox, "echo start; sleep 30", soft_s=0.3).still_running
    outcome = run(sandbox, "", interrupt=True)
    assert (outcome.status, outcome.exit_code) == ("interrupted", 130)
    assert run(sandbox, "echo after").content == "after\n"
    assert "nothing to interrupt" in run(sandbox, "", interrupt=True).content


def test_long_output_keeps_head_and_tail_and_the_full_text(
    make_sandbox: Callable[..., LocalSandbox],
) -> None:

    sandbox = make_sandbox(max_output_chars=1000)
    outcome = run(sandbox, "seq 1 20000")
    total = sum(len(f"{i}\n") for i in range(1, 20001))
    assert outcome.elided_chars == total - 1000
    assert outcome.content.startswith("1\n2\n3\n")
    assert outcome.content.endswith("19999\n20000\n")
    assert f"{outcome.elided_chars} characters cut" in outcome.content
    assert outcome.full_output_path == ".trouper/outputs/" + outcome.full_output_path.split("/")[-1]
    full = (sandbox.workspace / outcome.full_output_path).read_text()
    assert full.splitlines() == [str(i) for i in range(1, 20001)]


def test_a_dead_shell_is_restarted_and_reported(sandbox: LocalSandbox) -> None:
    run(sandbox, "export GONE=soon")
    outcome = run(sandbox, "exit 3")
    assert outcome.status == "error" and "shell exited" in outcome.content
    assert outcome.exit_code == 3
    after = run(sandbox, "echo ${GONE:-reset}; pwd")
    assert after.content == f"reset\n{sandbox.workspace}\n"
    assert after.status == "ok"


def test_shell_env_is_prepared_for_agents(sandbox: LocalSandbox) -> None:
    outcome = run(sandbox, "echo $TERM $PAGER $GIT_PAGER; [ -t 0 ] || echo stdin-not-tty")
    assert outcome.content == "dumb cat cat\nstdin-not-tty\n"
    assert run(sandbox, "yes | head -n 2").content == "y\ny\n"  # SIGPIPE works again


def _fd_targets(pid: int) -> dict[int, str]:
    folder = Path(f"/proc/{pid}/fd")
    targets = {}
    for entry in folder.iterdir():
        try:
            targets[int(entry.name)] = os.readlink(entry)
        except OSError:
            continue  # closed meanwhile
    return targets


def test_commands_inherit_no_descriptor_of_the_server(sandbox: LocalSandbox) -> None:
    # ls sees its stdin/stdout/stderr and the folder it lists (3), nothing else
    assert run(sandbox, "ls /proc/self/fd").content.split() == ["0", "1", "2", "3"]
    answer = sandbox.runtime.alive()
    server_fds = _fd_targets(answer["pid"])
    server_sockets = {t for t in server_fds.values() if t.startswith("socket:")}
    assert server_sockets, "the server listens on a socket"
    shell_fds = _fd_targets(answer["shell_pid"])
    assert not set(shell_fds.values()) & server_sockets
    assert not [t for t in shell_fds.values() if str(sandbox.state_dir) in t]
    assert all(t.startswith("/dev/pts/") for t in shell_fds.values()), shell_fds
