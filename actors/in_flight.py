"""User commands handed to a child and not yet answered: handed again if it dies first.

A user's command goes root -> (SessionSupervisor ->) the agent loop, and its answer
(``CommandAnswered``) comes back the same way, the root passing it to the program. A
child that dies between taking a command and answering it (SIGKILL, OOM) used to lose
the command: the program waited its whole request timeout, and the command was never
carried out. Each parent that hands commands on now keeps the unanswered ones here, lets
go of one only as it passes its answer on, and hands the rest to the child's next
incarnation, which carries each out once: the agent loop finds a command it already took
in its log (its first event carries the command's ``command_id``) and only answers it.
(The answer goes through the parents, not straight to the program, because a process
killed after telling its parent "answered" and before its answer to the program left
would lose the answer with the command let go of: a random-kill run found it, and
``tests/test_recovery.py`` has it as a chaos test.)

A command is handed again once: when a child dies a second time holding it, it is refused
at once (a command that kills its taker would otherwise restart it past its restart
intensity), as it is when its child is down for good (given up on). The refusal says the
log shows whether it was carried out: the taker may have recorded it before it died.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..messages.protocol import UserCommand
from ..messages.tree import Relay

HANDED_AT_MOST = 2
"""Incarnations a command is handed to before it is refused (the first and one more)."""


def taken_text(reason: str) -> str:
    """A refusal for a command its taker died holding: it may be in the log already."""
    return (f"the session's agent loop went down while it took this command ({reason}); "
            "the session's log shows whether it was carried out")


@dataclass
class CommandsInFlight:
    """One child's unanswered user commands, in the order they were handed."""

    relays: dict[str, tuple[Relay, int]] = field(default_factory=dict)
    """request_id -> (the relay, how many incarnations it was handed to)."""

    def handed(self, relay: Relay) -> None:
        cmd = relay.msg
        if isinstance(cmd, UserCommand):
            _, times = self.relays.get(cmd.request_id, (relay, 0))
            self.relays[cmd.request_id] = (relay, times + 1)

    def answered(self, request_id: str) -> None:
        self.relays.pop(request_id, None)

    def spent(self) -> list[Relay]:
        """The child died: the relays handed to as many incarnations as they may be, to
        refuse now (they leave this ledger)."""
        spent = [r for r, times in self.relays.values() if times >= HANDED_AT_MOST]
        for relay in spent:
            del self.relays[relay.msg.request_id]  # type: ignore[union-attr]
        return spent

    def again(self) -> list[Relay]:
        """The child's successor is up: the relays to hand it, in the order first handed
        (they stay here; ``handed`` counts them again as they are sent)."""
        self.spent()  # refused by the caller when the child died
        return [r for r, _ in self.relays.values()]

    def take_all(self) -> list[Relay]:
        """Every relay in flight, forgotten here (the child is down for good)."""
        relays = [r for r, _ in self.relays.values()]
        self.relays.clear()
        return relays
