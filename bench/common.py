"""What every workload shares: scripts, step timing from the LLM server, statistics, the machine.

Step time is measured at one place for every contender: the arrival of its model
requests at the ``FakeLLMServer``. Step ``i`` lasts from request ``i`` to request
``i + 1``: the model's answer, parsing it, running the command, recording it, and
building the next request. So the figure means the same for the bare loop, trouper and
OpenHands, whatever each one logs about itself.
"""

from __future__ import annotations

import atexit
import os
import platform
import sqlite3
import statistics
import sys
from collections.abc import Iterable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NoReturn

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
MODEL = "hosted_vllm/fake"
"""litellm's own HTTP handler: the route the design asks for (not the OpenAI SDK's)."""
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


def echo_command(i: int) -> str:
    return f"echo {i} >> out.txt"


def echo_script(k: int, tool: str = "run", finish: str = "finish") -> list[dict[str, Any]]:
    """K steps of ``run echo i >> out.txt``, then one call to the finish tool."""
    steps: list[dict[str, Any]] = [
        {"tool": tool, "args": {"command": echo_command(i)}} for i in range(k)
    ]
    steps.append({"tool": finish, "args": {"message": "done"}})
    return steps


def chat_requests(server: Any, conversation: str | None = None) -> list[Any]:
    """The successful chat requests the server got, oldest first (one conversation's)."""
    requests = [
        r
        for r in server.requests
        if r.method == "POST"
        and r.path in CHAT_PATHS
        and r.status == 200
        and (conversation is None or r.headers.get("x-trouper-session") == conversation)
    ]
    return sorted(requests, key=lambda r: r.time_s)


def step_intervals_ms(times_s: Sequence[float]) -> list[float]:
    """Milliseconds between consecutive model requests: one per completed step."""
    return [(b - a) * 1000.0 for a, b in zip(times_s, times_s[1:], strict=False)]


def median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), linear between closest ranks."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{unit}"


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def expected_lines(k: int) -> list[str]:
    return [str(i) for i in range(k)]


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model, OS, Python and package versions, and the commit."""
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_gib": round(_meminfo_kb("MemTotal") / 1024 / 1024, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "sqlite": sqlite3.sqlite_version,
        "packages": {
            p: package_version(p)
            for p in ("trouper", "litellm", "thespian", "pydantic", "httpx", "mcp")
        },
        "commit": _commit(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_kb(field: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _commit() -> str | None:
    """The checked-out commit, read from ``.git`` (no git command is run)."""
    git = REPO_DIR / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).exists():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return None


SPAWN: dict[str, Any] = {}
"""How the bench starts its Python processes (workers, daemons, runtime servers):
``subprocess``'s ``Popen`` and ``run`` unless ``fork_python_processes`` said otherwise."""


def spawn(kind: str) -> Any:
    """``SPAWN[kind]`` (``"popen"`` or ``"run"``), ``subprocess``'s by default."""
    import subprocess

    return SPAWN.get(kind) or {"popen": subprocess.Popen, "run": subprocess.run}[kind]


def fork_python_processes() -> None:
    """``--quick`` (a smoke run, its figures not read): fork the bench's Python processes
    from a pre-imported zygote (the test suite's fork server, ``tests/accel/``), the
    suite's own when the bench itself was forked from one, instead of paying trouper's
    imports in each."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from trouper.testing.daemon import TestDaemon

    from accel import forkserver

    SPAWN.update(popen=forkserver.Popen, run=forkserver.run)
    TestDaemon.popen = forkserver.Popen



def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` after the exit handlers and a flush of stdout and stderr, but
    without the interpreter's teardown: in a process forked from a pre-imported parent
    (``--quick``) that teardown writes to every inherited page it frees, ~0.1 s of CPU
    in copy-on-write faults per process for nothing (the OS frees the memory anyway)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
