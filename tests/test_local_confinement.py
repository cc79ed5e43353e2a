"""The local runtime confines its shell: a model told to misbehave cannot read the trouper
home (a session's ``secrets.json``), the user's ``~/.ssh`` or cloud credentials, nor write
outside the workspace and the temporary folders; with ``network=False`` it opens no
network socket. Each attack runs as a real session's command, through the real sandbox
server, and the controls show the same commands succeed unconfined."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from trouper import AgentState, ObservationEvent, Trouper
from trouper.runtimes.sandbox.confinement import available
from trouper.testing import check_log

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not available().get("landlock_abi"),
                       reason="this kernel has no Landlock: the shell cannot be confined"),
]

SECRET = "confined-secret-7c41e0b9"
SSH_KEY = "-----BEGIN FAKE KEY----- ssh-key-5d2a"
AWS_KEY = "aws_secret_access_key = aws-key-9e8f"


@pytest.fixture
def user_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's home with credentials, as the program's (and so the shell's) ``HOME``.
    Not under /tmp (the shell may write the temporary folders): in the real home."""
    home = Path(tempfile.mkdtemp(prefix=".trouper-test-user-", dir=Path.home()))
    try:
        _fill(home)
        monkeypatch.setenv("HOME", str(home))
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _fill(home: Path) -> None:
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text(SSH_KEY)
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text(AWS_KEY)
    (home / "notes.txt").write_text("mine\n")
    (home / "outside").mkdir()


def run(tmp_path: Path, scripted, commands: list[str], **runtime) -> tuple[list, Path, Path]:
    """A session of ``commands`` under a trouper home in ``tmp_path``: its outcomes, the
    home and the workspace."""
    steps = [{"tool": "run", "args": {"command": c}} for c in commands]
    _, llm = scripted([*steps, {"tool": "finish", "args": {"message": "done"}}])
    home, workspace = tmp_path / "trouper-home", tmp_path / "work"
    with Trouper(home=home) as t:
        session = t.start_session("misbehave", llm=llm, workspace=str(workspace),
                                  session_id="confined",
                                  runtime={"kind": "local", **runtime},
                                  secrets={"MY_SECRET": SECRET})
        assert session.wait(timeout=90) == AgentState.FINISHED, session.record.state_reason
        events = list(session.events())
        check_log(events)
    return [e.outcome for e in events if isinstance(e, ObservationEvent)], home, workspace


def test_the_shell_reads_no_secret_of_the_home_or_the_user(tmp_path, scripted, user_home):
    outcomes, home, workspace = run(tmp_path, scripted, [
        f"cat {tmp_path}/trouper-home/sessions/confined/secrets.json",
        f"ls {tmp_path}/trouper-home/sessions/",
        "cat ~/.ssh/id_ed25519; ls ~/.ssh",
        "cat ~/.aws/credentials",
        "cat ~/notes.txt /etc/hostname > /dev/null && echo readable",
    ])
    shown = "\n".join(o.content for o in outcomes)
    assert SSH_KEY not in shown and "aws-key" not in shown and "<secret:MY_SECRET>" not in shown
    for outcome in outcomes[:4]:
        assert "Permission denied" in outcome.content and outcome.exit_code != 0, outcome
    assert "readable" in outcomes[4].content  # the rest of the home and the system are


def test_the_shell_writes_only_the_workspace_and_temporary_folders(tmp_path, scripted,
                                                                   user_home):
    outside = user_home / "outside"
    outcomes, _, workspace = run(tmp_path, scripted, [
        "echo pwned >> ~/notes.txt",
        f"echo pwned > {outside}/dropped; mkdir {outside}/folder; rm -f ~/notes.txt",
        "echo ok > inside.txt && mkdir -p sub && mv inside.txt sub/ && cat sub/inside.txt",
        'echo tmp > "${TMPDIR:-/tmp}/scratch" && cat "${TMPDIR:-/tmp}/scratch"',
        "cp /bin/sh ./x && chmod 4755 x; chmod g+s x; ls -l x",
    ])
    for outcome in outcomes[:2]:
        assert outcome.exit_code != 0 and "Permission denied" in outcome.content, outcome
    assert (user_home / "notes.txt").read_text() == "mine\n"
    assert list(outside.iterdir()) == []
    assert outcomes[2].content.strip() == "ok" and outcomes[3].content.strip() == "tmp"
    assert "Operation not permitted" in outcomes[4].content
    made = workspace / "x"
    assert made.exists() and made.stat().st_mode & 0o6000 == 0


