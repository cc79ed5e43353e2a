"""The action journal: one JSON record per action id, on disk, written atomically.

Records and output files are owner-only (0600, in a 0700 folder), and hold no secret
value: the caller masks the action before ``start`` and the outcome before ``finish``.
A record is written ``started`` (with the epoch, the server's boot id and the time),
durably (fsynced), before anything runs, and rewritten ``finished`` with the outcome once
the action ends (atomically, without fsync: see ``Journal.finish``).
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
from typing import Any

from .util import private_dir, read_json, safe_name, wall_time, write_json_atomic

logger = logging.getLogger(__name__)


class Journal:
    """The journal folder of one sandbox server boot."""

    def __init__(self, root: str, boot_id: str) -> None:
        self.root = root
        self.boot_id = boot_id
        self._cond = threading.Condition()
        self._unwritten: dict[str, dict[str, Any]] = {}
        """Finished records the disk could not take yet, by action id."""
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
            if read_json(self.record_path(action_id)) is not None:
                return False
            record = {
                "action_id": action_id,
                "status": "started",
                "epoch": epoch,
                "boot_id": self.boot_id,
                "started_at": wall_time(),
                "action": action,
            }
            write_json_atomic(self.record_path(action_id), record)
            return True

    def finish(self, action_id: str, outcome: dict[str, Any]) -> None:
        """Journal the outcome of a started action and wake whoever waits for it.

        If the record cannot be written (the disk is full), the outcome is kept in memory
        and served from there, and written by a later ``finish`` or ``read``: a full disk
        delays the record, it never loses an outcome this server boot knows.
        """
        with self._cond:
            record = read_json(self.record_path(action_id)) or {"action_id": action_id}
            record.update(status="finished", finished_at=wall_time(), outcome=outcome)
            self._unwritten[action_id] = record
            self._flush_unwritten()
            self._cond.notify_all()

    def _flush_unwritten(self) -> None:
        """Write the finished records a full disk held back (called with the lock held)."""
        for action_id, record in list(self._unwritten.items()):
            try:
                # Not fsynced: only a host crash can lose it, and then the action reads as
                # unknown (recorded lost, never re-run). The started record must last.
                write_json_atomic(self.record_path(action_id), record, durable=False)
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
            record = self._unwritten.get(action_id) or read_json(self.record_path(action_id))
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
