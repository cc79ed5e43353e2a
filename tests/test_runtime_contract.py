"""The local sandbox keeps the journal contract every backend must keep."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trouper.runtimes.local import LocalSandbox
from trouper.testing.runtime_contract import SandboxContract

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

class TestLocalSandboxContract(SandboxContract):
    @pytest.fixture
    def workspace(self, tmp_path: Path) -> Path:
        return tmp_path / "ws"

    @pytest.fixture
    def new_sandbox(self, tmp_path: Path, workspace: Path) -> Iterator[Callable[[], LocalSandbox]]:
        made: list[LocalSandbox] = []

        def make() -> LocalSandbox:
            made.append(LocalSandbox("s-contract", workspace, tmp_path / "state"))
            return made[-1]

        yield make
        for sandbox in reversed(made):
            sandbox.stop()
