"""The pytest plugin users load to test their own agents (a pytest run inside this one,
which finds the plugin by its entry point as a user's run does)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

USER_TEST = '''
from trouper import AgentState
from trouper.testing import check_log


def test_an_agent_session(trouper, fake_llm, tmp_path):
    server = fake_llm([{"tool": "run", "args": {"command": "echo built > out.txt"}},
                       {"tool": "finish", "args": {"message": "built"}}])
    session = trouper.start_session("build it", llm=server.llm(), workspace=tmp_path)
    assert session.wait(timeout=60) == AgentState.FINISHED
    assert (tmp_path / "out.txt").read_text() == "built\\n"
    assert check_log(list(session.events())) == []
'''


def test_plugin_fixtures_run_a_session(pytester):
    pytester.makepyfile(test_user=USER_TEST)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
