"""``container_failure``: why a container does not run, in words a user can act on, even
when its log ends with pages of noise after the line that says what went wrong."""

from __future__ import annotations

from typing import Any

from trouper.runtimes.docker_support import LOG_TAIL_LINES, container_failure


class StoppedContainer:
    """What ``container_failure`` reads of a docker SDK container."""

    status = "exited"

    def __init__(self, log: str, exit_code: int = 1) -> None:
        self._log = log.encode("utf-8")
        self.attrs: dict[str, Any] = {"State": {"Status": "exited", "ExitCode": exit_code}}

    def logs(self, tail: int | str = "all") -> bytes:
        lines = self._log.splitlines(keepends=True)
        return b"".join(lines if tail == "all" else lines[-int(tail):])


def test_a_short_log_is_quoted_whole():
    text = container_failure(StoppedContainer("starting\nsh: exec: nope: not found\n", 127))
    assert "exit code 127" in text
    assert "starting\nsh: exec: nope: not found" in text


def test_the_cause_is_quoted_when_a_crash_dump_pushed_it_out_of_the_tail():
    noise = "".join(f"  frame {i}: at 0x{i:08x}\n" for i in range(200))
    log = "booting\nFATAL: cannot open /data/config.yml: permission denied\n" + noise
    text = container_failure(StoppedContainer(log))
    assert "FATAL: cannot open /data/config.yml: permission denied" in text
    assert "frame 199" in text  # the end of the log is still there
    assert "frame 100" not in text  # and the middle is not: the message stays short
    assert len(text) < 4000


def test_a_log_without_an_error_line_is_its_tail_only():
    log = "".join(f"line {i}\n" for i in range(100))
    text = container_failure(StoppedContainer(log))
    assert f"line {100 - LOG_TAIL_LINES}" in text and "line 99" in text
    assert f"line {99 - LOG_TAIL_LINES}\n" not in text
