"""I7 attacked (docs/promises.md): trouper's listeners are loopback-only and no forged frame
is unpickled.

The attack is the one a local user (or, before this, anyone on the network) could make:
find every port trouper's processes listen on and send each a framed pickle whose
unpickling creates a file. Every actor process must drop it before ``pickle.loads``,
stay alive, and let the session finish.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
from pathlib import Path

import pytest

from trouper import AgentState, Trouper
from trouper.actors.transport import (
    MAC_BYTES,
    AuthenticatedCodec,
    ForgedFrame,
    TransportSeamMissing,
    check_seams,
    sealed,
)
from trouper.host.processes import listening_sockets, pid_alive, socket_inodes
from trouper.testing import check_log, wait_until

pytestmark = pytest.mark.slow  # starts real processes: `-m 'not slow'` skips it

GATE = "touch waiting; while [ ! -f go ]; do sleep 0.02; done; echo released"


class _Plant:
    """Unpickling this runs ``touch PATH``: what an attacker's frame would do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.path}",))


def _group_of(pid: int) -> list[int]:
    """Every process in ``pid``'s process group (Thespian's admin, logger and actors)."""
    group = os.getpgid(pid)
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == group:
                    members.append(int(entry))
            except OSError:
                continue
    return members


def _trouper_processes(home: Path) -> list[int]:
    root = int((home / "actors" / "root.pid").read_text().split()[0])
    pids = set(_group_of(root)) | {os.getpid()}
    for info in home.glob("sessions/*/runtime/server.json"):
        pids.add(json.loads(info.read_text())["pid"])
    return sorted(pid for pid in pids if pid_alive(pid))  # not the admin's reaped first fork


def _listeners(pids: list[int]) -> dict[int, list[tuple[str, int]]]:
    listening = listening_sockets()
    return {pid: [listening[i] for i in socket_inodes(pid) if i in listening] for pid in pids}


def _send_frame(port: int, frame: bytes, wait: bool = True) -> bytes:
    """Send one frame; return what the listener answered before closing (or b"")."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the listener dropped us mid-frame (a refused size): what we want
            return b""
        answer = b""
        if not wait:
            return answer
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return answer


def _framed(payload: bytes) -> bytes:
    return b"%d>" % len(payload) + payload


def test_every_listener_is_loopback_and_drops_forged_frames(scripted, tmp_path):
    _, llm = scripted([{"tool": "run", "args": {"command": GATE}},
                       {"tool": "finish", "args": {"message": "done"}}])
    home, workspace, planted = tmp_path / "home", tmp_path / "ws", tmp_path / "planted"
    planted.mkdir()
    with Trouper(home=home) as t:
        session = t.start_session("wait for the gate", llm=llm, workspace=workspace)
        wait_until(lambda: (workspace / "waiting").exists(), 30, "the gated command to run")
        pids = _trouper_processes(home)
        listeners = _listeners(pids)
        ports = [port for addresses in listeners.values() for _ip, port in addresses]
        assert len(ports) >= 6, listeners  # admin, root, broker, supervisor, controller, ...
        beyond = {pid: a for pid, a in listeners.items()
                  if any(ip not in ("0100007F", "00000000000000000000000001000000")
                         for ip, _port in a)}
        assert beyond == {}, f"listening beyond loopback: {beyond}"

        own = {port for _ip, port in listeners[os.getpid()]}  # answers only inside an ask
        for port in sorted(set(ports)):
            evil = pickle.dumps((("attacker",), _Plant(planted / f"plain-{port}")))
            forged_mac = os.urandom(MAC_BYTES) + pickle.dumps(_Plant(planted / f"mac-{port}"))
            for frame in (_framed(evil), _framed(forged_mac),
                          b"99999999999>" + b"x" * 64):  # the last asks for a 100 GB buffer
                _send_frame(port, frame, wait=port not in own)

        assert sorted(p.name for p in planted.iterdir()) == []
        assert [pid for pid in pids if not pid_alive(pid)] == []
        (workspace / "go").touch()
        assert session.wait(timeout=60) == AgentState.FINISHED
        assert check_log(list(session.events())) == []
    assert sorted(p.name for p in planted.iterdir()) == []  # the program's own port too
    log = (home / "logs" / "trouper.log").read_text()
    assert "without a valid MAC" in log


def test_actor_processes_let_go_of_the_programs_descriptors(scripted, tmp_path):
    """A listening socket the program closes is not kept bound by trouper's processes."""
    _, llm = scripted([{"tool": "run", "args": {"command": GATE}},
                       {"tool": "finish", "args": {"message": "done"}}])
    home, workspace = tmp_path / "home", tmp_path / "ws"
    program_socket = socket.socket()
    program_socket.bind(("127.0.0.1", 0))
    program_socket.listen()
    port = program_socket.getsockname()[1]
    inode = str(os.fstat(program_socket.fileno()).st_ino)
    with Trouper(home=home) as t:
        session = t.start_session("wait", llm=llm, workspace=workspace)
        wait_until(lambda: (workspace / "waiting").exists(), 30, "the gated command to run")
        holders = [pid for pid in _trouper_processes(home)
                   if pid != os.getpid() and inode in socket_inodes(pid)]
        assert holders == []
        program_socket.close()
        again = socket.socket()  # no SO_REUSEADDR: a listener left anywhere would refuse it
        again.bind(("127.0.0.1", port))
        again.close()
        (workspace / "go").touch()
        assert session.wait(timeout=60) == AgentState.FINISHED


