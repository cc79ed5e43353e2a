"""``core.warm.warm_up``: a session through the core in memory, before the actor system
forks. It must run cleanly (a failure would only be logged where the system opens) and
touch nothing outside the process: no file, and no line in the program's log, where a
made-up session would read as a real one."""

from __future__ import annotations

import logging
from pathlib import Path

from trouper.core.warm import WARM_UP_WORKSPACE, warm_up


def test_the_warm_up_session_runs_through_the_core_and_writes_nothing(caplog):
    caplog.set_level(logging.DEBUG, logger="trouper")
    warm_up()
    warm_up()  # again: nothing it keeps makes a second run differ
    assert not Path(WARM_UP_WORKSPACE).exists()
    assert [r.getMessage() for r in caplog.records] == []
    core = logging.getLogger("trouper.core.machine")
    assert core.isEnabledFor(logging.DEBUG)  # the core's loggers are as they were
