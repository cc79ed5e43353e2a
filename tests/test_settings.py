"""Settings: defaults, TROUPER_* overrides, refusals naming the variable, one per process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from trouper.config.settings import Settings, env_name, settings
from trouper.exceptions import ConfigError
from trouper.llm.gate import AdmissionGate, GateLimits

WINDOW = env_name("rate_window_s")


@pytest.fixture
def fresh_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """The process's settings re-read from an environment the test may change."""
    for name in Settings.model_fields:
        monkeypatch.delenv(env_name(name), raising=False)
    settings.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    settings.cache_clear()


def test_defaults_are_a_minute_with_a_one_second_margin():
    assert Settings.from_env({}) == Settings() == Settings(rate_window_s=60.0,
                                                          rate_window_margin_s=1.0)
    assert WINDOW == "TROUPER_RATE_WINDOW_S"


def test_variables_override_their_field_and_nothing_else():
    env = {WINDOW: " 6 ", "TROUPER_RATE_WINDOW_MARGIN_S": "0.5", "TROUPER_HOME": "/x"}
    assert Settings.from_env(env) == Settings(rate_window_s=6.0, rate_window_margin_s=0.5)
    assert Settings.from_env({WINDOW: ""}).rate_window_s == 60.0  # empty counts as unset


@pytest.mark.parametrize("value", ["0", "-1", "abc", "inf", "nan", "1e999"])
def test_a_bad_value_is_refused_naming_the_variable_and_the_value(value):
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({WINDOW: value})
    assert refused.value.field == WINDOW
    assert str(refused.value).startswith(f"{WINDOW}: ")
    assert repr(value) in str(refused.value)


def test_settings_are_frozen_and_refuse_unknown_fields():
    with pytest.raises(ValidationError):
        Settings().rate_window_s = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Settings(rate_windows=6)  # type: ignore[call-arg]


def test_settings_are_read_once_per_process(fresh_settings):
    fresh_settings.setenv(WINDOW, "6")
    first = settings()
    fresh_settings.setenv(WINDOW, "7")
    assert settings() is first and first.rate_window_s == 6.0


def test_a_forked_process_reads_its_own_environment(fresh_settings):
    assert settings().rate_window_s == 60.0  # cached here before the override
    fresh_settings.setenv(WINDOW, "6")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it reads, and leave at once
        try:
            os.write(write_fd, str(settings().rate_window_s).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        seen = pipe.read()
    os.waitpid(pid, 0)
    assert seen == "6.0"
    assert settings().rate_window_s == 60.0


def test_the_gate_counts_over_the_window_the_settings_give(fresh_settings):
    fresh_settings.setenv(WINDOW, "6")
    now = [0.0]
    gate = AdmissionGate(GateLimits(rpm=1), clock=lambda: now[0], warm=True)
    gate.request("a", "s", 1)
    gate.request("b", "s", 1)
    assert gate.admit() == ["a"]
    assert gate.next_admission_in_s() == 6.0
    assert gate.stats()["window_s"] == 6.0


def test_trouper_refuses_a_bad_setting_before_creating_anything(fresh_settings,
                                                                 tmp_path: Path):
    from trouper import Trouper

    fresh_settings.setenv(WINDOW, "0")
    with pytest.raises(ConfigError) as refused:
        Trouper(home=tmp_path / "home")
    assert refused.value.field == WINDOW
    assert not (tmp_path / "home").exists()


def test_every_setting_is_documented_in_operations():
    from pathlib import Path

    from trouper.config.settings import Settings, env_name

    docs = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    assert [n for n in Settings.model_fields if env_name(n) not in docs] == []
