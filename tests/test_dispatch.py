"""Actors find a message's handler by its type, read from the handlers' annotations."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from trouper.actors.base import TrouperActor, _handlers_of
from trouper.actors.controller import Controller
from trouper.actors.llm_broker import LLMBroker
from trouper.actors.root import RootSupervisor
from trouper.actors.runtime_proxy import RuntimeProxy
from trouper.actors.session_supervisor import SessionSupervisor
from trouper.messages.base import Frozen
from trouper.messages.protocol import Complete, Execute, StartSession
from trouper.messages.tree import BootController


def test_every_actor_knows_its_messages_by_type():
    assert RuntimeProxy._handlers[Execute] == "on_execute"
    assert LLMBroker._handlers[Complete] == "on_complete"
    assert RootSupervisor._handlers[StartSession] == "on_start_session"
    assert Controller._handlers[BootController] == "on_boot_controller"
    for actor in (Controller, LLMBroker, RootSupervisor, RuntimeProxy, SessionSupervisor):
        for kind, name in actor._handlers.items():
            assert issubclass(kind, Frozen) and callable(getattr(actor, name)), (actor, name)


class Ping(Frozen):
    kind: Literal["ping"] = "ping"


class FakePing(Frozen):
    kind: Literal["ping"] = "ping"  # the same tag, another type: not a Ping


def test_a_tag_is_not_a_type_and_hooks_are_not_handlers():
    class Pinged(TrouperActor):
        def on_ping(self, msg: Ping, sender: Any) -> None: ...

        def on_timer_x(self, token: int) -> None: ...

        def on_child_gave_up(self, role: str, reason: str, retry_in_s: float | None) -> None:
            ...

    assert Pinged._handlers == {Ping: "on_ping"}
    assert FakePing not in Pinged._handlers


def test_two_handlers_for_one_type_fail_when_the_class_is_made():
    class Twice:
        def on_a(self, msg: Ping, sender: Any) -> None: ...

        def on_b(self, msg: Ping, sender: Any) -> None: ...

    with pytest.raises(TypeError, match="both handle Ping"):
        _handlers_of(Twice)


def test_a_ready_descriptor_goes_to_its_owner_and_a_stranger_is_dropped(monkeypatch, caplog):
    """The actor's own watched descriptors reach ``on_fd_ready``; one it does not watch (a
    descriptor it closed a turn ago) is dropped with a log line, never a crash."""
    import logging
    import os

    from thespian.actors import WatchMessage

    from trouper.actors import base

    monkeypatch.setattr(base, "die_with_parent", lambda: None)  # this is the test process
    monkeypatch.setattr(base, "name_process", lambda name: None)  # and keeps its name
    monkeypatch.setattr(base.gc, "freeze", lambda: None)

    class Watcher(TrouperActor):
        def __init__(self, fd: int) -> None:
            super().__init__()
            self.fd, self.ready = fd, []

        def watched_fds(self) -> list[int]:
            return [self.fd]

        def on_fd_ready(self, fd: int) -> None:
            self.ready.append(fd)

    read, write = os.pipe()
    try:
        actor = Watcher(read)
        assert actor._watched() == [read]
        with caplog.at_level(logging.INFO):
            actor._dispatch(WatchMessage([read, 999]), None)
        assert actor.ready == [read]
        assert "descriptor 999 is not one this actor watches" in caplog.text
    finally:
        os.close(read)
        os.close(write)
