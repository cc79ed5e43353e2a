"""Where a trouper step's time goes: py-spy over every process of one K-step session.

    .venv/bin/python bench/profile_step.py [--k 200] [--rate 250] [--latency-ms 0]

Builds ``bench/.venv-tools`` (py-spy) on first use, runs one session of K ``echo`` steps,
and samples the Thespian admin and every process below it (actors, sandbox server,
shell) from the session's second model request to its end. Only samples of running
threads count (py-spy leaves idle ones out), so samples are CPU time. Prints, for each
process, CPU ms per step and the functions with the most time (self and inclusive),
and writes the same plus the raw stacks under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import venvs  # noqa: E402
from common import RESULTS_DIR, chat_requests, echo_script  # noqa: E402
from contenders import TASK, llm_config, session_roles, wait_until  # noqa: E402
from procs import cpu_s, listening_pid  # noqa: E402

from trouper import Trouper  # noqa: E402
from trouper.client.actor_system import free_port  # noqa: E402
from trouper.testing import FakeLLMServer  # noqa: E402

TOP = 15


def record(py_spy: Path, k: int, rate: int, workdir: Path, raw_path: Path,
           latency_s: float = 0.0) -> tuple[dict, int]:
    """Run the session under py-spy; pid -> (role, CPU seconds), and the steps sampled."""
    port = free_port()
    with (
        FakeLLMServer(echo_script(k), latency_s=latency_s) as server,
        Trouper(home=workdir / "home", admin_port=port) as t,
    ):
        session = t.start_session(
            TASK, llm=llm_config(server), workspace=workdir / "ws", max_iterations=k + 5
        )
        if not wait_until(lambda: len(chat_requests(server)) >= 2, 60.0):
            raise TimeoutError("the session did not start")
        roles = session_roles(port, t.home.root, session.id)
        admin = listening_pid(port)
        spy = subprocess.Popen(
            [
                str(py_spy),
                "record",
                "--pid",
                str(admin),
                "--subprocesses",
                "--rate",
                str(rate),
                "--format",
                "raw",
                "--nolineno",
                "--output",
                str(raw_path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1.0)  # py-spy attaches to every process of the tree
        first = len(chat_requests(server))
        before = {pid: cpu_s(pid) for pid in roles.values()}
        session.wait(timeout=60 + k * 2.0)
        steps = len(chat_requests(server)) - first
        cpu = {pid: cpu_s(pid) - before[pid] for pid in roles.values()}
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()
    return {pid: (role, cpu[pid]) for role, pid in roles.items()}, steps


MIN_STEPS = 50
"""Fewer steps than this after py-spy attached (it takes about a second) make the
per-step figures noise: the session's start and end dominate them."""


def _frame_name(frame: str) -> str:
    """``function (path)`` -> ``function (package/module.py)``."""
    name, _, path = frame.partition(" (")
    path = path.rstrip(")")
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})" if path else name


_LINE = re.compile(r'^((?:process \d+:"[^"]*";)+)(.*) (\d+)$')


def parse(raw_path: Path) -> dict[int, list[tuple[list[str], int]]]:
    """pid -> [(frames root first, count)] from py-spy's raw output.

    A line is ``process A:"cmd";process B:"cmd";frame;frame... count``: the chain of
    processes from the admin down to the sampled one, then its stack, root first.
    """
    stacks: dict[int, list[tuple[list[str], int]]] = defaultdict(list)
    for line in raw_path.read_text().splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        chain, frames, count = match.groups()
        pid = int(re.findall(r"process (\d+):", chain)[-1])
        stacks[pid].append(([_frame_name(f) for f in frames.split(";") if f], int(count)))
    return stacks


WAITS = frozenset(
    {
        "EpollSelector.select (selectors.py)",
        "_PollLikeSelector.select (selectors.py)",
        "_worker (concurrent/futures/thread.py)",
        "Condition.wait (threading.py)",
        "Event.wait (threading.py)",
        "SocketIO.readinto (socket.py)",
        "sleep",
    }
)
"""Leaf frames of a thread waiting in C: py-spy's idle filter misses these, so they go."""
WAIT_FUNCTIONS = frozenset({"LoopSelector.select"})
"""The same, by function name alone: trouper's own frames, whose path depends on the clone."""


def _waiting(leaf: str) -> bool:
    return leaf in WAITS or leaf.partition(" (")[0] in WAIT_FUNCTIONS
PLUMBING = frozenset(
    {
        "Thread._bootstrap (threading.py)",
        "Thread._bootstrap_inner (threading.py)",
        "Thread.run (threading.py)",
        "_WorkItem.run (concurrent/futures/thread.py)",
    }
)


def _own_frames(frames: list[str]) -> list[str]:
    """The frames below the fork: an actor's stack starts inside its parent's handler."""
    marker = "BaseProcess._bootstrap (multiprocessing/process.py)"
    if marker in frames:
        frames = frames[len(frames) - frames[::-1].index(marker) :]
    return [f for f in frames if f not in PLUMBING]


def summarize(
    stacks: dict[int, list[tuple[list[str], int]]],
    roles: dict[int, tuple[str, float]],
    rate: int,
    steps: int,
) -> str:
    lines = [
        f"py-spy at {rate} Hz over {steps} steps. CPU ms per step from /proc; the shares",
        "are of the samples that were not waiting (leaf not a select, queue or lock wait)",
        "",
    ]
    if steps < MIN_STEPS:  # the session ended about when py-spy had attached
        lines[1:1] = [f"WARNING: only {steps} steps after py-spy attached: the per-step "
                      f"figures mean little; use a larger --k (200 takes a few seconds)"]
    for pid, (role, cpu) in sorted(roles.items(), key=lambda kv: -kv[1][1]):
        busy = [(f, c) for f, c in stacks.get(pid, []) if f and not _waiting(f[-1])]
        total = sum(c for _, c in busy)
        lines.append(
            f"== {role} (pid {pid}): {cpu / max(1, steps) * 1000:.2f} ms CPU per step, "
            f"{total} busy samples"
        )
        if not total:
            lines.append("")
            continue
        own, inclusive = Counter(), Counter()
        for frames, count in busy:
            frames = _own_frames(frames)
            if frames:
                own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
        lines.append("   self:")
        lines += [f"   {c / total * 100:5.1f}%  {f}" for f, c in own.most_common(TOP)]
        lines.append("   inclusive:")
        lines += [f"   {c / total * 100:5.1f}%  {f}" for f, c in inclusive.most_common(TOP * 2)]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=200)
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="the model's latency")
    args = parser.parse_args()
    env = venvs.tools()
    if env.python is None:
        print(f"cannot profile: {env.note}")
        return 1
    py_spy = env.python.parent / "py-spy"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    raw_path = RESULTS_DIR / f"profile-{stamp}.raw"
    with tempfile.TemporaryDirectory(prefix="trouper-profile-") as tmp:
        roles, steps = record(py_spy, args.k, args.rate, Path(tmp), raw_path,
                              args.latency_ms / 1000)
    text = summarize(parse(raw_path), roles, args.rate, steps)
    out = RESULTS_DIR / f"profile-{stamp}.txt"
    out.write_text(text + "\n")
    print(text)
    print(f"written to {out} (raw stacks: {raw_path})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    sys.exit(main())
