"""What a daemon records when a session comes to it from another home, held at the
instant a crash would break it: a take committed in the store, the daemon gone before it
recorded what the old host may have run. The next arrival of the session (the restarted
daemon carrying on what is placed on it, or a command routed to it) records it then, so
the new journal, which never saw the action, is never asked and never runs it again."""

from __future__ import annotations

from pathlib import Path

import pytest

from trouper.cluster.key import ClusterKey
from trouper.cluster.member import JOURNAL_META, Member
from trouper.config.models import LLMConfig, SessionConfig
from trouper.home.paths import Home
from trouper.messages.actions import RunCommand
from trouper.messages.events import ActionEvent, MessageEvent, ObservationEvent


def member_of(postgres_url: str, tmp_path: Path) -> tuple[Member, list[str]]:
    key = ClusterKey.load(tmp_path / "cluster.key", create=True)
    member = Member(postgres_url, key, Home.at(tmp_path / "home"), name="me",
                    url="http://127.0.0.1:1", capabilities=["local"], heartbeat_s=1.0,
                    dead_after_s=3.0)
    restored: list[str] = []
    member.restore = restored.append
    return member, restored


def a_session_with_an_action_in_flight(member: Member, tmp_path: Path, journal: str) -> str:
    """A session placed on ``member`` (the take committed) whose last action has no
    outcome, sent to the sandbox of the home ``journal``."""
    store = member.store
    (tmp_path / "ws").mkdir(exist_ok=True)
    store.create_session("s1", SessionConfig(task="t", llm=LLMConfig(model="m"),
                                             workspace=str(tmp_path / "ws")))
    owner = store.claim_owner("s1")
    store.append("s1", [MessageEvent(source="user", text="t"), ActionEvent(
        action_id="a1", turn_id="t1", tool_call_id="c1", tool="run",
        arguments='{"command": "echo once >> ledger.txt"}',
        action=RunCommand(command="echo once >> ledger.txt"))], owner=owner)
    store.put_meta("s1", JOURNAL_META, journal)
    member.registry.set_placement("s1", "me", ["local"])
    return "s1"


@pytest.mark.parametrize("arrival", ["carry_on", "route"])
def test_a_take_cut_short_by_a_crash_is_completed_at_the_next_arrival(
        postgres_url, tmp_path, arrival):
    member, restored = member_of(postgres_url, tmp_path)
    try:
        sid = a_session_with_an_action_in_flight(member, tmp_path, "/home/of/the/old/host")
        if arrival == "carry_on":  # the restarted daemon carries on what is placed on it
            member.carry_on(sid)
            assert restored == [sid]
        else:  # a command reaches the daemon the session is placed on
            assert member.route(sid) is None
        log = member.store.read(sid)
        [lost] = [e for e in log if isinstance(e, ObservationEvent)]
        assert (lost.action_id, lost.outcome.status) == ("a1", "lost")
        assert member.store.get_meta(sid, JOURNAL_META) == str(tmp_path / "home")
        member.carry_on(sid)  # arriving again records nothing more
        assert len(member.store.read(sid)) == len(log)
    finally:
        member.close()


def test_a_session_whose_journal_is_this_home_s_is_left_to_that_journal(postgres_url,
                                                                        tmp_path):
    member, restored = member_of(postgres_url, tmp_path)
    try:
        sid = a_session_with_an_action_in_flight(member, tmp_path, str(tmp_path / "home"))
        member.carry_on(sid)
        assert restored == [sid]
        assert not [e for e in member.store.read(sid) if isinstance(e, ObservationEvent)]
    finally:
        member.close()


def test_a_drain_places_a_session_on_a_peer_only_with_the_call_that_tells_it(
        postgres_url, tmp_path):
    """The drain's placement and the peer's ``carry_on`` call are one transaction: a
    daemon dying between them (here: the call failing) leaves the session where it was,
    never on a peer that does not know to carry it on."""
    from trouper.cluster.registry import Me

    member, _ = member_of(postgres_url, tmp_path)
    try:
        sid = a_session_with_an_action_in_flight(member, tmp_path, str(tmp_path / "home"))
        registry = member.registry
        registry.register(member.me)
        peer = Me(name="peer", url="", host="h", home="/elsewhere", pid=1,
                  capabilities=("local",), heartbeat_s=1.0, dead_after_s=30.0)
        registry.set_state("peer", registry.register(peer), "alive")

        def dies(conn: object, session_id: str, to: str) -> None:
            raise RuntimeError("the daemon died here")

        with pytest.raises(RuntimeError):
            registry.hand_over("me", dies)
        assert registry.placement(sid)[0] == "me"
        told: list[tuple[str, str]] = []
        moved = registry.hand_over("me", lambda conn, s, to: told.append((s, to)))
        assert moved == {sid: "peer"} and told == [(sid, "peer")]
        assert registry.placement(sid)[0] == "peer"
    finally:
        member.close()
