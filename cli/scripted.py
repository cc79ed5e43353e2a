"""Scripted models for the command line: the demo, ``--script``, and serving them again.

A scripted server lives as long as the command that started it, so a session it answered
outlives it. ``resume`` serves the same script again at the address the session
stored: the demo's by itself (known by ``DEMO_MODEL``), a ``--script`` run's when given
the file. That address must be free again, so a new server listens outside the kernel's
ephemeral port range: ports the kernel hands out (``bind(0)``, outgoing connections,
the resume's own actors) never take it in between.
"""

from __future__ import annotations

import contextlib
import errno
import random
from pathlib import Path
from urllib.parse import urlsplit

from ..home.paths import Home
from ..testing.script import Script, load_script
from .support import ENVIRONMENT, USAGE, CliError, os_message

DEMO_TASK = "Write a small Python program with a test, run it, then improve it."
DEMO_MODEL = "hosted_vllm/trouper-demo"
"""The demo's model name; ``resume`` knows a demo session by it and plays the demo again."""
DEMO_SCRIPT = Path(__file__).parent.parent / "testing" / "demo_script.json"
SCRIPTED_MODEL = "hosted_vllm/scripted"
"""The model name of a ``--script`` run without ``--model``: ``resume`` asks for the script."""
SCRIPTED_KEY = "trouper-fake-llm-key"
"""The scripted server's API key. Every key is masked wherever it appears, so it must be
a word no model name or output holds (``scripted`` turned the model name into
``hosted_vllm/<secret:LLM_API_KEY>``)."""
HOST = "127.0.0.1"
LOWEST_PORT = 10_000
"""Where the search for a port below the ephemeral range starts."""
TRIES = 50


def serve(stack: contextlib.ExitStack, script: Script, port: int | None = None) -> str:
    """Serve ``script`` on loopback until ``stack`` closes; return its URL.

    ``port``: the one a stored session knows (EADDRINUSE is an environment error); None
    picks a free one below the ephemeral range.
    """
    from ..testing import FakeLLMServer

    candidates = [port] if port is not None else _stable_ports()
    for candidate in candidates:
        try:
            return stack.enter_context(FakeLLMServer(script, host=HOST, port=candidate)).url
        except OSError as exc:
            if port is not None or exc.errno != errno.EADDRINUSE:
                raise port_error(HOST, candidate, exc) from exc
    return stack.enter_context(FakeLLMServer(script, host=HOST, port=0)).url


def _stable_ports() -> list[int]:
    """Random ports below the kernel's ephemeral range (0, any free port, as a last try)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768  # Linux's default
    if low <= LOWEST_PORT + TRIES:
        return []
    return random.sample(range(LOWEST_PORT, low), TRIES)


def port_error(host: str, port: int, exc: OSError) -> CliError:
    if exc.errno == errno.EADDRINUSE:
        return CliError(f"port {port} on {host} is in use", ENVIRONMENT)
    return CliError(f"cannot listen on {host} port {port}: {os_message(exc)}", ENVIRONMENT)


def script_to_serve(home: Home, session_id: str, script: Path | None
                    ) -> tuple[Script | None, int]:
    """The script to serve again for a stored scripted session (``script``, or the demo's)
    and the port the session knows it at; (None, 0) for a real model. Read from the
    store, so an unknown id or a missing ``--script`` is an error before any actor starts.
    """
    from ..store import open_store

    loaded = load_script(script) if script is not None else None
    store = open_store(home)
    try:
        llm = store.session(session_id).config.llm
    finally:
        store.close()
    if loaded is None and llm.model == SCRIPTED_MODEL:
        raise CliError(f"session {session_id} was run with --script: give the same "
                       "--script FILE to resume it", USAGE)
    served = loaded or (load_script(DEMO_SCRIPT) if llm.model == DEMO_MODEL else None)
    if served is None:
        return None, 0
    port = scripted_port(llm.base_url)
    if port is None:
        raise CliError(f"session {session_id} does not use a scripted server on loopback: "
                       "resume it without --script", USAGE)
    return served, port


def scripted_port(base_url: str | None) -> int | None:
    """The port of a scripted server on loopback at ``base_url``, or None."""
    if not base_url:
        return None
    parts = urlsplit(base_url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.port is None:
        return None
    return parts.port
