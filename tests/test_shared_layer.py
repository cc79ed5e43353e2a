"""The zygote's shared Landlock layer (``runtimes/sandbox/shared_layer.py``): a shell
confined by it and its session's own rules may do exactly what the one rule set of old
allows, and a layer built before the files changed is never handed to a new session (a
credential store that appeared, a file grown past the pinning limit, a new entry)."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from trouper.runtimes.sandbox import confinement, landlock, shared_layer
from trouper.runtimes.sandbox.confinement import Policy, Resolver, available

pytestmark = pytest.mark.skipif(not available().get("landlock_abi"),
                                reason="this kernel has no Landlock")


def probe(paths: list[Path], tag: str) -> list[str]:
    """What a process may do at each path: read, list, write (what exists), make an
    entry in it (named for this probe: the other finds the files as they were)."""
    seen = []
    for path in paths:
        done = ""
        for what, act in (("r", lambda p: open(p, "rb").close()), ("l", os.listdir),
                          ("w", lambda p: os.close(os.open(p, os.O_WRONLY | os.O_APPEND))),
                          ("m", lambda p: os.mkdir(p / f"new-{tag}"))):
            try:
                act(path)
                done += what
            except OSError:
                pass
        seen.append(done)
    try:  # scoping (ABI 6): no signal to a process outside the shell's domain
        os.kill(os.getppid(), 0)
        seen.append("signals its parent")
    except OSError:
        seen.append("")
    return seen


def confined_probe(prepared: confinement.Prepared, paths: list[Path], tag: str) -> list[str]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            prepared.apply()
            os.write(write, json.dumps(probe(paths, tag)).encode())
        finally:
            os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data)


def tree(root: Path, rng: random.Random) -> list[Path]:
    root.mkdir()
    made = [root]
    for i in range(40):
        parent = rng.choice([p for p in made if p.is_dir()])
        path = parent / f"n{i}"
        if rng.random() < 0.5:
            path.mkdir()
        else:
            with open(path, "wb") as f:
                f.truncate(landlock.PINNED_FILE_LIMIT + 1 if rng.random() < 0.1 else 3)
        made.append(path)
    return made


@pytest.mark.parametrize("seed", range(6))
def test_the_two_layers_allow_what_the_one_rule_set_allows(tmp_path: Path, seed: int) -> None:
    """On a random tree: some denied paths shared (in no writable folder, no grant
    beneath), others the session's (the trouper home around the workspace, a path in a
    writable folder). Each of read, list, write, make, at every path, the same."""
    rng = random.Random(seed)
    made = tree(tmp_path / "t", rng)
    folders = [p for p in made[1:] if p.is_dir()]
    home = rng.choice(folders)
    workspace = home / "workspace"
    workspace.mkdir()
    writable = rng.choice([p for p in folders if home not in p.parents and p != home])
    denied = [home, *rng.sample(made[1:], 5)]
    policy = Policy(writable=(str(workspace), str(writable)),
                    unreadable=tuple(str(p) for p in denied))
    version = available()["landlock_abi"]
    resolver = Resolver()
    grants = confinement._grants(policy, resolver)
    existing = resolver.existing(policy.unreadable)
    shared, own = shared_layer.partition(grants, existing)
    try:
        for _ in range(50):  # a change in /tmp (other tests) between the two: not fresh
            layer = shared_layer.ensure(version, grants, existing)
            if not shared:
                assert layer is None
                return
            assert layer is not None and list(layer.denied) == shared
            assert str(home) not in shared  # the workspace lies in it
            layered = confinement.prepare(policy, shared=shared_layer.take())
            if layered.layered:
                break
            layered.close()
        single = confinement.prepare(policy)
        assert layered.layered and not single.layered and layered.split == single.split
        paths = sorted(set(made) | {workspace, home.parent, writable / "x"}, reverse=True)
        seen = confined_probe(layered, paths, "a")
        assert seen == confined_probe(single, paths, "b")
        assert seen[-1] == "" or available()["landlock_abi"] < 6
        layered.close()
        single.close()
    finally:
        shared_layer.discard()


def test_a_denied_path_is_dropped_only_where_no_walk_reaches_it(tmp_path: Path) -> None:
    """The trouper home holds the workspace, which holds a denied path of its own; beside
    the workspace, the session's state folder. The state folder changes no rule (the
    home's denial covers it); the path in the workspace does, and stays the session's."""
    home, etc = tmp_path / "home", tmp_path / "etc"
    workspace = home / "sessions" / "x" / "workspace"
    for folder in (workspace / ".ssh", home / "sessions" / "x" / "runtime", etc, tmp_path / "tmp"):
        folder.mkdir(parents=True)
    (workspace / ".ssh" / "key").write_text("key")
    (workspace / "code.py").write_text("code")
    (etc / "shadow").write_text("root:x")
    (etc / "passwd").write_text("root")
    denied = sorted(str(p) for p in (home, home / "sessions" / "x" / "runtime",
                                     workspace / ".ssh", etc / "shadow"))
    policy = Policy(writable=(str(workspace), str(tmp_path / "tmp")), unreadable=tuple(denied))
    grants = confinement._grants(policy, Resolver())
    shared, own = shared_layer.partition(grants, denied)
    assert shared == [str(etc / "shadow")]
    assert own == [str(home), str(workspace / ".ssh")]
    version = available()["landlock_abi"]
    paths = [workspace / ".ssh" / "key", workspace / ".ssh", workspace / "code.py", workspace,
             home / "sessions" / "x" / "runtime", etc / "shadow", etc / "passwd", etc,
             tmp_path / "tmp"]
    try:
        for _ in range(50):  # a change in /tmp (other tests) between the two: not fresh
            shared_layer.ensure(version, grants, denied)
            layered = confinement.prepare(policy, shared=shared_layer.take())
            if layered.layered:
                break
            layered.close()
        single = confinement.prepare(policy)
        assert layered.layered
        seen = confined_probe(layered, paths, "a")
        assert seen == confined_probe(single, paths, "b")
        assert seen[:2] == ["", ""] and "r" in seen[2] and seen[4:6] == ["", ""], seen
        layered.close()
        single.close()
    finally:
        shared_layer.discard()


def test_the_layer_is_kept_until_a_folder_it_split_changes(tmp_path: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix=".trouper-test-layer-", dir=Path.home()))
    try:
        (root / "keys").mkdir()
        (root / "keys" / "secret").write_text("s")
        (root / "notes").write_text("x")
        (root / "project").mkdir()
        grants = [("/", landlock.READ), (str(tmp_path), landlock.WRITE)]
        denied = [str(root / "keys" / "secret")]
        version = available()["landlock_abi"]
        for _ in range(50):  # other tests may be changing / or the home meanwhile
            first = shared_layer.ensure(version, grants, denied)
            if first is not None and shared_layer.ensure(version, grants, denied) is first:
                break
        else:
            pytest.fail("the layer was never kept from one request to the next")
        for change in (lambda: (root / "notes").write_text("grown"),  # past the limit?
                       lambda: (root / "new").mkdir(),
                       lambda: (root / "keys" / "other").write_text(""),
                       lambda: (root / "notes").rename(root / "renamed"),
                       lambda: (root / "renamed").unlink()):
            before = shared_layer.ensure(version, grants, denied)
            change()
            assert before is not None and not before.fresh()
            assert shared_layer.ensure(version, grants, denied) is not before
        other = shared_layer.ensure(version, grants, [*denied, str(root / "project")])
        assert other is not None and other.denied == (*denied, str(root / "project"))
    finally:
        shared_layer.discard()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def user_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The program's ``HOME``, with a credential store; in the real home, not in /tmp."""
    home = Path(tempfile.mkdtemp(prefix=".trouper-test-user-", dir=Path.home()))
    try:
        (home / ".ssh").mkdir()
        (home / ".ssh" / "id_ed25519").write_text("ssh-key")
        (home / ".config").mkdir()
        (home / ".m2").mkdir()
        (home / "grows.bin").write_bytes(b"small")
        monkeypatch.setenv("HOME", str(home))
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def zygote(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from trouper.runtimes import sandbox_zygote

    monkeypatch.delenv(sandbox_zygote.ENABLED_ENV, raising=False)
    sandbox_zygote.prepare()
    try:
        sandbox_zygote.ensure_started()
        yield
    finally:
        sandbox_zygote.release()


def test_a_new_session_never_gets_a_layer_older_than_its_files(
        tmp_path: Path, user_home: Path, zygote: None) -> None:
    """Sessions forked by the zygote share its layer; between two, a credential store
    appears (in the home, which the layer split, and in ~/.config, which it granted
    whole), a file in the home grows past the pinning limit and a new file comes: the
    next session refuses the first three and reads the last, as one that walked itself."""
    from trouper.messages.actions import RunCommand
    from trouper.runtimes.local import LocalSandbox

    def attempt(name: str) -> tuple[LocalSandbox, bool]:
        sandbox = LocalSandbox(name, tmp_path / f"ws-{name}",
                               tmp_path / "th" / "sessions" / name / "runtime")
        sandbox.start()
        info = json.loads((sandbox.state_dir / "server.json").read_text())
        return sandbox, info["confinement"]["shared_layer"]

    def start(name: str) -> LocalSandbox:
        for n in range(10):  # the home's folder (others' tests) may change meanwhile
            sandbox, layered = attempt(f"{name}{n}")
            if layered:
                return sandbox
            sandbox.stop()
        pytest.fail("no session was given the zygote's shared layer")

    def run(sandbox: LocalSandbox, command: str) -> str:
        return sandbox.runtime.execute(f"a{os.urandom(4).hex()}", RunCommand(command=command),
                                       timeout_s=20, no_output_timeout_s=10).content

    first = start("one")
    second = None
    try:
        assert "Permission denied" in run(first, "cat ~/.ssh/id_ed25519")
        assert "small" in run(first, "cat ~/grows.bin")
        assert "new shell was started" in run(first, "kill -9 $$")  # both layers again
        assert run(first, "cat ~/.ssh/id_ed25519 /etc/shadow").count("Permission denied") == 2
        (user_home / ".aws").mkdir()
        (user_home / ".aws" / "credentials").write_text("aws-key")
        (user_home / ".config" / "gh").mkdir()
        (user_home / ".config" / "gh" / "hosts.yml").write_text("gh-token")
        with open(user_home / "grows.bin", "ab") as f:
            f.truncate(landlock.PINNED_FILE_LIMIT + 1)
        (user_home / "notes.txt").write_text("mine")
        second = start("two")
        shown = run(second, "cat ~/.aws/credentials ~/.config/gh/hosts.yml; "
                            "head -c 5 ~/grows.bin; cat ~/notes.txt")
        assert "aws-key" not in shown and "gh-token" not in shown, shown
        assert shown.count("Permission denied") == 3 and "mine" in shown, shown
        shown = run(first, "cat ~/.aws/credentials")  # a new entry of a split folder
        assert "aws-key" not in shown and "Permission denied" in shown, shown
        # in a folder the layer granted whole, so watched by nobody: the next server
        # finds the layer not its own and walks alone; the one after gets a new layer
        (user_home / ".m2" / "settings.xml").write_text("maven-password")
        third, _ = attempt("three")
        try:
            assert "maven-password" not in run(third, "cat ~/.m2/settings.xml")
        finally:
            third.stop()
        fourth = start("four")
        try:
            assert "maven-password" not in run(fourth, "cat ~/.m2/settings.xml")
        finally:
            fourth.stop()
    finally:
        first.stop()
        if second is not None:
            second.stop()
