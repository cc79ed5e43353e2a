"""A commit whose answer is lost: PostgreSQL wrote the events, the writer heard an error.
The session must go on from what the log holds: no event twice, no action run twice,
every action one outcome."""

from __future__ import annotations

import pytest
from test_store_contract import make_config

from trouper import AgentState, Trouper
from trouper.exceptions import StoreError
from trouper.messages.events import ActionEvent, MessageEvent
from trouper.store import open_store
from trouper.testing import check_log, wait_until
from trouper.testing.pg_proxy import AckDropper

pytestmark = pytest.mark.slow


def test_the_proxy_loses_the_answer_of_a_commit_that_stands(postgres_url):
    with AckDropper(postgres_url) as proxy:
        store = open_store(proxy.url, timeout_s=5)
        direct = open_store(postgres_url)
        try:
            store.create_session("s1", make_config())
            store.append("s1", [MessageEvent(source="user", text="one")])
            proxy.arm(1)
            with pytest.raises(StoreError):
                store.append("s1", [MessageEvent(source="user", text="two")])
            assert proxy.dropped == 1
            assert [e.text for e in direct.read("s1")] == ["one", "two"]  # it committed
            store.append("s1", [MessageEvent(source="user", text="three")])  # and goes on
            assert [e.seq for e in direct.read("s1")] == [1, 2, 3]
        finally:
            store.close()
            direct.close()


def test_a_session_whose_appends_lose_their_answers_runs_each_action_once(
        tmp_path, postgres_url, scripted):
    steps = [{"tool": "run", "args": {"command": f"echo step {i} >> ledger.txt"},
              "delay_s": 0.1} for i in range(10)]
    _, llm = scripted([*steps, {"tool": "finish", "args": {"message": "done"}}])
    with AckDropper(postgres_url) as proxy, \
            Trouper(home=tmp_path / "home", store=proxy.url) as t:
        session = t.start_session("count", llm=llm, workspace=tmp_path / "ws",
                                  max_iterations=100)
        wait_until(lambda: session.info().actions >= 2, 90, "two actions")
        proxy.arm(3)  # the next three appends: their commits stand, their answers are lost
        assert session.wait(timeout=240) == AgentState.FINISHED
        dropped = proxy.dropped
    assert dropped >= 1
    store = open_store(postgres_url)
    try:
        log = store.read(session.id)
    finally:
        store.close()
    assert check_log(log) == []  # seq contiguous, every action exactly one outcome
    ids = [e.action_id for e in log if isinstance(e, ActionEvent)]
    assert len(ids) == len(set(ids))
    ledger = (tmp_path / "ws" / "ledger.txt").read_text().splitlines()
    assert len(ledger) == len(set(ledger))  # no command ran twice
    assert set(ledger) <= {f"step {i}" for i in range(10)}
