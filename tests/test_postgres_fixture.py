"""The PostgreSQL the tests use: ``scripts/postgres`` (a throwaway cluster) and the
``postgres_server``/``postgres_url`` fixtures (a fresh database per test, dropped after)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import conftest
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "postgres"


def _connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=10)


def _database_exists(server_url: str, name: str) -> bool:
    with _connect(server_url) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return row is not None


def test_postgres_url_is_an_empty_database_of_the_tests_own(postgres_server, postgres_url):
    assert postgres_url != postgres_server
    with _connect(postgres_url) as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]
        assert name.startswith("trouper_test_")
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        assert tables == []
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY, body text NOT NULL)")
        conn.execute("INSERT INTO t VALUES (1, 'one'), (2, 'two')")
        assert conn.execute("SELECT body FROM t ORDER BY id").fetchall() == [("one",), ("two",)]
    assert _database_exists(postgres_server, name)


def test_the_database_is_dropped_after_the_test_even_with_a_connection_open(postgres_server):
    # the fixture's own work, driven as pytest drives it: up to the yield, then resumed
    first = conftest.postgres_database(postgres_server)
    second = conftest.postgres_database(postgres_server)
    url, other_url = next(first), next(second)
    assert url != other_url
    left_open = _connect(url)  # a test that forgot to close: DROP ... WITH (FORCE) ends it
    try:
        name = left_open.execute("SELECT current_database()").fetchone()[0]
        left_open.execute("CREATE TABLE t (id integer)")
        assert _database_exists(postgres_server, name)
        with pytest.raises(StopIteration):
            next(first)
        assert not _database_exists(postgres_server, name)
        assert _fails(left_open)
    finally:
        left_open.close()
    other_name = other_url.rsplit("/", 1)[1]
    assert _database_exists(postgres_server, other_name)  # dropping one left the other
    with pytest.raises(StopIteration):
        next(second)
    assert not _database_exists(postgres_server, other_name)


def _fails(conn: Any) -> bool:
    try:
        conn.execute("SELECT 1")
    except Exception:  # noqa: BLE001 - the server ended the connection: any error will do
        return True
    return False


def test_no_server_skips_and_fails_where_one_is_required(monkeypatch):
    monkeypatch.delenv("TROUPER_TEST_POSTGRES_URL", raising=False)
    monkeypatch.delenv("TROUPER_REQUIRE_POSTGRES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="scripts/postgres start"):
        conftest.postgres_server_or_skip()
    monkeypatch.setenv("TROUPER_REQUIRE_POSTGRES", "1")
    with pytest.raises(pytest.fail.Exception, match="TROUPER_REQUIRE_POSTGRES=1"):
        conftest.postgres_server_or_skip()
    monkeypatch.setenv("TROUPER_TEST_POSTGRES_URL", "postgresql://u:p@127.0.0.1:1/postgres")
    assert conftest.postgres_server_or_skip() == "postgresql://u:p@127.0.0.1:1/postgres"


# -- scripts/postgres


def _bin() -> Path | None:
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")]
    found.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else -1)
    return found[-1] if found else None


def _pg_ctl_status(bin_dir: Path, owner: str, data: Path) -> int:
    argv = [str(bin_dir / "pg_ctl"), "status", "-D", str(data)]
    if os.geteuid() == 0:  # pg_ctl refuses root: as the cluster's owner, as the script does
        argv = ["runuser", "-u", owner, "--", *argv]
    return subprocess.run(argv, capture_output=True, cwd="/").returncode


def _children(pid: int) -> set[int]:
    """Every process whose parent is ``pid``."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_start_makes_a_loopback_cluster_and_stop_leaves_no_process_and_no_folder(tmp_path):
    bin_dir = _bin()
    if os.geteuid() != 0:
        pytest.skip("scripts/postgres runs its cluster as the postgres user: needs root")
    if bin_dir is None:
        pytest.skip("no PostgreSQL server under /usr/lib/postgresql (and no install here)")
    started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
    assert started.returncode == 0, started.stderr
    words = shlex.split(started.stdout)
    assert len(started.stdout.splitlines()) == 1 and words[0] == "export", started.stdout
    values = dict(word.split("=", 1) for word in words[1:])
    folder = Path(values["TROUPER_TEST_POSTGRES_DIR"])
    url = values["TROUPER_TEST_POSTGRES_URL"]
    try:
        assert folder.is_dir() and folder.owner() == "postgres"
        assert folder.stat().st_mode & 0o777 == 0o700
        password_file = folder / "password"
        assert password_file.stat().st_mode & 0o777 == 0o600
        password = password_file.read_text().strip()
        assert len(password) >= 32 and f":{password}@127.0.0.1:" in url
        postmaster = int((folder / "data" / "postmaster.pid").read_text().split()[0])
        assert _pg_ctl_status(bin_dir, "postgres", folder / "data") == 0
        # the server runs as postgres, and the password is in no process's argv
        assert Path(f"/proc/{postmaster}").owner() == "postgres"
        processes = {postmaster} | _children(postmaster)
        assert len(processes) > 1
        for pid in processes:
            assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        with _connect(url) as conn:
            # loopback only: 127.0.0.2 is a second loopback address for the partition test
            listening = conn.execute("SHOW listen_addresses").fetchone()[0].split(",")
            assert listening == ["127.0.0.1", "127.0.0.2"]
            assert conn.execute("SHOW unix_socket_directories").fetchone()[0] == str(folder)
            assert conn.execute("SHOW fsync").fetchone()[0] == "off"
        import psycopg

        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            _connect(url.replace(f":{password}@", ":wrong@"))
        other = conftest.postgres_database(url)  # the fixtures work against it
        with _connect(next(other)) as conn:
            conn.execute("CREATE TABLE t (id integer)")
        with pytest.raises(StopIteration):
            next(other)
    finally:
        stopped = subprocess.run(["bash", str(SCRIPT), "stop", str(folder)],
                                 capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert not folder.exists()
    assert _pg_ctl_status(bin_dir, "postgres", folder / "data") != 0
    assert not [pid for pid in processes if _alive(pid)]
    # stop again: nothing to do; a folder start did not make: refused and left alone
    again = subprocess.run(["bash", str(SCRIPT), "stop", str(folder)], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    refused = subprocess.run(["bash", str(SCRIPT), "stop", str(tmp_path)], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "left alone" in refused.stderr
    assert tmp_path.is_dir()
