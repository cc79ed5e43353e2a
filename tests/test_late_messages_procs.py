"""I5/I6 (docs/promises.md) for the RuntimeProxy and the LLMBroker: every
handler is total.

Each needs real collaborators (a local sandbox server; an HTTP model server), so each runs
as a real process of a ``Trouper``'s actor system, created on its own with the test as
its parent (its replies come to the system's address) and a home of its own for its pid
file; its log lines go to the Trouper's ``logs/trouper.log``. Each is driven with
messages before its boot, its own protocol out of order or twice, and junk; after each
batch it must still answer, must have run nothing it should not, and must have logged one
line per message it dropped. The supervisors are in ``test_late_messages_tree.py``, the
Controller in ``test_late_messages.py``.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from thespian.actors import ActorExitRequest, WakeupMessage

from trouper.actors.base import Timer
from trouper.actors.llm_broker import LLMBroker
from trouper.actors.runtime_proxy import RuntimeProxy
from trouper.config.models import LLMConfig, SessionConfig
from trouper.home.paths import Home
from trouper.host.processes import pid_alive
from trouper.messages.actions import RunCommand
from trouper.messages.outcomes import Outcome
from trouper.messages.protocol import (
    CancelCompletion,
    CloseSandbox,
    Complete,
    Completed,
    Execute,
    Executed,
    ResolveAction,
    Resolved,
    RetryScheduled,
    RuntimeFailed,
    RuntimeReady,
    SandboxClosed,
    StartSession,
)
from trouper.messages.tree import BootBroker, BootedUp, BootRuntime
from trouper.store import store_url
from trouper.testing import wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

def _start(home: Home, workspace: Path) -> StartSession:
    session_id = "s-" + uuid.uuid4().hex[:8]
    config = SessionConfig(task="t", llm=LLMConfig(model="hosted_vllm/x"),
                           workspace=str(workspace))
    return StartSession(request_id="boot-" + session_id, session_id=session_id,
                        config=config, home=str(home.root),
                        store_url=store_url(home))


def _junk(session_id: str) -> list[Any]:
    """What neither can use: plain values, another actor's protocol, a timer not its own."""
    ok = Outcome(status="ok", content="late")
    return [
        {"kind": "execute"}, "a string", 12345,
        Executed(session_id=session_id, action_id="nobody", outcome=ok),
        Resolved(session_id=session_id, action_id="nobody", state="finished", outcome=ok),
        Completed(request_id="nobody", session_id=session_id, content="late"),
        WakeupMessage(1, payload="no such timer"),
    ]


class Standalone:
    """One actor created in ``trouper``'s (sealed, I7) system; the test is its parent."""

    def __init__(self, trouper: Any, actor_class: type) -> None:
        self.asys = trouper._system._asys  # noqa: SLF001 - the Trouper's own system
        self.log = trouper.home.root / "logs" / "trouper.log"
        self.address = self.asys.createActor(actor_class)
        self.pid = 0
        self.booted_up = 0
        """``BootedUp`` messages it sent the test (its parent), once per boot."""

    def tell(self, *msgs: Any) -> None:
        for msg in msgs:
            self.asys.tell(self.address, msg)

    def until(self, done: Callable[[list[Any]], bool], timeout_s: float = 30.0) -> list[Any]:
        """Everything the actor sends the test until ``done(everything so far)``."""
        got: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while not done(got):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no matching answer within {timeout_s:g} s: {got}")
            answer = self.asys.listen(remaining)
            if isinstance(answer, BootedUp):  # to its parent, the test: probes may start
                self.booted_up += 1
            elif answer is not None:
                got.append(answer)
        return got

    def dropped(self, role: str) -> int:
        """Lines this actor's process logged for a message it dropped; not counting its own
        periodic health check, which may fire once after a close (every 5 s, at any time)."""
        mark = f" {self.pid} "
        lines = self.log.read_text(errors="replace").splitlines()
        return len([ln for ln in lines if mark in ln and f"{role} dropped" in ln
                    and "dropped timer 'health'" not in ln])

    def expect_dropped(self, role: str, count: int) -> None:
        wait_until(lambda: self.dropped(role) >= count, 10, f"{count} drop lines")
        assert self.dropped(role) == count

    def stop(self) -> None:
        self.asys.tell(self.address, ActorExitRequest())
        if self.pid:
            wait_until(lambda: not pid_alive(self.pid), 10, f"actor pid {self.pid} to exit")


