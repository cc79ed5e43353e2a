"""processes.py: what trouper and its tests read of the process table."""

from __future__ import annotations

import os
import subprocess
import threading

from trouper import processes


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
