"""The action journal: the records of the actions, on disk, one log per server boot.

Records and output files are owner-only (0600, in a 0700 folder), and hold no secret
value: the caller masks the action before ``start`` and the outcome before ``finish``.
Each server boot appends to a log of its own (``<boot id>.log``, made when the boot
starts, its name fsynced with the folder): one JSON line per change of a record, the
record whole as it now is. An action's record is appended ``started`` (with the epoch,
the boot id and the time), durably (the log fsynced), before anything runs; once the
action ends its ``finished`` line with the outcome is appended (without fsync: see
``Journal.finish``). Reading an action's record merges its lines. Nothing is ever
rewritten, replaced or made per action: on an ext4 without a journal, as here, every new
inode skips the inodes freed in the last minutes, reading their table blocks, so a file
per action cost a millisecond a step of kernel time whenever anything on the disk had
deleted files (and freeing one per action, as a rename over a record does, made it worse).
This boot's lines are found by their place in its log, its latest records are also kept
in memory (a step reads nothing); the logs of earlier boots are read once, when first
needed. Records an earlier version wrote (a file ``<action id>.json`` each) are read too.
Reading a record gives one of four states:

- ``absent``: the id was never seen; it is safe to run it now, for the first time;
- ``running``: started by this server boot and not finished yet;
- ``finished``: the outcome is in the record;
- ``unknown``: started by an earlier boot that never finished it; nobody can know how it
  ended (the caller records it as lost, and never runs it again).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Tuple

from .util import (
    fsync_dir,
    merge_json_lines,
    open_private,
    private_dir,
    read_json_lines,
    safe_name,
    wall_time,
)

logger = logging.getLogger(__name__)

KEPT_RECORDS = 64
"""This boot's records kept in memory (the latest started or finished)."""
LOG_SUFFIX = ".log"

Place = Tuple[str, int, int]  # noqa: UP006 - evaluated: Python 3.8 (a container's)
"""Where a line of a record is: (log path, offset, length)."""


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
        self.log_path = os.path.join(root, safe_name(boot_id) + LOG_SUFFIX)
        self._fd = open_private(self.log_path, os.O_WRONLY | os.O_APPEND)
        self._size = os.fstat(self._fd).st_size
        fsync_dir(root)  # the log's name lasts before any line in it has to
        self._mine: dict[str, list[Place]] = {}
        """Where each of this boot's records has its lines in this boot's log."""
        self._earlier: dict[str, list[Place]] | None = None
        """The same for the logs of earlier boots (read once, when first needed)."""

    def record_path(self, action_id: str) -> str:
        """Where an earlier version kept the record of ``action_id`` (a file each)."""
        return os.path.join(self.root, safe_name(action_id) + ".json")

    def output_path(self, action_id: str) -> str:
        """Where the output of a ``run`` is appended as it arrives."""
        return os.path.join(self.root, safe_name(action_id) + ".out")

    def start(self, action_id: str, epoch: int, action: dict[str, Any]) -> bool:
        """Journal ``action_id`` as started; False (and nothing written) if already known.
        Raises OSError (and the action counts as never started) when the line cannot be
        made durable."""
        with self._cond:
            if self._known(action_id):
                return False
            record = {
                "action_id": action_id,
                "status": "started",
                "epoch": epoch,
                "boot_id": self.boot_id,
                "started_at": wall_time(),
                "action": action,
            }
            self._append(action_id, record, durable=True)
            self._keep(action_id, record)
            return True

    def _known(self, action_id: str) -> bool:
        """Whether any boot started ``action_id`` (called with the lock held)."""
        if action_id in self._kept or action_id in self._mine:
            return True
        if action_id in self._earlier_places():
            return True
        legacy = self.record_path(action_id)
        if not os.path.lexists(legacy):
            return False
        if read_json_lines(legacy) is not None:
            return True
        os.unlink(legacy)  # no record in it (not trouper's writing): as if absent
        return False

    def _append(self, action_id: str, record: dict[str, Any], durable: bool) -> None:
        """One line at the end of this boot's log (fsynced with ``durable``); counted only
        once written whole (and durable). A line a full disk cut short stays a line of its
        own (each starts with a newline), which reading skips."""
        line = b"\n" + json.dumps(record, sort_keys=True).encode("utf-8")
        offset = self._size
        try:
            rest = line
            while rest:
                rest = rest[os.write(self._fd, rest):]
            if durable:
                os.fsync(self._fd)
        except OSError:
            self._size = os.fstat(self._fd).st_size
            raise
        self._size += len(line)
        self._mine.setdefault(action_id, []).append((self.log_path, offset + 1, len(line) - 1))

    def _keep(self, action_id: str, record: dict[str, Any]) -> None:
        self._kept[action_id] = record
        self._kept.move_to_end(action_id)
        while len(self._kept) > KEPT_RECORDS:
            self._kept.popitem(last=False)

    def _record(self, action_id: str) -> dict[str, Any] | None:
        """The record of ``action_id`` (called with the lock held)."""
        found = self._unwritten.get(action_id) or self._kept.get(action_id)
        if found is not None:
            return found
        places = self._mine.get(action_id) or self._earlier_places().get(action_id)
        if places:
            return _merged(places)
        return read_json_lines(self.record_path(action_id))

    def _earlier_places(self) -> dict[str, list[Place]]:
        """Where the records of earlier boots are (their logs, read on the first call)."""
        if self._earlier is None:
            self._earlier = {}
            for name in sorted(os.listdir(self.root)):
                path = os.path.join(self.root, name)
                if name.endswith(LOG_SUFFIX) and path != self.log_path:
                    for action_id, place in _lines(path):
                        self._earlier.setdefault(action_id, []).append(place)
        return self._earlier

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
                # unknown (recorded lost, never re-run). The started line must last.
                self._append(action_id, record, durable=False)
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

    def close(self) -> None:
        """Let go of this boot's log (its lines stay on disk); a later write raises."""
        with self._cond:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __del__(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def _lines(path: str) -> list[tuple[str, Place]]:
    """Each whole record line of the log at ``path``: (its action id, where it is)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    found = []
    offset = 0
    for raw in data.split(b"\n"):
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("action_id"), str):
            found.append((value["action_id"], (path, offset, len(raw))))
        offset += len(raw) + 1
    return found


def _merged(places: list[Place]) -> dict[str, Any] | None:
    """The record whose lines are at ``places``, merged in order (later keys win)."""
    lines = []
    for path, offset, length in places:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                lines.append(f.read(length))
        except OSError:
            continue
    return merge_json_lines(lines)