def _pid_of(path: Path) -> int:
    return int(wait_until(lambda: path.exists() and path.read_text().split()[0], 10, "a pid"))


def _servers_on(state_dir: Path) -> list[int]:
    """Pids of sandbox servers whose command line names ``state_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if os.fsencode(str(state_dir)) in argv and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _no_servers_left(state_dir: Path) -> None:
    """Fail (after killing them) if sandbox servers of ``state_dir`` still run."""
    try:  # a server told to shut down may take a moment to be gone
        wait_until(lambda: not _servers_on(state_dir), 10, "the sandbox servers to exit")
    except TimeoutError:
        pass
    leftover = _servers_on(state_dir)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"sandbox servers left running: {leftover}"


@pytest.fixture
def proxy(trouper, tmp_path):
    """A RuntimeProxy not booted yet, its StartSession, and its sandbox's state folder."""
    home = Home.at(tmp_path / "home")
    start = _start(home, tmp_path / "ws")
    actor = Standalone(trouper, RuntimeProxy)
    state_dir = home.runtime_dir(start.session_id)
    yield actor, start, state_dir
    actor.stop()
    _no_servers_left(state_dir)


def _execute(sid: str, action_id: str, command: str) -> Execute:
    return Execute(session_id=sid, action_id=action_id, action=RunCommand(command=command),
                   timeout_s=10, no_output_timeout_s=5)


def _got(kind: type, times: int = 1, **fields: Any) -> Callable[[list[Any]], bool]:
    """Whether ``times`` messages of ``kind`` with those field values came."""
    def match(m: Any) -> bool:
        return isinstance(m, kind) and all(getattr(m, k) == v for k, v in fields.items())
    return lambda got: len([m for m in got if match(m)]) >= times


def test_runtime_proxy_drops_what_it_cannot_use_and_runs_each_action_once(proxy, tmp_path):
    actor, start, _state_dir = proxy
    sid, ws = start.session_id, tmp_path / "ws"
    early = _junk(sid)
    actor.tell(*early, _execute(sid, "a-early", "echo early >> ledger.txt"))  # held till ready
    actor.tell(BootRuntime(start=start))
    got = actor.until(_got(Executed, action_id="a-early"))
    assert [type(m) for m in got] == [RuntimeReady, Executed]
    actor.pid = _pid_of(Home.at(start.home).actor_pid_path("runtime", sid))
    late = [
        BootRuntime(start=start),
        _execute("s-another", "a-other", "touch other-session"),
        RuntimeReady(session_id=sid, epoch=1, attached=False),
        WakeupMessage(1, payload=Timer("execute_again", (_execute(sid, "a-forged", "touch x"),
                                                         None))),  # not a timer it set
        *early,
    ]
    actor.tell(*late, ResolveAction(session_id=sid, action_id="never-sent"))
    actor.tell(*[_execute(sid, "a1", "echo one >> ledger.txt")] * 2)
    # the journal's answer and the two runs come back from different worker threads
    got = actor.until(lambda got: _got(Executed, 2, action_id="a1")(got)
                      and _got(Resolved, action_id="never-sent")(got))
    assert not [m for m in got if isinstance(m, RuntimeReady | RuntimeFailed)]
    assert [m.state for m in got if isinstance(m, Resolved)] == ["absent"]
    assert {m.action_id for m in got if isinstance(m, Executed)} == {"a1"}
    assert (ws / "ledger.txt").read_text() == "early\none\n"  # a duplicate never runs twice
    assert not (ws / "other-session").exists()
    actor.expect_dropped("runtime", len(early) + len(late))
    # closing: every request answered, and nothing runs after the close
    actor.tell(CloseSandbox(request_id="c1"), CloseSandbox(request_id="c2"),
               _execute(sid, "a2", "touch after-close"), CloseSandbox(request_id="c3"))
    got = actor.until(lambda got: len([m for m in got if isinstance(m, SandboxClosed)]) >= 3)
    # each answered once; Thespian does not keep the order of messages between two
    # processes (seen: c2 before c1), so neither does this
    assert sorted(m.request_id for m in got if isinstance(m, SandboxClosed)) == [
        "c1", "c2", "c3"]
    assert not [m for m in got if not isinstance(m, SandboxClosed)]
    assert not (ws / "after-close").exists()
    actor.expect_dropped("runtime", len(early) + len(late) + 1)


