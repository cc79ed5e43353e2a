"""processes.py: what trouper and its tests read of the process table."""

from __future__ import annotations

import os
import signal
import subprocess
import threading

from trouper.host import processes


def test_children_are_found_whoever_of_its_threads_started_them():
    """``children_of`` reads each thread's children file: a child a worker thread
    started is as much this process's as the main thread's (so for the scan, used on a
    kernel without those files)."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        started.append(subprocess.Popen(["sleep", "60"]))
        thread = threading.Thread(target=lambda: started.append(subprocess.Popen(["sleep", "60"])))
        thread.start()
        thread.join()
        mine = sorted(p.pid for p in started)
        assert set(mine) <= set(processes.children_of(os.getpid()))
        assert set(mine) <= set(processes._children_by_scan(os.getpid()))  # noqa: SLF001
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
    assert not set(mine) & set(processes.children_of(os.getpid()))
    assert processes.children_of(2**22 + 1) == []  # no such process


DEADLOCK_PROBE = """
import os, signal, sys, threading
from trouper.cli.drive import Interrupts

interrupts = Interrupts()
with interrupts.installed():
    with interrupts.stop._cond:  # as inside Event.wait: the event's lock is held
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, lock held
        for _ in range(1000):
            pass  # a few bytecodes: the handler has run once this loop ends
    print("set" if interrupts.stop.wait(30) else "not set", interrupts.signum, flush=True)
"""


def test_a_signal_that_lands_while_the_stop_event_is_locked_does_not_hang_the_cli():
    """A handler that set the CLI's stop event itself deadlocked when the signal landed
    while the main thread held the event's lock (Event.wait takes it, ten times a
    second while a command follows a session): the command then ran on for good."""
    import sys

    done = subprocess.run([sys.executable, "-c", DEADLOCK_PROBE], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.split() == ["set", str(int(signal.SIGTERM))], done.stderr
