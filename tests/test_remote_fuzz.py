"""No input yields a 500 from the runtime server: every route of its app (read from the
app, so a route added later is walked too) gets hostile ids, numbers, bodies and framings
with the right token, on a real server with a running session and a finished action;
every answer is below 500, and the server answers its health check afterwards."""

from __future__ import annotations

import httpx
import pytest

from trouper.testing.http_fuzz import fuzz

pytestmark = pytest.mark.slow  # starts a runtime server process

TOKEN = "f" * 40
BODY_FIELDS = ("epoch", "env", "secret_names", "max_output_chars", "action_id", "action",
               "timeout_s", "no_output_timeout_s", "wait_s")
"""What the routes read from their JSON bodies (they take a dict, not a model)."""


def test_no_hostile_input_yields_a_500(remote_server, tmp_path):
    from trouper.runtimes.remote_server.app import create_app
    from trouper.runtimes.remote_server.registry import Sessions

    server = remote_server(token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    http = httpx.Client(base_url=server.url, headers=auth, trust_env=False, timeout=30)

    def start() -> int:
        """Each route meets a running session (the one before may have stopped it)."""
        answer = http.post("/v1/sessions/fz-1/start", json={})
        assert answer.status_code == 200, answer.text
        return int(answer.json()["epoch"])

    ran = http.post("/v1/sessions/fz-1/actions", json={
        "action_id": "a1", "epoch": start(), "action": {"kind": "run", "command": "echo out"},
        "timeout_s": 30, "wait_s": 30})
    assert ran.json()["state"] == "finished", ran.text
    sessions = Sessions(tmp_path / "routes", TOKEN)  # only to read the routes from
    try:
        app = create_app(sessions, TOKEN).app
        failures = fuzz(app, ("127.0.0.1", server.port), auth=auth, health="/v1/health",
                        valid={"session_id": "fz-1", "action_id": "a1"}, seed=11,
                        body_fields=BODY_FIELDS, big_body_bytes=10 * 1024 * 1024,
                        before_route=start)
    finally:
        sessions.close()
        http.close()
    assert failures == [], "\n".join(failures[:40])
    assert server.healthy()
