"""The sandbox's action journal (``runtimes/sandbox/journal.py``): what each state means
across server boots, and that a start the disk refuses never runs (I2, docs/promises.md)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from trouper.runtimes.sandbox import util
from trouper.runtimes.sandbox.journal import Journal

RUN = {"kind": "run", "command": "echo hi"}


def test_an_action_is_absent_then_running_then_finished(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path), "boot-a")
    assert journal.read("a1")["state"] == "absent"
    assert journal.start("a1", 3, RUN) is True
    assert journal.read("a1") == {"action_id": "a1", "state": "running", "epoch": 3,
                                  "outcome": None}
    journal.finish("a1", {"status": "ok", "content": "hi"})
    record = journal.read("a1")
    assert (record["state"], record["outcome"]) == ("finished", {"status": "ok", "content": "hi"})
    assert journal.start("a1", 3, RUN) is False  # known: never started twice


def test_what_an_earlier_boot_started_and_never_finished_is_unknown_never_run(
        tmp_path: Path) -> None:
    first = Journal(str(tmp_path), "boot-a")
    assert first.start("a1", 1, RUN)
    assert first.start("a2", 1, RUN)
    first.finish("a2", {"status": "ok", "content": ""})
    del first  # the server died here: a1's outcome was never written

    second = Journal(str(tmp_path), "boot-b")
    assert second.read("a1")["state"] == "unknown"
    assert second.start("a1", 2, RUN) is False
    assert second.read("a2")["state"] == "finished"
    assert second.read("a3")["state"] == "absent"


def test_a_start_the_disk_refuses_never_runs_and_the_next_one_runs_once(
        tmp_path: Path, monkeypatch) -> None:
    journal = Journal(str(tmp_path), "boot-a")
    assert journal.start("a1", 1, RUN)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(util.os, "fsync", full)
    with pytest.raises(OSError) as refused:
        journal.start("a2", 1, RUN)
    assert refused.value.errno == errno.ENOSPC
    assert journal.read("a2")["state"] == "absent"  # not durable, so never started
    assert not list(tmp_path.glob("*.tmp.*")), "the half-written record was left behind"
    monkeypatch.undo()

    assert journal.start("a2", 1, RUN)  # room again: it runs, once
    assert journal.start("a2", 1, RUN) is False
    again = Journal(str(tmp_path), "boot-b")
    assert again.read("a1")["state"] == again.read("a2")["state"] == "unknown"


def test_the_journal_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)  # a careless umask: the journal must not depend on it
    try:
        journal = Journal(str(tmp_path / "journal"), "boot-a")
        journal.start("a1", 1, RUN)
        journal.finish("a1", {"status": "ok", "content": ""})
    finally:
        os.umask(old)
    assert (tmp_path / "journal" / "boot-a.log").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "journal").stat().st_mode & 0o777 == 0o700


def test_no_file_is_made_per_action_and_this_boots_records_are_read_from_memory(
        tmp_path: Path, monkeypatch) -> None:
    """One log per boot, appended to: a file per action cost an inode allocation a step,
    which on an ext4 without a journal reads past every inode freed in the last minutes
    (a millisecond a step whenever anything had deleted files), and replacing records
    freed one per action too (2.3 ms a step)."""
    journal = Journal(str(tmp_path), "boot-a")
    assert journal.start("a1", 1, RUN)
    log = tmp_path / "boot-a.log"
    born = log.stat().st_ino

    def no_disk_reads(*args: object) -> None:
        raise AssertionError(f"read {args} from disk")

    monkeypatch.setattr("trouper.runtimes.sandbox.journal.read_json_lines", no_disk_reads)
    monkeypatch.setattr("trouper.runtimes.sandbox.journal._merged", no_disk_reads)
    assert journal.read("a1")["state"] == "running"
    journal.finish("a1", {"status": "ok", "content": "hi"})
    assert journal.read("a1")["outcome"] == {"status": "ok", "content": "hi"}
    assert journal.start("a1", 1, RUN) is False
    for i in range(2, 80):  # past what is kept in memory: the older ones are read back
        assert journal.start(f"a{i}", 1, RUN)
        journal.finish(f"a{i}", {"status": "ok", "content": str(i)})
    monkeypatch.undo()
    assert journal.read("a1")["outcome"] == {"status": "ok", "content": "hi"}
    assert journal.start("a1", 1, RUN) is False
    assert log.stat().st_ino == born
    assert sorted(p.name for p in tmp_path.iterdir()) == ["boot-a.log"]
    later = Journal(str(tmp_path), "boot-b")
    assert later.read("a1")["state"] == later.read("a79")["state"] == "finished"
    assert later.read("a79")["outcome"] == {"status": "ok", "content": "79"}
    assert later.start("a5", 2, RUN) is False and later.start("a80", 2, RUN) is True


def test_an_outcome_line_cut_short_is_skipped_and_a_later_whole_one_counts(
        tmp_path: Path) -> None:
    first = Journal(str(tmp_path), "boot-a")
    assert first.start("a1", 1, RUN) and first.start("a2", 1, RUN)
    for name in ("a1", "a2"):  # the server died writing the outcome: half a line
        with open(tmp_path / "boot-a.log", "ab") as f:
            f.write(b'\n{"action_id": "%s", "status": "finished", "outc' % name.encode())
    first.finish("a2", {"status": "ok", "content": "late"})  # a whole line after it
    second = Journal(str(tmp_path), "boot-b")
    assert second.read("a1")["state"] == "unknown"  # never run again
    assert second.read("a2")["outcome"] == {"status": "ok", "content": "late"}


def test_a_record_an_earlier_version_wrote_reads_the_same(tmp_path: Path) -> None:
    import json

    record = {"action_id": "a1", "status": "finished", "epoch": 2, "boot_id": "old",
              "outcome": {"status": "ok", "content": "x"}, "action": RUN}
    (tmp_path / "a1.json").write_text(json.dumps(record, sort_keys=True))
    journal = Journal(str(tmp_path), "boot-b")
    assert journal.read("a1") == {"action_id": "a1", "state": "finished", "epoch": 2,
                                  "outcome": {"status": "ok", "content": "x"}}
    assert journal.start("a1", 3, RUN) is False


def test_a_start_cut_short_by_a_crash_never_ran_and_runs_on_the_next_boot(
        tmp_path: Path) -> None:
    """A started line is written, then fsynced, then the action runs: one the server
    died writing never ran, so the next boot finds it absent and may run it, once."""
    first = Journal(str(tmp_path), "boot-a")
    assert first.start("a1", 1, RUN)
    with open(tmp_path / "boot-a.log", "ab") as f:
        f.write(b'\n{"action": {"command": "echo hi", "kind": "run"}, "action_id": "a2", "st')
    second = Journal(str(tmp_path), "boot-b")
    assert second.read("a2")["state"] == "absent"
    assert second.start("a2", 2, RUN) is True
    assert second.start("a2", 2, RUN) is False
    assert Journal(str(tmp_path), "boot-c").read("a2")["state"] == "unknown"


def test_a_journal_lets_go_of_its_log(tmp_path: Path) -> None:
    """Each boot's journal holds its log open; one closed or dropped lets it go (a runtime
    server boots a journal per session start, for as long as it runs)."""
    import gc

    def holds(fd: int, path: Path) -> bool:
        try:
            return os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            return False

    held = []
    for i in range(20):
        journal = Journal(str(tmp_path), f"boot-{i}")
        journal.start(f"a{i}", 1, RUN)
        held.append((journal._fd, tmp_path / f"boot-{i}.log"))
    del journal
    gc.collect()
    assert not [path for fd, path in held if holds(fd, path)]
    closed = Journal(str(tmp_path), "boot-x")
    fd = closed._fd
    closed.close()
    assert not holds(fd, tmp_path / "boot-x.log")
    with pytest.raises(OSError):
        closed.start("a99", 1, RUN)
    assert Journal(str(tmp_path), "boot-y").read("a19")["state"] == "unknown"
