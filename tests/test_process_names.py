"""Every process of a trouper says its role where an operator looks (``ps``, ``top``,
``/proc/<pid>/comm``), rather than the embedding program's name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trouper import AgentState
from trouper.host.processes import descendants
from trouper.testing import wait_until

pytestmark = pytest.mark.slow  # real processes: `-m 'not slow'` skips them


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def tree_names(root: int) -> set[str]:
    return {comm(pid) for pid in descendants([root])}


def test_each_role_has_its_process_name(trouper, trouper_home, scripted, tmp_path):
    _, llm = scripted([{"tool": "run", "args": {"command": "touch started; sleep 30"}},
                       {"tool": "finish", "args": {"message": "done"}}])
    session = trouper.start_session("names", llm=llm, workspace=tmp_path)
    wait_until(lambda: (tmp_path / "started").exists(), 60, "the command to start")
    admin = int((trouper_home / "actors" / "admin.pid").read_text().split()[0])
    actors = {"trouper-admin", "trouper-root", "trouper-llm", "trouper-session",
              "trouper-ctl", "trouper-proxy"}
    assert actors <= tree_names(admin)
    # the sandbox servers are forked by the program's zygote (runtimes/sandbox_zygote.py)
    assert {"trouper-zygote", "trouper-sandbox"} <= tree_names(os.getpid())
    session.stop()
    assert session.wait(timeout=60) == AgentState.STOPPED
