"""The actor transport sealed: loopback only, every frame authenticated, no inherited fds.

Out of the box, Thespian's ``multiprocTCPBase`` is an open door (see docs/promises.md, "Thespian,
the rules that bite"): every actor listens on ``0.0.0.0`` and unpickles whatever arrives,
so one framed pickle from anyone who can reach a port runs code as the user. ``seal``
closes it at three seams of Thespian 4.0.1, checked at start (``TransportSeamMissing`` if
one is gone, so a Thespian upgrade fails loudly instead of silently reopening the door):

- ``TCPTransport.serializer`` (the module attribute both the sender and ``ReceiveBuffer``
  use) becomes ``AuthenticatedCodec``: a frame is ``HMAC-SHA256(key, payload) + payload``
  and its MAC is checked, in constant time, *before* ``pickle.loads`` sees a byte. A frame
  that fails is dropped (Thespian closes that connection; the actor carries on) and
  counted in the log.
- ``TCPTransport.ReceiveBuffer`` refuses a frame that declares more than
  ``MAX_FRAME_BYTES``, so nobody can make an actor buffer gigabytes before the MAC check.
- ``IPActorAddress.bindArgs`` binds the address the actor advertises (``127.0.0.1`` in
  local mode, via ``THESPIAN_BASE_IPADDR``), where Thespian binds ``('', port)``.

The key is 32 random bytes made in the process that opens the first actor system and
handed down by fork: it is never in argv, in the environment, or on disk. For actor
systems spread over hosts (to come), an operator gives every member the same key file
(``key_file``: owner-only, 32+ bytes); ``seal`` reads it instead of making a key.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import os
import pickle
import secrets
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from thespian.system.transport import IPBase, TCPTransport, streamBuffer

from ..exceptions import TrouperError
from ..security.transport_key import KEY_BYTES, read_key_file
from . import transport_loop

THESPIAN_VERSION = "4.0.1"
"""The Thespian release whose seams this module was written against (pinned in pyproject)."""
MAC_BYTES = hashlib.sha256().digest_size
MAX_FRAME_BYTES = 512 * 1024 * 1024
"""Largest frame an actor accepts; a prompt history of several MB fits many times over."""
LOOPBACK = "127.0.0.1"
LISTEN_DEPTH = 4096
"""Each actor's accept queue (Thespian's is 100; the kernel caps it at ``somaxconn``).
Every session process connects to the root and to the broker: at 100 sessions the root's
queue of 100 overflowed 14-21 times a run, each a dropped SYN its sender sends again
after a second."""
REJECT_LOG_PERIOD_S = 10.0
"""A flood of forged frames is logged once per this period, with the count."""


class TransportSeamMissing(TrouperError):
    """The installed Thespian lacks a seam trouper relies on to seal the transport."""


class ForgedFrame(ValueError):
    """A frame whose MAC does not match: not from trouper's own processes."""


class AuthenticatedCodec:
    """``dumps``/``loads`` for Thespian's TCP transport: pickle behind an HMAC-SHA256.

    ``loads`` unpickles nothing that does not carry a valid MAC, except Thespian's two
    constant acknowledgement frames, which are recognised by comparing bytes.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) < KEY_BYTES:
            raise ValueError(f"a transport key needs {KEY_BYTES} bytes or more")
        self._key = key
        self._acks = {pickle.dumps(ack): ack for ack in (streamBuffer.ackPacket,
                                                          streamBuffer.ackDataErrPacket)}
        self.rejected = 0
        """Frames dropped by this process since it started."""
        self._lock = threading.Lock()
        self._last_logged = 0.0
        self._unlogged = 0

    def mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()

    def dumps(self, obj: Any) -> bytes:
        payload = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        return self.mac(payload) + payload

    def loads(self, frame: bytes) -> Any:
        ack = self._acks.get(frame)
        if ack is not None:
            return ack
        payload = frame[MAC_BYTES:]
        if len(frame) < MAC_BYTES or not hmac.compare_digest(frame[:MAC_BYTES],
                                                             self.mac(payload)):
            self._reject(len(frame))
            raise ForgedFrame("dropped a frame without a valid MAC")
        return pickle.loads(payload)  # noqa: S301 - authenticated above

    def _reject(self, size: int) -> None:
        with self._lock:
            self.rejected += 1
            self._unlogged += 1
            now = time.monotonic()
            if now - self._last_logged < REJECT_LOG_PERIOD_S:
                return
            count, self._unlogged, self._last_logged = self._unlogged, 0, now
        # looked up now: in Thespian's admin, the module's logger predates its log forwarder
        logging.getLogger(__name__).warning(
            "actor transport (pid %d): dropped %d frame(s) without a valid MAC (last %d bytes; "
            "%d in all): someone who is not trouper is writing to an actor's port",
            os.getpid(), count, size, self.rejected)


class CappedReceiveBuffer(streamBuffer.ReceiveBuffer):
    """Thespian's frame reader, refusing frames larger than ``MAX_FRAME_BYTES``."""

    def addMore(self, buf: bytes) -> None:  # noqa: N802 - Thespian's name
        super().addMore(buf)
        size = getattr(self, "_size", None)
        if size is not None and size > MAX_FRAME_BYTES:
            raise ForgedFrame(f"a frame of {size} bytes is over the {MAX_FRAME_BYTES} limit")


