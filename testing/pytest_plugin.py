"""pytest fixtures for testing agents on trouper (loaded through the ``pytest11`` entry point).

    def test_my_agent(trouper, fake_llm):
        server = fake_llm([{"tool": "run", "args": {"command": "make"}},
                           {"tool": "finish", "args": {"message": "built"}}])
        session = trouper.start_session("build it", llm=server.llm())
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert check_log(list(session.events())) == []

Every fixture shuts down what it started: the servers, the Trouper and its actors and
sandboxes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .fake_llm import FakeLLMServer
from .script import load_script

if TYPE_CHECKING:
    from ..client.embedded import Trouper


@pytest.fixture
def trouper_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh trouper home folder for this test, beside ``tmp_path`` (which may then be
    a session's workspace: a workspace never holds the home)."""
    return tmp_path_factory.mktemp("trouper-home")


@pytest.fixture
def fake_llm() -> Iterator[Callable[..., FakeLLMServer]]:
    """``fake_llm(steps, **options) -> FakeLLMServer``, started; stopped after the test."""
    servers: list[FakeLLMServer] = []

    def start(steps: Any, **options: Any) -> FakeLLMServer:
        server = FakeLLMServer(load_script(steps), **options).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def trouper(trouper_home: Path) -> Iterator[Trouper]:
    """A running ``Trouper`` on ``trouper_home``, closed (sandboxes included) after the test."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from ..client.embedded import Trouper

    with Trouper(home=trouper_home) as running:
        yield running