def test_runtime_proxy_closed_while_starting_leaves_no_sandbox(proxy):
    actor, start, state_dir = proxy
    actor.tell(BootRuntime(start=start), CloseSandbox(request_id="quick"))
    got = actor.until(_got(SandboxClosed, request_id="quick"))
    assert not [m for m in got if isinstance(m, RuntimeReady)]  # closing: never announced
    actor.pid = _pid_of(Home.at(start.home).actor_pid_path("runtime", start.session_id))
    assert _servers_on(state_dir) == []
    actor.tell(BootRuntime(start=start), _execute(start.session_id, "a", "true"),
               CloseSandbox(request_id="again"))
    got = actor.until(_got(SandboxClosed, request_id="again"))
    assert [type(m) for m in got] == [SandboxClosed] and _servers_on(state_dir) == []
    actor.expect_dropped("runtime", 2)


@pytest.fixture
def broker(trouper, tmp_path):
    """An LLMBroker not booted yet, and a home for its pid file."""
    actor = Standalone(trouper, LLMBroker)
    yield actor, Home.at(tmp_path / "home")
    actor.stop()


def _complete(llm: dict[str, Any], request_id: str) -> Complete:
    return Complete(request_id=request_id, session_id="s-broker", llm=LLMConfig(**llm),
                    messages=[{"role": "user", "content": "hi"}])


def test_llm_broker_drops_what_it_cannot_use_and_still_answers(broker, scripted):
    actor, home = broker
    server, llm = scripted([{"say": "hello"}])
    early = _junk("s-broker")
    actor.tell(*early, BootBroker(home=str(home.root)))
    actor.pid = _pid_of(home.actor_pid_path("broker"))
    late = [
        BootBroker(home=str(home.root)),
        _execute("s-broker", "a1", "touch nothing"),
        RuntimeReady(session_id="s-broker", epoch=1, attached=False),
        WakeupMessage(1, payload=Timer("retry", "nobody")),  # timers it did not set
        WakeupMessage(1, payload=Timer("pump", ["not", "a", "gate"])),
        *early,
    ]
    actor.tell(*late, _complete(llm, "r1"))
    got = actor.until(_got(Completed, request_id="r1"))
    assert [(type(m), m.content) for m in got] == [(Completed, "hello")]
    assert len(server.requests) == 1
    actor.expect_dropped("broker", len(early) + len(late))
    assert actor.booted_up == 1  # its one boot; the second was dropped


def test_llm_broker_logs_a_late_cancel_and_a_stale_retry_timer(broker, scripted):
    actor, home = broker
    server, llm = scripted([{"say": "never", "fail": [{"status": 503}]}])
    actor.tell(BootBroker(home=str(home.root)))
    actor.pid = _pid_of(home.actor_pid_path("broker"))
    actor.tell(CancelCompletion(request_id="nobody", session_id="s-broker"))
    actor.tell(_complete({**llm, "retry_min_wait_s": 0.3, "retry_max_wait_s": 0.3}, "r1"))
    actor.until(_got(RetryScheduled, request_id="r1"))
    actor.tell(CancelCompletion(request_id="r1", session_id="s-broker"))  # during the wait
    wait_until(lambda: actor.dropped("broker") >= 2, 3, "the two drop lines")
    assert actor.dropped("broker") == 2 and len(server.requests) == 1


def test_llm_broker_never_asks_the_model_twice_for_one_request(broker, scripted):
    """A duplicate Complete that raced its own answer (a Controller re-sending to a broker
    it thought lost) is dropped, not a second model call."""
    actor, home = broker
    server, llm = scripted([{"say": "once"}, {"say": "twice"}])
    actor.tell(BootBroker(home=str(home.root)))
    actor.pid = _pid_of(home.actor_pid_path("broker"))
    actor.tell(_complete(llm, "r1"))
    actor.until(_got(Completed, request_id="r1"))
    actor.tell(_complete(llm, "r1"))
    actor.expect_dropped("broker", 1)
    assert len(server.requests) == 1