def _bind_advertised(self: Any) -> tuple[Any, ...]:
    """``IPActorAddress.bindArgs``: listen on the address others are told, not on all."""
    return (self.sockname,)


_state: dict[str, Any] = {"codec": None, "key_file": None, "originals": {}}


def seal(key_file: str | os.PathLike[str] | None = None) -> AuthenticatedCodec:
    """Seal Thespian's TCP transport in this process and the processes it forks.

    Call before the actor system starts. Idempotent: the first call makes (or reads) the
    key; a later call must name the same ``key_file`` (or none). Raises
    ``TransportSeamMissing`` when the installed Thespian lacks a seam.
    """
    codec = _state["codec"]
    wanted = str(key_file) if key_file is not None else None
    if codec is not None:
        if wanted != _state["key_file"]:
            raise TrouperError(
                f"this process already sealed its actor transport with "
                f"{_state['key_file'] or 'a key of its own'}; it cannot switch to {wanted}")
        return codec
    check_seams()
    key = read_key_file(Path(wanted)) if wanted else secrets.token_bytes(KEY_BYTES)
    codec = AuthenticatedCodec(key)
    os.environ["THESPIAN_BASE_IPADDR"] = LOOPBACK
    TCPTransport.serializer = codec
    TCPTransport.ReceiveBuffer = CappedReceiveBuffer
    TCPTransport.LISTEN_DEPTH = max(TCPTransport.LISTEN_DEPTH, LISTEN_DEPTH)
    if not transport_loop.install():  # a speed-up only: the old loop works, slower
        logging.getLogger(__name__).info("Thespian's loop changed: its selector is kept")
    IPBase.IPActorAddress.bindArgs = property(_bind_advertised)
    _state["codec"], _state["key_file"] = codec, wanted
    return codec


def sealed() -> AuthenticatedCodec | None:
    """The codec in force in this process, or None when the transport is not sealed."""
    codec = TCPTransport.serializer
    return codec if isinstance(codec, AuthenticatedCodec) else None


def check_seams() -> None:
    """Fail loudly when the installed Thespian no longer has the seams ``seal`` uses."""
    problems = []
    try:
        version = metadata.version("thespian")
    except metadata.PackageNotFoundError:
        version = "unknown"
    if version != THESPIAN_VERSION:
        problems.append(f"thespian {version} is installed; the seams were checked on "
                        f"{THESPIAN_VERSION}")
    uses = {
        "TCPTransport.serializer": hasattr(TCPTransport, "serializer"),
        "TCPTransport sends with serializer.dumps":
            "serializer.dumps" in inspect.getsource(TCPTransport.TCPTransport.serializer),
        "TCPIncoming reads with ReceiveBuffer(serializer.loads)":
            "ReceiveBuffer(serializer.loads)"
            in inspect.getsource(TCPTransport.TCPIncoming_Common.__init__),
        "IPActorAddress.bindArgs is a property":
            isinstance(inspect.getattr_static(IPBase.IPActorAddress, "bindArgs", None),
                       property),
    }
    problems += [f"missing seam: {name}" for name, present in uses.items() if not present]
    if problems:
        raise TransportSeamMissing(
            "cannot seal the actor transport (I7): " + "; ".join(problems)
            + ". Install the pinned Thespian (see pyproject.toml).")