def test_codec_round_trip_and_refusals():
    codec = AuthenticatedCodec(os.urandom(32))
    frame = codec.dumps({"kind": "hello", "n": 1})
    assert codec.loads(frame) == {"kind": "hello", "n": 1}
    assert codec.loads(pickle.dumps("ACK")) == "ACK"
    other = AuthenticatedCodec(os.urandom(32))
    for forged in (other.dumps({"n": 1}), frame[:-1] + b"\0", b"short",
                   pickle.dumps(_Plant(Path("/nonexistent/never")))):
        with pytest.raises(ForgedFrame):
            codec.loads(forged)
    assert codec.rejected == 4
    with pytest.raises(ValueError):
        AuthenticatedCodec(b"too short")


def test_a_missing_seam_fails_loudly(monkeypatch):
    from trouper.actors import transport

    check_seams()  # the pinned Thespian has every seam
    monkeypatch.setattr(transport.metadata, "version", lambda name: "9.9.9")
    with pytest.raises(TransportSeamMissing, match="thespian 9.9.9"):
        check_seams()


def test_the_program_itself_is_sealed_once_a_trouper_opened(trouper):
    assert sealed() is not None


def test_a_shared_key_file_must_be_private_and_long(tmp_path):
    from trouper.exceptions import TrouperError
    from trouper.security.transport_key import read_key_file

    key = tmp_path / "transport.key"
    key.write_bytes(os.urandom(48).hex().encode())
    key.chmod(0o644)
    with pytest.raises(TrouperError, match="readable by others"):
        read_key_file(key)
    key.chmod(0o600)
    assert len(read_key_file(key)) == 96
    key.write_bytes(b"short")
    with pytest.raises(TrouperError, match="needs 32"):
        read_key_file(key)


def test_a_program_sealed_with_one_key_refuses_another(tmp_path):
    """One codec per program: a second Trouper cannot switch keys under the first."""
    from trouper.actors.transport import seal
    from trouper.exceptions import TrouperError

    seal()  # what every Trouper in this process uses
    key = tmp_path / "transport.key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    with pytest.raises(TrouperError, match="cannot switch"):
        seal(key)


def test_a_system_runs_on_an_operators_key_file(scripted, tmp_path):
    import sys

    from accel import forkserver

    _, llm = scripted([{"tool": "finish", "args": {"message": "done"}}])
    key = tmp_path / "transport.key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o600)
    program = f"""
from trouper import Trouper

with Trouper(home={str(tmp_path / "home")!r}) as t:
    s = t.start_session("t", llm={llm!r}, workspace={str(tmp_path / "ws")!r})
    print(s.wait(timeout=60).value)
"""
    env = {**os.environ, "TROUPER_TRANSPORT_KEY_FILE": str(key)}
    done = forkserver.run([sys.executable, "-c", program], env=env, capture_output=True,
                          timeout=120)
    assert done.stdout.decode().strip() == "finished", done.stderr.decode()[-2000:]
