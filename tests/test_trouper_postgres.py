"""A Trouper on a PostgreSQL store: sessions run and resume as on SQLite, the store is
chosen by argument or by ``TROUPER_STORE``, and ``mine`` picks what a Trouper carries on."""

from __future__ import annotations

import pytest

from trouper import AgentState, Trouper
from trouper.exceptions import StoreError
from trouper.messages.events import ActionEvent, ObservationEvent
from trouper.store import open_store, shown_url, store_url
from trouper.testing import check_log

pytestmark = pytest.mark.slow  # actor systems on a database server

STEPS = [{"tool": "run", "args": {"command": "echo one > one.txt"}},
         {"tool": "finish", "args": {"message": "done"}}]


def test_a_session_runs_to_its_end_on_postgres_and_nothing_lands_in_sqlite(
        tmp_path, postgres_url, scripted):
    _, llm = scripted(STEPS)
    home = tmp_path / "home"
    with Trouper(home=home, store=postgres_url) as t:
        session = t.start_session("make one.txt", llm=llm, workspace=tmp_path / "ws")
        assert session.wait(timeout=90) == AgentState.FINISHED
        assert t.store_url == postgres_url
    assert not (home / "trouper.db").exists()  # the home keeps no store of its own
    store = open_store(postgres_url)
    try:
        log = store.read(session.id)
    finally:
        store.close()
    assert check_log(log) == []
    assert [type(e) for e in log if isinstance(e, ActionEvent | ObservationEvent)] == \
        [ActionEvent, ObservationEvent, ActionEvent, ObservationEvent]
    assert (tmp_path / "ws" / "one.txt").read_text() == "one\n"


def test_trouper_store_env_names_the_store_and_mine_picks_what_resumes(
        tmp_path, postgres_url, scripted, monkeypatch):
    _, llm = scripted([{"say": "what next?"}])
    monkeypatch.setenv("TROUPER_STORE", postgres_url)
    home = tmp_path / "home"
    assert store_url(_home(home)) == postgres_url
    store = open_store(postgres_url)
    try:
        with Trouper(home=home, resume=False) as t:
            kept = t.start_session("a", llm=llm, session_id="kept")
            left = t.start_session("b", llm=llm, session_id="left")
            for s in (kept, left):
                assert s.wait(timeout=90) == AgentState.AWAITING_USER_INPUT
        # put both back to RUNNING in the log, as a host that died mid-step leaves them
        for sid in ("kept", "left"):
            from trouper.messages.events import StateChanged

            store.append(sid, [StateChanged(source="environment", state=AgentState.RUNNING,
                                            reason="test: died mid-step")],
                         owner=store.claim_owner(sid))
        with Trouper(home=home, mine=lambda r: r.session_id == "kept") as t:
            assert t.session("kept").wait(timeout=90) == AgentState.AWAITING_USER_INPUT
            assert store.session("left").state == AgentState.RUNNING  # not carried on
    finally:
        store.close()


def test_a_store_that_cannot_open_is_refused_before_any_process_with_no_password(tmp_path):
    url = "postgresql://trouper:hunter2-secret@127.0.0.1:1/trouper"
    with pytest.raises(StoreError) as caught:
        Trouper(home=tmp_path / "home", store=url, ask_timeout_s=5)
    assert "hunter2-secret" not in str(caught.value)
    assert shown_url(url) == "postgresql://trouper:***@127.0.0.1:1/trouper"


def _home(root):
    from trouper.home.paths import Home

    return Home.at(root)
