"""runtimes/sandbox/workers.py: actions run on kept threads, as many at once as asked."""

from __future__ import annotations

import threading

from trouper.runtimes.sandbox.workers import Workers


def test_a_thread_is_made_only_when_none_is_idle_and_jobs_run_side_by_side() -> None:
    workers = Workers()
    for _ in range(5):  # one after another: one thread does them all
        assert workers.submit(lambda: None).wait(5)
    assert workers.threads == 1 and workers.running() == []
    release = threading.Event()
    started = [threading.Event() for _ in range(3)]

    def held(mine: threading.Event) -> None:
        mine.set()
        release.wait(5)

    done = [workers.submit(held, s) for s in started]
    assert all(s.wait(5) for s in started), "a job waited for another to end"
    assert workers.threads == 3 and len(workers.running()) == 3
    release.set()
    assert all(d.wait(5) for d in done) and workers.running() == []


def test_a_job_that_raises_leaves_its_thread_working(caplog) -> None:
    workers = Workers()

    def broken() -> None:
        raise RuntimeError("a bug")

    assert workers.submit(broken).wait(5)
    ran = threading.Event()
    assert workers.submit(ran.set).wait(5) and ran.is_set()
    assert workers.threads == 1
    assert "an action's thread failed" in caplog.text
