"""Shared fixtures: a trouper home, a running Trouper, and scripted LLM configs."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from trouper.testing import FakeLLMServer, load_script  # noqa: E402


@pytest.fixture(scope="module")
def trouper_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def trouper(trouper_home: Path) -> Iterator[Any]:
    from trouper import Trouper

    with Trouper(home=trouper_home) as t:
        yield t


@pytest.fixture
def scripted():
    """``scripted(steps) -> (server, llm_config)``; servers stop at the test's end."""
    servers: list[FakeLLMServer] = []

    def start(steps: list[dict[str, Any]], **server_options: Any) -> tuple[FakeLLMServer, dict]:
        server = FakeLLMServer(load_script(steps), **server_options).start()
        servers.append(server)
        llm = {"model": "hosted_vllm/scripted", "base_url": server.url, "api_key": "test-key"}
        return server, llm

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def make_sandbox(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``make_sandbox(**options)``: a started LocalSandbox in tmp_path; all stopped at the end."""
    from trouper.runtimes.local import LocalSandbox

    started: list[LocalSandbox] = []

    def make(**kwargs: Any) -> LocalSandbox:
        kwargs.setdefault("interrupt_grace_s", 0.5)
        sandbox = LocalSandbox("test", tmp_path / "ws", tmp_path / "rt", **kwargs)
        started.append(sandbox)
        sandbox.start(1)
        return sandbox

    try:
        yield make
    finally:
        for sandbox in started:
            sandbox.stop()


@pytest.fixture
def chunked() -> Callable[..., str]:
    """``chunked(masker, text, cuts)``: ``text`` masked by a StreamMasker fed in pieces."""
    from trouper.runtimes.sandbox.stream import StreamMasker

    def mask(masker: Any, text: str, cuts: list[int]) -> str:
        stream = StreamMasker(masker)
        pieces, last = [], 0
        for cut in sorted(cuts) + [len(text)]:
            pieces.append(stream.feed(text[last:cut]))
            last = cut
        return "".join(pieces) + stream.flush()

    return mask
