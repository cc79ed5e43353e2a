"""The SessionSupervisor closes its sandbox whether its RuntimeProxy lives or
not (``actors/sandbox_closing.py``), in Thespian's in-process simple system with a real
Controller on a real store and a fake proxy.

The cause of the ``Exited`` containers a program's close left: a supervisor whose proxy
was down (restarting after a crash, or given up on after repeated ones) answered the
shutdown at once and closed nothing, and a restart timer firing after the shutdown
started a fresh proxy (and sandbox) as the tree went away.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).parent))  # the tree's fakes (pytest imports by path)
from test_late_messages_tree import (  # noqa: E402
    FakeRuntime,
    FakeSession,
    Tree,
    _runtime_boots,
    system,  # noqa: F401 - a fixture
)
from thespian.actors import ActorExitRequest  # noqa: E402

from trouper.config.models import RestartPolicy  # noqa: E402
from trouper.home.paths import Home  # noqa: E402
from trouper.messages.events import AgentState, RuntimeEvent  # noqa: E402
from trouper.messages.protocol import Accepted, SandboxClosed  # noqa: E402
from trouper.messages.tree import CloseFor, Shutdown, ShutdownDone  # noqa: E402
from trouper.store import open_store  # noqa: E402


class ClosingRuntime(FakeRuntime):
    """The fake proxy, as a one-shot closer too (``CloseFor``): it answers, then exits."""

    closed_for: ClassVar[list[str]] = []

    def receiveMessage(self, msg: Any, sender: Any) -> None:  # noqa: N802
        if isinstance(msg, CloseFor):
            ClosingRuntime.closed_for.append(msg.request_id)
            self.send(sender, SandboxClosed(request_id=msg.request_id,
                                            session_id=msg.start.session_id))
            self.send(self.myAddress, ActorExitRequest())
            return
        super().receiveMessage(msg, sender)


class ClosingSession(FakeSession):
    runtime_class = ClosingRuntime


def closed_in_log(tree: Tree) -> bool:
    store = open_store(tree.home)
    try:
        return any(isinstance(e, RuntimeEvent) and e.phase == "closed"
                   for e in store.read(tree.sid))
    finally:
        store.close()


def test_a_stop_ends_the_sandbox_through_the_proxy_and_a_resume_boots_a_fresh_one(
        system, tmp_path: Path):  # noqa: F811 - the fixture imported above
    tree = Tree(system, Home.at(tmp_path / "home"), tmp_path, session_class=ClosingSession)
    tree.boot()
    assert isinstance(tree.command("stop"), Accepted)  # answered once the sandbox ended
    assert tree.view().state == AgentState.STOPPED and closed_in_log(tree)
    assert _runtime_boots() == 1  # no proxy started for nothing
    assert isinstance(tree.command("resume"), Accepted)
    assert _runtime_boots() == 2 and tree.view().state == AgentState.RUNNING


def test_a_shutdown_with_the_proxy_given_up_on_closes_through_a_one_shot_proxy(
        system, tmp_path: Path):  # noqa: F811 - the fixture imported above
    ClosingRuntime.closed_for = []
    policy = RestartPolicy(intensity=0, giveup_cooldown_s=600)
    tree = Tree(system, Home.at(tmp_path / "home"), tmp_path, policy=policy,
                session_class=ClosingSession)
    tree.boot()
    proxy = [m for m in FakeRuntime.booted][-1]
    system.tell(proxy, ActorExitRequest())  # it dies: past the intensity, given up on
    assert tree.view().state == AgentState.ERROR
    tree.tell(Shutdown(request_id="close"), via=tree.parent)
    [done] = tree.got(ShutdownDone, at=tree.parent)
    assert ClosingRuntime.closed_for == ["close"] and done.sessions == [tree.sid]
    assert _runtime_boots() == 1  # and nothing started after the shutdown
