"""``TROUPER_LOG_FORMAT=json``: every line trouper logs is one JSON object with the same
fields, wherever it is written (the actors' ``trouper.log``, a sandbox's ``server.log``,
the daemon's log), masked like any record; the default stays the text it always was."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from trouper import AgentState, Trouper
from trouper.config.settings import settings
from trouper.home.paths import Home
from trouper.messages.events import ObservationEvent
from trouper.testing.daemon import running_daemon

FIELDS = {"ts", "level", "logger", "message", "pid", "role", "session_id", "seq",
          "trace_id", "exc"}
SECRET = "tok-7f3c9a51e2b84d06"


@pytest.fixture
def json_format(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """JSON logs for this program and every process it starts (settings are read once a
    process: this one's are read again)."""
    monkeypatch.setenv("TROUPER_LOG_FORMAT", "json")
    settings.cache_clear()
    yield
    monkeypatch.delenv("TROUPER_LOG_FORMAT")
    settings.cache_clear()


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of ``path`` as a JSON object with all the fields; fails on any other."""
    objects = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            obj = json.loads(line)
        except ValueError:
            pytest.fail(f"{path.name} line {n} is not JSON: {line!r}")
        assert isinstance(obj, dict) and set(obj) == FIELDS, (path.name, n, line)
        assert datetime.fromisoformat(obj["ts"]).utcoffset().total_seconds() == 0
        assert obj["level"] in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
        assert isinstance(obj["pid"], int) and isinstance(obj["role"], str) and obj["role"]
        assert obj["trace_id"] is None  # no tracing yet
        objects.append(obj)
    return objects


def written_logs(home: Path) -> list[Path]:
    """The log files trouper formats under ``home``: its ``logs/`` (but Thespian's own
    diagnostics, which Thespian writes without ``logging``) and each sandbox's log."""
    return ([p for p in (home / "logs").glob("*.log") if p.name != "thespian.log"]
            + list(home.glob("sessions/*/runtime/server.log")))


@pytest.mark.slow
def test_a_session_logs_json_lines_naming_its_process_and_session_never_the_secret(
        tmp_path, scripted, json_format):
    command = "echo <secret:TOKEN> fmt=${TROUPER_LOG_FORMAT:-none}"
    _, llm = scripted([{"tool": "run", "args": {"command": command}},
                       {"tool": "finish", "args": {"message": "done"}}])
    home = tmp_path / "home"
    with Trouper(home=home) as t:
        session = t.start_session("echo the token", llm=llm, workspace=tmp_path / "ws",
                                  secrets={"TOKEN": SECRET})
        assert session.wait(timeout=90) == AgentState.FINISHED
        sid = session.id
        outputs = [e.outcome.content for e in session.events()
                   if isinstance(e, ObservationEvent)]
    assert outputs[0] == "<secret:TOKEN> fmt=none\n"  # the setting stays out of the shell

    by_file = {p.name: json_lines(p) for p in written_logs(home)}
    assert by_file["trouper.log"] and by_file["server.log"]
    ours = by_file["trouper.log"]
    assert any(o["role"] in {"controller", "runtime"} and o["session_id"] == sid for o in ours)
    assert all(o["session_id"] in {None, sid} for o in ours)
    sandbox = by_file["server.log"]
    assert {o["role"] for o in sandbox} == {"sandbox"}
    assert {o["session_id"] for o in sandbox} == {sid}
    for path in written_logs(home):  # that a line holding it is masked: the test below
        assert SECRET not in path.read_text(encoding="utf-8"), path


def test_a_record_with_a_secret_and_a_traceback_is_one_masked_json_line(
        tmp_path, json_format):
    """The CLI's own handler (``log_to_home``): the secret masked in the message and in
    the traceback, in its plain and its JSON-escaped spelling alike."""
    from trouper.cli.support import log_to_home, remove_cli_logging
    from trouper.security.masking import remember_secrets

    quoted = 'pw-"quoted"-51e2b84d'  # JSON writes it escaped: \" inside the line
    remember_secrets({"PASSWORD": quoted, "TOKEN": SECRET})
    path = log_to_home(Home.at(tmp_path / "home"), debug=False)
    try:
        try:
            raise RuntimeError(f"refused {quoted}")
        except RuntimeError:
            logging.getLogger("trouper.test").exception("login with %s failed", SECRET,
                                                        extra={"seq": 7})
    finally:
        remove_cli_logging()
    (line,) = json_lines(path)
    assert line["message"] == "login with <secret:TOKEN> failed"
    assert line["logger"] == "trouper.test" and line["level"] == "ERROR"
    assert line["role"] == "cli" and line["seq"] == 7 and line["session_id"] is None
    assert "RuntimeError: refused <secret:PASSWORD>" in line["exc"]
    text = path.read_text(encoding="utf-8")
    assert SECRET not in text and quoted not in text and json.dumps(quoted)[1:-1] not in text


def test_text_stays_the_default_format(tmp_path, monkeypatch):
    from trouper.home.logs import log_definitions

    monkeypatch.delenv("TROUPER_LOG_FORMAT", raising=False)
    settings.cache_clear()
    defs = log_definitions(Home.at(tmp_path / "home"))
    assert defs["formatters"] == {
        "plain": {"format": "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"}}
    assert defs["handlers"]["file"]["formatter"] == "plain"


@pytest.mark.slow
def test_the_daemon_logs_json_lines(tmp_path, json_format):
    home = tmp_path / "home"
    with running_daemon(home, env={"TROUPER_LOG_FORMAT": "json"}) as daemon:
        assert daemon.client().sessions() == []
    lines = json_lines(home / "logs" / "daemon.log")
    assert any(o["role"] == "daemon" and "daemon serving" in o["message"] for o in lines)
    json_lines(home / "logs" / "trouper.log")  # its actors' lines too, if any


def test_a_record_names_the_session_of_the_message_handled_else_the_actors_own(json_format):
    """What the actor base sets: a SessionSupervisor's records name the session of the
    message it handles; a Controller's, its own session, from any thread."""
    from trouper.home.log_format import about_session, bind_actor, install_log_context
    from trouper.runtimes.sandbox.logs import ROLE_ATTR, SESSION_ATTR

    class Serving:
        role = "controller"
        session_id = "s-own"

    install_log_context()
    log = logging.getLogger("trouper.test")

    def made() -> tuple[str, str | None]:
        record = log.makeRecord(log.name, logging.INFO, __file__, 1, "m", None, None)
        return getattr(record, ROLE_ATTR), getattr(record, SESSION_ATTR)

    bind_actor(Serving())
    try:
        assert made() == ("controller", "s-own")
        with about_session("s-named"):
            assert made() == ("controller", "s-named")
        assert made() == ("controller", "s-own")
    finally:
        bind_actor(object())  # this process runs no actor again
    assert made() == ("actor", None)
