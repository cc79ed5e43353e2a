"""The cluster key: one token for every daemon, secrets sealed in the store, and a daemon
with another key (or none) refused before it reads or writes anything sealed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from trouper.cli.main import main
from trouper.cluster.key import ClusterKey
from trouper.exceptions import ConfigError, StoreError


def test_a_key_is_made_owner_only_once_and_read_back_the_same(tmp_path: Path):
    path = tmp_path / "k" / "cluster.key"
    made = ClusterKey.load(path, create=True)
    assert os.stat(path).st_mode & 0o777 == 0o600
    again = ClusterKey.load(path, create=True)  # never replaced
    assert again.token == made.token and again.check_value == made.check_value
    assert made.token not in path.read_text() and made.check_value not in path.read_text()


def test_a_missing_or_loose_or_malformed_key_is_refused_saying_what_to_do(tmp_path: Path):
    with pytest.raises(ConfigError, match="copy the key file"):
        ClusterKey.load(tmp_path / "none.key", create=False)
    loose = tmp_path / "loose.key"
    loose.write_text("00" * 32)
    loose.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        ClusterKey.load(loose, create=False)
    short = tmp_path / "short.key"
    short.write_text("abcd")
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="64 hex digits"):
        ClusterKey.load(short, create=False)


def test_a_sealed_value_opens_only_for_its_subject_and_purpose_with_the_same_key(tmp_path):
    key = ClusterKey.load(tmp_path / "a.key", create=True)
    other = ClusterKey.load(tmp_path / "b.key", create=True)
    sealed = key.seal("session secrets", "s1", {"llm_api_key": "sk-very-secret"})
    assert b"sk-very-secret" not in sealed
    assert key.open("session secrets", "s1", sealed) == {"llm_api_key": "sk-very-secret"}
    for opener, purpose, subject in ((key, "session secrets", "s2"),
                                     (key, "daemon call", "s1"),
                                     (other, "session secrets", "s1")):
        with pytest.raises(StoreError, match="does not open"):
            opener.open(purpose, subject, sealed)
    tampered = bytearray(sealed)
    tampered[-1] ^= 1
    with pytest.raises(StoreError):
        key.open("session secrets", "s1", bytes(tampered))


def test_a_store_password_on_the_command_line_is_refused(tmp_path: Path):
    result = CliRunner().invoke(main, [
        "daemon", "start", "--home", str(tmp_path / "h"),
        "--store", "postgresql://trouper:hunter2-pw@127.0.0.1:1/trouper"])
    assert result.exit_code == 2
    assert "TROUPER_STORE" in result.output and "hunter2-pw" not in result.output
    assert not (tmp_path / "h" / "daemon.json").exists()


def test_a_daemon_with_another_key_or_none_is_refused_by_the_cluster(tmp_path, postgres_url):
    from trouper.cluster.registry import Registry
    from trouper.store import open_store

    store = open_store(postgres_url)
    try:
        registry = Registry(store)  # type: ignore[arg-type]
        assert not registry.has_cluster()
        first = ClusterKey.load(tmp_path / "first.key", create=True)
        registry.check_key(first)
        assert registry.has_cluster()
        registry.check_key(first)  # the same key again: welcome
        with pytest.raises(ConfigError, match="not this cluster's"):
            registry.check_key(ClusterKey.load(tmp_path / "other.key", create=True))
    finally:
        store.close()
