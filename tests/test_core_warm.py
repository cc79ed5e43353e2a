"""``core.warm.warm_up``: a session through the core in memory, before the actor system
forks. It must run cleanly (a failure would only be logged where the system opens) and
touch nothing outside the process."""

from __future__ import annotations

from pathlib import Path

from trouper.core.warm import WARM_UP_WORKSPACE, warm_up


def test_the_warm_up_session_runs_through_the_core_and_writes_nothing():
    warm_up()
    warm_up()  # again: nothing it keeps makes a second run differ
    assert not Path(WARM_UP_WORKSPACE).exists()
