"""The action journal: one JSON record per action id, on disk, written atomically.

Records and output files are owner-only (0600, in a 0700 folder), and hold no secret
value: the caller masks the action before ``start`` and the outcome before ``finish``.
A record is created ``started`` (with the epoch, the server's boot id and the time),
durably (fsynced), before anything runs; once the action ends a ``finished`` line with the
outcome is appended to it (without fsync: see ``Journal.finish``). Reading merges the
lines. No record file is ever rewritten or replaced: a freed inode per action made every
file creation on ext4 slower for minutes after (``util.create_json_durable``). This boot's
running and latest finished records are also kept in memory, so a step reads no file;
the disk stays the truth.
Reading a record gives one of four states:

- ``absent``: the id was never seen; it is safe to run it now, for the first time;
- ``running``: started by this server boot and not finished yet;
- ``finished``: the outcome is in the record;
- ``unknown``: started by an earlier boot that never finished it; nobody can know how it
  ended (the caller records it as lost, and never runs it again).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any

from .util import (
    append_json_line,
    create_json_durable,
    private_dir,
    read_json_lines,
    safe_name,
    wall_time,
)

logger = logging.getLogger(__name__)

KEPT_RECORDS = 64
"""This boot's records kept in memory (the latest started or finished)."""


class Journal:
    """The journal folder of one sandbox server boot."""

    def __init__(self, root: str, boot_id: str) -> None:
        self.root = root
        self.boot_id = boot_id
        self._cond = threading.Condition()
        self._unwritten: dict[str, dict[str, Any]] = {}
        """Finished records the disk could not take yet, by action id."""
        self._kept: OrderedDict[str, dict[str, Any]] = OrderedDict()
        """This boot's latest records, as on disk (a cache: reads fall back to the disk)."""
        private_dir(root)

    def record_path(self, action_id: str) -> str:
        """Where the record of ``action_id`` lives."""
        return os.path.join(self.root, safe_name(action_id) + ".json")

    def output_path(self, action_id: str) -> str:
        """Where the output of a ``run`` is appended as it arrives."""
        return os.path.join(self.root, safe_name(action_id) + ".out")

    def start(self, action_id: str, epoch: int, action: dict[str, Any]) -> bool:
        """Journal ``action_id`` as started; False (and nothing written) if already known."""
        with self._cond:
            if action_id in self._kept:
                return False
            path = self.record_path(action_id)
            record = {
                "action_id": action_id,
                "status": "started",
                "epoch": epoch,
                "boot_id": self.boot_id,
                "started_at": wall_time(),
                "action": action,
            }
            try:
                create_json_durable(path, record)
            except FileExistsError:
                if read_json_lines(path) is not None:
                    return False
                os.unlink(path)  # no record in it (not trouper's writing): as if absent
                create_json_durable(path, record)
            self._keep(action_id, record)
            return True

    def _keep(self, action_id: str, record: dict[str, Any]) -> None:
        self._kept[action_id] = record
        self._kept.move_to_end(action_id)
        while len(self._kept) > KEPT_RECORDS:
            self._kept.popitem(last=False)

    def _record(self, action_id: str) -> dict[str, Any] | None:
        """The record of ``action_id`` (called with the lock held)."""
        return (self._unwritten.get(action_id) or self._kept.get(action_id)
                or read_json_lines(self.record_path(action_id)))

    def finish(self, action_id: str, outcome: dict[str, Any]) -> None:
        """Journal the outcome of a started action and wake whoever waits for it.

        If the record cannot be written (the disk is full), the outcome is kept in memory
        and served from there, and written by a later ``finish`` or ``read``: a full disk
        delays the record, it never loses an outcome this server boot knows.
        """
        with self._cond:
            record = {**(self._record(action_id) or {"action_id": action_id}),
                      "status": "finished", "finished_at": wall_time(), "outcome": outcome}
            self._unwritten[action_id] = record
            self._keep(action_id, record)
            self._flush_unwritten()
            self._cond.notify_all()

    def _flush_unwritten(self) -> None:
        """Write the finished records a full disk held back (called with the lock held)."""
        for action_id, record in list(self._unwritten.items()):
            try:
                # Not fsynced: only a host crash can lose it, and then the action reads as
                # unknown (recorded lost, never re-run). The started record must last.
                path = self.record_path(action_id)
                try:
                    append_json_line(path, record)
                except FileNotFoundError:  # never started by this journal: the whole record
                    create_json_durable(path, record)
            except OSError as e:
                logger.warning("journal: cannot write the outcome of %s yet (%s); keeping "
                               "it in memory", action_id, e.strerror or e)
                return
            del self._unwritten[action_id]

    def read(self, action_id: str) -> dict[str, Any]:
        """The state of ``action_id`` as the API reports it."""
        with self._cond:
            if self._unwritten:
                self._flush_unwritten()
            record = self._record(action_id)
        if record is None or record.get("action_id") != action_id:
            return {"action_id": action_id, "state": "absent", "epoch": 0, "outcome": None}
        if record.get("status") == "finished":
            state = "finished"
        elif record.get("boot_id") == self.boot_id:
            state = "running"
        else:
            state = "unknown"
        return {
            "action_id": action_id,
            "state": state,
            "epoch": int(record.get("epoch", 0)),
            "outcome": record.get("outcome") if state == "finished" else None,
        }

    def wait(self, action_id: str, wait_s: float) -> dict[str, Any]:
        """The state of ``action_id``, waiting up to ``wait_s`` while it is running."""
        deadline = time.monotonic() + max(0.0, wait_s)
        with self._cond:
            while True:
                record = self.read(action_id)
                remaining_s = deadline - time.monotonic()
                if record["state"] != "running" or remaining_s <= 0 or self.fenced():
                    return record
                self._cond.wait(remaining_s)

    def fenced(self) -> bool:
        """True when no outcome will be journaled any more (a subclass's say): stop
        waiting for one."""
        return False
