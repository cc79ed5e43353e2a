"""Shared fixtures: a trouper home, a running Trouper, and scripted LLM configs."""

from __future__ import annotations

import os
from collections.abc import Iterator
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