def test_unconfined_the_same_commands_reach_everything(tmp_path, scripted, user_home):
    """The control: ``confine=False`` is the shell of old, which reads the key."""
    outcomes, _, _ = run(tmp_path, scripted, ["cat ~/.ssh/id_ed25519"], confine=False)
    assert SSH_KEY in outcomes[0].content


def test_a_session_adds_its_own_unreadable_and_writable_paths(tmp_path, scripted, user_home):
    (user_home / "private").mkdir()
    (user_home / "private" / "plan.txt").write_text("plan-3f1a")
    cache = user_home / "cache"
    cache.mkdir()
    outcomes, _, _ = run(tmp_path, scripted, [
        "cat ~/private/plan.txt", "echo cached > ~/cache/entry && cat ~/cache/entry"],
        unreadable=[str(user_home / "private")], writable=[str(cache)])
    assert "Permission denied" in outcomes[0].content and "plan-3f1a" not in outcomes[0].content
    assert outcomes[1].content.strip() == "cached"


def test_without_network_the_shell_opens_no_socket_but_unix(tmp_path, scripted, user_home):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        probe = ("python3 -c \"import socket, sys; socket.create_connection(('127.0.0.1', "
                 f"{port}), timeout=5); print('connected')\"")
        unix = "python3 -c \"import socket; socket.socketpair(); print('unix ok')\""
        cut, _, _ = run(tmp_path / "off", scripted, [probe, unix], network=False)
        kept, _, _ = run(tmp_path / "on", scripted, [probe])
    assert "connected" not in cut[0].content and cut[0].exit_code != 0
    assert "PermissionError" in cut[0].content
    assert cut[1].content.strip() == "unix ok"
    assert kept[0].content.strip() == "connected"  # the control: the default keeps it


def test_options_are_checked_before_anything_starts():
    from trouper.config.models import LocalRuntime

    with pytest.raises(ValueError, match="not an absolute path"):
        LocalRuntime(unreadable=("relative/path",))
    with pytest.raises(ValueError, match="needs confine=True"):
        LocalRuntime(confine=False, network=False)
    assert json.loads(LocalRuntime(writable=("~/cache",)).model_dump_json())["writable"][0] \
        .endswith("/cache")


def test_the_file_tools_refuse_what_the_shell_may_not_read(tmp_path, user_home):
    """A workspace that is the user's home holds ``~/.ssh``: the file tools, which run in
    the (unconfined) sandbox server, refuse it as the confined shell would."""
    from trouper.messages.actions import EditFile, ReadFile, WriteFile
    from trouper.runtimes.local import LocalSandbox

    sandbox = LocalSandbox("tools", user_home, tmp_path / "th" / "sessions" / "tools" / "runtime")
    sandbox.start()
    try:
        def do(action_id: str, action) -> str:
            outcome = sandbox.runtime.execute(action_id, action, timeout_s=20,
                                              no_output_timeout_s=10)
            return f"{outcome.status}: {outcome.content}"

        key = ".ssh/id_ed25519"
        for n, action in enumerate([
            ReadFile(path=key), ReadFile(path=str(user_home / key)),
            WriteFile(path=".ssh/authorized_keys", content="ssh-ed25519 AAAA attacker"),
            EditFile(path=".aws/credentials", old="aws", new="AWS"),
            ReadFile(path=".ssh/../.ssh/id_ed25519"),
        ]):
            shown = do(f"t{n}", action)
            assert shown.startswith("error:") and "permission denied" in shown, shown
            assert SSH_KEY not in shown
        assert not (user_home / ".ssh" / "authorized_keys").exists()
        assert (user_home / ".aws" / "credentials").read_text() == AWS_KEY
        assert do("ok", ReadFile(path="notes.txt")).startswith("ok:")  # the rest is there
    finally:
        sandbox.stop()


def test_a_restarted_shell_is_confined_as_the_first(tmp_path, user_home):
    """The sandbox prepares its rule set once; every shell it starts applies it."""
    from trouper.messages.actions import RunCommand
    from trouper.runtimes.local import LocalSandbox

    sandbox = LocalSandbox("again", tmp_path / "ws", tmp_path / "th" / "sessions" / "again"
                           / "runtime")
    sandbox.start()
    try:
        def run(action_id: str, command: str) -> str:
            return sandbox.runtime.execute(action_id, RunCommand(command=command),
                                           timeout_s=20, no_output_timeout_s=10).content

        first = run("r1", "echo $$")
        assert "new shell was started" in run("r2", "kill -9 $$")
        assert run("r3", "echo $$").split()[0] != first.split()[0]
        shown = run("r4", "cat ~/.ssh/id_ed25519; chmod 4755 /bin/sh 2>&1 | head -1")
        assert "Permission denied" in shown and SSH_KEY not in shown
    finally:
        sandbox.stop()
