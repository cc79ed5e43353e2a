"""No input yields a 500 from the daemon: every route of its app (read from the app, so a
route added later is walked too) gets hostile ids, numbers, bodies and framings with the
right token, on a real daemon process; every answer is below 500 and the daemon answers
its health check afterwards."""

from __future__ import annotations

import pytest

from trouper.daemon.app import create_app
from trouper.daemon.auth import allowed_hosts
from trouper.testing import FakeLLMServer, load_script
from trouper.testing.daemon import running_daemon
from trouper.testing.http_fuzz import fuzz

pytestmark = pytest.mark.slow  # starts a daemon process

FINISH = {"tool": "finish", "args": {"message": "done"}}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with running_daemon(tmp_path_factory.mktemp("fuzzhome")) as d:
        yield d


@pytest.fixture(scope="module")
def session_id(daemon):
    server = FakeLLMServer(load_script([FINISH] * 50)).start()
    try:
        llm = {"model": "hosted_vllm/scripted", "base_url": server.url, "api_key": "k"}
        made = daemon.http().post("/v1/sessions", json={"id": "fuzz-1", "task": "t",
                                                        "llm": llm})
        assert made.status_code == 201, made.text
        daemon.client().session("fuzz-1").wait(timeout=60)
        yield "fuzz-1"
    finally:
        server.stop()


def test_no_hostile_input_yields_a_500(daemon, session_id):
    app = create_app(None, token="x", hosts=allowed_hosts("127.0.0.1", 1))  # type: ignore[arg-type]
    failures = fuzz(app.fastapi, ("127.0.0.1", daemon.port),
                    auth={"Authorization": f"Bearer {daemon.token}"},
                    valid={"session_id": session_id}, health="/v1/health",
                    host=f"127.0.0.1:{daemon.port}", seed=7, big_body_bytes=900 * 1024)
    assert failures == [], "\n".join(failures[:40])
    info = daemon.http().get(f"/v1/sessions/{session_id}")
    assert info.status_code == 200, info.text
