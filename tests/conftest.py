"""Shared fixtures: a trouper home, a running Trouper, and scripted LLM configs."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# litellm in every worker from the start, so each Trouper a test opens here forks its
# broker with it (as a program that imported litellm first): no second import per worker.
# test_lean_processes runs a lean program.
import trouper.llm.client  # noqa: E402, F401
from trouper.testing import FakeLLMServer, load_script  # noqa: E402
from trouper.testing.daemon import TestDaemon  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # the suite's own helpers: tests import accel
from accel import forkserver  # noqa: E402

# The suite's trouper processes (CLI commands, daemons) and pytest's workers are forked
# from one zygote that imported trouper, litellm and pytest once (accel/forkserver.py):
# ~3.5 s of CPU each otherwise, most of the suite's. README's first command still starts
# afresh.
TestDaemon.popen = forkserver.Popen
_worker_zygote_folder: list[str] = []
_background: list[Any] = []


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    """In the controller, before the workers start: fork them from the zygote."""
    import tempfile
    import threading

    rewriting = threading.Thread(target=_rewrite_once, args=(config,), name="rewrite-once")
    rewriting.start()  # meanwhile the zygote imports; a worker finding no pyc rewrites
    _background.append(rewriting)
    if os.environ.get(forkserver.FORK_ENV, "1") == "0":
        return
    popen = [spec for spec in specs if spec.popen and not spec.python]
    if popen:
        folder = tempfile.mkdtemp(prefix="trouper-zygote-")  # owner-only
        _worker_zygote_folder.append(folder)
        python = forkserver.serve_workers(folder)
        for spec in popen:
            spec.python = python


def _rewrite_once(config: pytest.Config) -> None:
    """Rewrite the suite's asserts once, here, into pytest's cache beside the tests, which
    every worker then reads: each would otherwise rewrite all of them again (~1.8 CPU-s a
    worker; this environment sets PYTHONDONTWRITEBYTECODE, so none writes the cache). Uses
    pytest's own rewriting functions; without them (another pytest) workers rewrite."""
    try:
        from _pytest.assertion import rewrite
        from _pytest.assertion.rewrite import assertstate_key
    except ImportError:
        return
    state = config.stash.get(assertstate_key, None)
    if state is None:
        return
    for source in sorted(Path(__file__).parent.glob("*.py")):
        cache = rewrite.get_cache_dir(source)
        pyc = cache / (source.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(source, pyc) is not None or not rewrite.try_makedirs(cache):
            continue
        source_hash, code = rewrite._rewrite_test(source, config)
        rewrite._write_pyc(state, code, source_hash, pyc)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import shutil

    forkserver.stop()  # the zygote this process started, if it started one
    for thread in _background:
        thread.join()
    for folder in _worker_zygote_folder:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def trouper_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def trouper(trouper_home: Path) -> Iterator[Any]:
    from trouper import Trouper

    with Trouper(home=trouper_home) as t:
        yield t


@pytest.fixture
def scripted():
    """``scripted(steps) -> (server, llm_config)``; servers stop at the test's end."""
    servers: list[FakeLLMServer] = []

    def start(steps: list[dict[str, Any]], **server_options: Any) -> tuple[FakeLLMServer, dict]:
        server = FakeLLMServer(load_script(steps), **server_options).start()
        servers.append(server)
        llm = {"model": "hosted_vllm/scripted", "base_url": server.url, "api_key": "test-key"}
        return server, llm

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def make_sandbox(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``make_sandbox(**options)``: a started LocalSandbox in tmp_path; all stopped at the end."""
    from trouper.runtimes.local import LocalSandbox

    started: list[LocalSandbox] = []

    def make(**kwargs: Any) -> LocalSandbox:
        kwargs.setdefault("interrupt_grace_s", 0.5)
        sandbox = LocalSandbox("test", tmp_path / "ws", tmp_path / "rt", **kwargs)
        started.append(sandbox)
        sandbox.start(1)
        return sandbox

    try:
        yield make
    finally:
        for sandbox in started:
            sandbox.stop()


@pytest.fixture
def chunked() -> Callable[..., str]:
    """``chunked(masker, text, cuts)``: ``text`` masked by a StreamMasker fed in pieces."""
    from trouper.runtimes.sandbox.stream import StreamMasker

    def mask(masker: Any, text: str, cuts: list[int]) -> str:
        stream = StreamMasker(masker)
        pieces, last = [], 0
        for cut in sorted(cuts) + [len(text)]:
            pieces.append(stream.feed(text[last:cut]))
            last = cut
        return "".join(pieces) + stream.flush()

    return mask


# -- docker ------------------------------------------------------------------------------
# Fixtures of the tests/test_docker_*.py modules. Without an engine or the test image they
# skip, saying why; in CI (CI set, or TROUPER_REQUIRE_DOCKER=1) they fail instead.

DOCKER_TEST_IMAGE = "trouper-test-busybox:latest"
"""Built by scripts/docker-engine: busybox alone (no bash, no python)."""
DOCKER_FIX = ("to run them, start an engine and build the test image with: "
              "bash scripts/docker-engine start")
"""What a skipped or failed Docker test tells the reader to do."""


def _docker_required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("TROUPER_REQUIRE_DOCKER") == "1"


@pytest.fixture(scope="session")
def docker_client() -> Any:
    """A docker SDK client of a running engine that has ``DOCKER_TEST_IMAGE``."""
    return docker_client_or_skip()


def docker_client_or_skip() -> Any:
    """``docker_client``'s work: the client, or a skip (a failure in CI) that says why and
    how to stop skipping."""
    import shutil

    problem = ""
    client = None
    try:
        import docker

        client = docker.from_env(timeout=60)
        client.ping()
        client.images.get(DOCKER_TEST_IMAGE)
    except ImportError:
        problem = "the docker Python SDK is not installed"
    except Exception as e:  # noqa: BLE001 - whatever it is, the reason is reported
        problem = f"no Docker engine with the image {DOCKER_TEST_IMAGE}: {e}"
    if not problem and shutil.which("docker") is None:
        problem = "the docker CLI is not on PATH"
    if problem:
        if _docker_required():
            pytest.fail(f"{problem} (required: CI or TROUPER_REQUIRE_DOCKER=1; {DOCKER_FIX})")
        pytest.skip(f"{problem} ({DOCKER_FIX})")
    return client


@pytest.fixture(scope="module")
def docker_homes(docker_client: Any) -> Iterator[Callable[[Path], Path]]:
    """``docker_homes(home)`` registers a trouper home the module's tests use; at the
    module's end no container labelled with its owner may be left (they are removed,
    and the module fails)."""
    from trouper.runtimes.docker_support import LABEL_OWNER, list_containers, owner_of_home

    homes: list[Path] = []

    def register(home: Path) -> Path:
        homes.append(Path(home))
        return Path(home)

    yield register
    left = []
    for home in homes:
        for container in list_containers(docker_client, [f"{LABEL_OWNER}={owner_of_home(home)}"]):
            left.append(f"{container.name} ({container.labels.get('trouper.client.session')})")
            container.remove(force=True)
    assert not left, f"containers left behind: {left}"


# -- PostgreSQL
# The tests of the PostgreSQL store (issue 32) need a server: scripts/postgres starts a
# throwaway one (CI's .ci/run does, and sets TROUPER_REQUIRE_POSTGRES=1 so that they fail
# rather than skip there). Each test gets a database of its own on it (``postgres_url``).

POSTGRES_FIX = ('start one with: eval "$(bash scripts/postgres start)" (it sets '
                "TROUPER_TEST_POSTGRES_URL; "
                'bash scripts/postgres stop "$TROUPER_TEST_POSTGRES_DIR" ends it)')
"""What a skipped or failed PostgreSQL test tells the reader to do."""


def postgres_server_or_skip() -> str:
    """``postgres_server``'s work: the server's URL (its ``postgres`` database) from
    ``TROUPER_TEST_POSTGRES_URL``, or a skip (a failure with TROUPER_REQUIRE_POSTGRES=1)."""
    url = os.environ.get("TROUPER_TEST_POSTGRES_URL", "")
    if not url:
        problem = "no PostgreSQL for the tests: TROUPER_TEST_POSTGRES_URL is not set"
        if os.environ.get("TROUPER_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{problem} (required: TROUPER_REQUIRE_POSTGRES=1); {POSTGRES_FIX}")
        pytest.skip(f"{problem}; {POSTGRES_FIX}")
    return url


def postgres_database(server_url: str) -> Iterator[str]:
    """``postgres_url``'s work: a database no other test uses on the server at
    ``server_url``, its URL yielded, dropped (whatever still connects closed) when resumed."""
    from trouper.testing.postgres import scratch_database

    return scratch_database(server_url, "trouper_test")


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The URL of the tests' PostgreSQL server (its ``postgres`` database; a superuser)."""
    return postgres_server_or_skip()


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """The URL of a fresh, empty database of this test's own, dropped after it."""
    yield from postgres_database(postgres_server)


# -- remote runtime


class RemoteServer:
    """A ``trouper runtime-server`` subprocess on 127.0.0.1, with its token file and workdir.

    ``kill()`` SIGKILLs it (its shells live on, as after a real crash); ``start()`` again
    serves the same workdir on the same port; ``stop()`` ends it and any shell it left.
    """

    def __init__(self, root: Path, token: str | None = None, fresh: bool = False) -> None:
        """``fresh``: started from a new interpreter, not forked from the suite's zygote
        (for a test that reads the process's ``/proc`` argv or environment)."""
        import secrets

        self.fresh = fresh
        self.root = root
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.workdir = root / "workdir"
        self.token = token or secrets.token_urlsafe(32)
        self.token_file = root / "token"
        self.token_file.write_text(self.token + "\n")
        self.token_file.chmod(0o600)
        self.port = 0
        """0 until the first start, which takes any free port (a port chosen here and
        bound later was sometimes taken in between); later starts reuse it."""
        self.url = ""
        self.proc: Any = None
        self.log = root / "server.log"
        self.tls: str | None = None
        """The certificate file when the server serves HTTPS."""

    def argv(self, *extra: str) -> list[str]:
        import sys

        return [sys.executable, "-m", "trouper", "runtime-server", "--workdir",
                str(self.workdir), "--token-file", str(self.token_file), "--port",
                str(self.port), *extra]

    def start(self, *extra: str) -> RemoteServer:
        import subprocess

        from trouper.testing import wait_until

        if "--tls-cert" in extra:
            self.tls = extra[list(extra).index("--tls-cert") + 1]

        popen = subprocess.Popen if self.fresh else forkserver.Popen
        info = self.workdir / "server.json"
        info.unlink(missing_ok=True)  # a killed server's, naming its dead pid
        with open(self.log, "ab") as log:
            self.proc = popen(self.argv(*extra), stdin=subprocess.DEVNULL, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: info.exists() or self.proc.poll() is not None, 30,
                   "the runtime server to listen")
        if self.proc.poll() is None:
            self.port = int(json.loads(info.read_text())["port"])
            self.url = f"http://127.0.0.1:{self.port}"
        wait_until(self.healthy, 30, f"the runtime server on port {self.port} to answer")
        return self

    def healthy(self) -> bool:
        import httpx

        from trouper.security.tls import default_ssl_context

        if self.tls:  # the test's own self-signed certificate
            import ssl

            url = self.url.replace("http://", "https://")
            verify: Any = ssl.create_default_context(cafile=self.tls)
        else:
            url, verify = self.url, default_ssl_context()

        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the runtime server exited {self.proc.returncode}: "
                               f"{self.log.read_text()[-2000:]}")
        try:
            reply = httpx.get(f"{url}/v1/health", timeout=2, trust_env=False, verify=verify,
                              headers={"Authorization": f"Bearer {self.token}"})
        except httpx.HTTPError:
            return False
        return reply.status_code == 200

    def kill(self) -> None:
        """SIGKILL the server process alone (as a crash of its host process would)."""
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        import signal
        import subprocess

        from trouper.runtimes.remote_server.registry import Sessions

        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.workdir.exists():  # shells a killed server left behind
            Sessions(self.workdir).kill_leftovers()

    def runtime(self, **options: Any) -> dict[str, Any]:
        """The ``runtime=`` of a session on this server."""
        return {"kind": "remote", "url": self.url, "token": self.token,
                "ready_timeout_s": 60.0, **options}

    def workspace(self, session_id: str) -> Path:
        return self.workdir / session_id / "workspace"


@pytest.fixture
def remote_server(tmp_path: Path) -> Iterator[Callable[..., RemoteServer]]:
    """``remote_server(*extra_args)``: a started ``RemoteServer``; all stopped at the end."""
    servers: list[RemoteServer] = []

    def start(*extra: str, token: str | None = None, fresh: bool = False) -> RemoteServer:
        server = RemoteServer(tmp_path / f"remote-{len(servers)}", token, fresh)
        servers.append(server)
        return server.start(*extra)

    try:
        yield start
    finally:
        for server in servers:
            server.stop()
