"""The sandbox's action journal (``runtimes/sandbox/journal.py``): what each state means
across server boots, and that a start the disk refuses never runs (I2)."""

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
    assert (tmp_path / "journal" / "a1.json").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "journal").stat().st_mode & 0o777 == 0o700


def test_a_record_is_never_replaced_and_this_boots_records_are_read_from_memory(
        tmp_path: Path, monkeypatch) -> None:
    """One inode per record for its whole life: replacing it freed an inode per action,
    which made ext4's file creation scan past them (2.3 ms of kernel time a step)."""
    journal = Journal(str(tmp_path), "boot-a")
    assert journal.start("a1", 1, RUN)
    born = (tmp_path / "a1.json").stat().st_ino

    def no_disk_reads(path: str) -> None:
        raise AssertionError(f"read {path} from disk")

    monkeypatch.setattr("trouper.runtimes.sandbox.journal.read_json_lines", no_disk_reads)
    assert journal.read("a1")["state"] == "running"
    journal.finish("a1", {"status": "ok", "content": "hi"})
    assert journal.read("a1")["outcome"] == {"status": "ok", "content": "hi"}
    assert journal.start("a1", 1, RUN) is False
    monkeypatch.undo()
    assert (tmp_path / "a1.json").stat().st_ino == born
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a1.json"]  # no temporary left
    assert Journal(str(tmp_path), "boot-b").read("a1")["state"] == "finished"


def test_an_outcome_line_cut_short_is_skipped_and_a_later_whole_one_counts(
        tmp_path: Path) -> None:
    first = Journal(str(tmp_path), "boot-a")
    assert first.start("a1", 1, RUN) and first.start("a2", 1, RUN)
    for name in ("a1", "a2"):  # the server died writing the outcome: half a line
        with open(tmp_path / f"{name}.json", "ab") as f:
            f.write(b'\n{"status": "finished", "outc')
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
