"""What one actor hop costs: two bare actors on trouper's sealed transport, ping-pong.

    .venv/bin/python bench/hop_cost.py [--rounds 2000]

Two actors (no trouper actor code: Thespian's ``Actor``) on ``multiprocTCPBase`` with
trouper's seal (``actors/transport.py``: every frame MAC'd, loopback, the cheaper
selector): one sends the other a message, which answers it, ``rounds`` times in a row.
Each round trip is two frames and two acknowledgements, as a step's Execute and Executed
are. Measured: CPU of both processes per round trip (``/proc``: user and kernel) and the
wall time, for a small message and for a pydantic message of a step's size (an
``Execute``), with both processes free to run anywhere, pinned to one CPU, and pinned to
two different CPUs (a wake-up across CPUs is an interrupt between vCPUs). The program
imports what a ``Trouper`` program imports first (``trouper.client.actor_system``), so the two
actors are forked from a heap like the real ones; their private and shared memory after
the run is the floor of an actor process that does nothing but Thespian and messages.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import smaps_rollup_kb  # noqa: E402
from thespian.actors import Actor, ActorSystem  # noqa: E402


class Frozen(Actor):
    """Freezes what the fork shared, as every trouper actor does (``actors/base.py``):
    without it the collector's first full pass writes to every inherited object."""

    def __init__(self) -> None:
        super().__init__()
        gc.freeze()


class Ponger(Frozen):
    """Answers every message with itself."""

    def receiveMessage(self, msg: Any, sender: Any) -> None:  # noqa: N802 - Thespian's
        if isinstance(msg, str) and msg == "pid":
            self.send(sender, os.getpid())
        elif not isinstance(msg, (dict, tuple)) or msg != "ignore":
            self.send(sender, msg)


class Pinger(Frozen):
    """On ``("go", peer, n, payload)``: sends ``payload`` to ``peer`` n times, each after
    the answer to the one before; then answers the asker."""

    def receiveMessage(self, msg: Any, sender: Any) -> None:  # noqa: N802 - Thespian's
        if isinstance(msg, str) and msg == "pid":
            self.send(sender, os.getpid())
        elif isinstance(msg, tuple) and msg and msg[0] == "go":
            _, self.peer, self.left, self.payload = msg
            self.asker = sender
            self.send(self.peer, self.payload)
        elif getattr(self, "left", 0):
            self.left -= 1
            if self.left:
                self.send(self.peer, self.payload)
            else:
                self.send(self.asker, "done")


def _cpu(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def payloads() -> dict[str, Any]:
    from trouper.messages.actions import RunCommand
    from trouper.messages.protocol import Execute

    execute = Execute(session_id="s-0123456789ab", action_id="a-0123456789abcdef",
                      action=RunCommand(command="echo 7 >> out.txt"), timeout_s=120.0,
                      no_output_timeout_s=30.0)
    return {"small": "x", "Execute": execute}


def run(rounds: int) -> dict[str, Any]:
    import hop_cost as me  # the classes by their module's name, for the forked actors

    import trouper.client.actor_system  # noqa: F401 - the program's heap, as a Trouper's
    from trouper.actors import forking
    from trouper.actors.transport import seal
    from trouper.client.actor_system import free_port

    forking.install()  # what every trouper actor process does first after its fork
    seal()
    port = free_port()
    system = ActorSystem("multiprocTCPBase", {"Admin Port": port},
                         logDefs={"version": 1, "disable_existing_loggers": False})
    out: dict[str, Any] = {"rounds": rounds}
    try:
        pinger, ponger = system.createActor(me.Pinger), system.createActor(me.Ponger)
        pids = {"pinger": system.ask(pinger, "pid", 10), "ponger": system.ask(ponger, "pid", 10)}
        cpus = sorted(os.sched_getaffinity(0))
        placements = {"free": (set(cpus), set(cpus))}
        if len(cpus) > 1:
            placements["one CPU"] = ({cpus[0]}, {cpus[0]})
            placements["two CPUs"] = ({cpus[0]}, {cpus[1]})
        for place, (a, b) in placements.items():
            os.sched_setaffinity(pids["pinger"], a)
            os.sched_setaffinity(pids["ponger"], b)
            for name, payload in payloads().items():
                system.ask(pinger, ("go", ponger, 50, payload), 30)  # warm
                before = {k: _cpu(p) for k, p in pids.items()}
                began = time.perf_counter()
                answer = system.ask(pinger, ("go", ponger, rounds, payload), 120)
                wall = time.perf_counter() - began
                after = {k: _cpu(p) for k, p in pids.items()}
                if answer != "done":
                    raise RuntimeError(f"no answer ({answer!r})")
                row = {"wall_us_per_round_trip": round(wall / rounds * 1e6, 1)}
                for k in pids:
                    user = (after[k][0] - before[k][0]) / rounds * 1e6
                    system_s = (after[k][1] - before[k][1]) / rounds * 1e6
                    row[f"{k}_user_us"], row[f"{k}_kernel_us"] = round(user, 1), round(system_s, 1)
                spent = [v for k, v in row.items() if k.endswith(("_user_us", "_kernel_us"))]
                row["cpu_us_per_round_trip"] = round(sum(spent), 1)
                out[f"{place}, {name}"] = row
        for k, pid in pids.items():
            rollup = smaps_rollup_kb(pid)
            out[f"{k} memory MB"] = {
                "private": round((rollup.get("Private_Clean", 0)
                                  + rollup.get("Private_Dirty", 0)) / 1024, 2),
                "shared": round((rollup.get("Shared_Clean", 0)
                                 + rollup.get("Shared_Dirty", 0)) / 1024, 2),
                "pss": round(rollup.get("Pss", 0) / 1024, 2)}
    finally:
        system.shutdown()
    out["load_average"] = os.getloadavg()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    print(json.dumps(run(args.rounds), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
