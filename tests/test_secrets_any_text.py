"""A secret is masked whatever text it is in: a value holding a lone surrogate, sent over
the daemon's JSON API (``"\\ud800"``), never comes back from ``GET /v1/sessions`` nor rests
in the sessions table, though the task that carries it is made storable (U+FFFD) first."""

from __future__ import annotations

import json
import sqlite3

import pytest

from trouper.testing.daemon import running_daemon

pytestmark = pytest.mark.slow  # starts a daemon process

LONE = "tok\ud800en-77f1-lone"
STORED = LONE.replace("\ud800", "\ufffd")
"""The value as storable text holds it."""
FINISH = {"tool": "finish", "args": {"message": "done"}}


def test_a_lone_surrogate_secret_is_masked_in_the_api_and_the_store(scripted, tmp_path):
    _, llm = scripted([{"tool": "run", "args": {"command": 'echo "[$LONE]"'}}, FINISH])
    body = json.dumps({"task": f"use {LONE} please", "llm": llm,
                       "workspace": str(tmp_path / "work"),
                       "secrets": {"LONE": LONE}, "max_iterations": 5})
    assert "\\ud800" in body  # JSON carries the lone surrogate as an escape
    with running_daemon(tmp_path / "home") as daemon:
        http = daemon.http()
        made = http.post("/v1/sessions", content=body,
                         headers={"Content-Type": "application/json"})
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
        listed = http.get("/v1/sessions").text
        one = http.get(f"/v1/sessions/{sid}").text
        daemon.client().session(sid).wait(timeout=60)
        events = http.get(f"/v1/sessions/{sid}/events").text
    for answer in (listed, one, events):
        text = json.dumps(json.loads(answer), ensure_ascii=False)
        for form in (LONE, STORED, "tok?en-77f1-lone"):
            assert form not in text and form not in answer
    assert "<secret:LONE>" in listed and "<secret:LONE>" in one
    assert "[<secret:LONE>]" in events  # the shell had the value, and its output is masked
    with sqlite3.connect(tmp_path / "home" / "trouper.db") as db:
        rows = [json.dumps(list(r), ensure_ascii=False)
                for table in ("sessions", "events")
                for r in db.execute(f"SELECT * FROM {table}")]  # noqa: S608 - two names
    assert rows and not any(STORED in row or "tok?en" in row for row in rows)
    assert any("<secret:LONE>" in row for row in rows)
