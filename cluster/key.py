"""The cluster key: the one secret every daemon of a cluster holds, and nothing else.

A file of 32 random bytes (hex, 0600), ``<home>/cluster.key`` unless ``--cluster-key``
names another. From it each daemon derives, with HMAC-SHA256 under a fixed label each:

- the cluster's **token**: every daemon of the cluster answers the same bearer token, so
  a client that reconnects to another daemon keeps its token;
- the **sealing key**: what one daemon hands another through the store (a session's
  secrets, a call's body with an API key in it) is sealed with AES-256-GCM, its session
  id and purpose bound in as associated data, so the store holds no secret in clear and
  a sealed value cannot be moved to another session;
- the **check value** the store keeps (``cluster_facts``): a daemon whose key is not the
  cluster's is refused at start, before it reads or writes anything sealed.

The first daemon on a fresh store makes the key if its home has none; every other daemon
must be given a copy (docs/cluster.md says how).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..exceptions import ConfigError, StoreError
from ..home.paths import private_dir

KEY_FILE = "cluster.key"
KEY_ENV = "TROUPER_CLUSTER_KEY_FILE"
"""Names the key's file instead of ``<home>/cluster.key``."""
_NONCE = 12
_VERSION = b"\x01"


class ClusterKey:
    """The cluster's key and what is derived from it."""

    def __init__(self, raw: bytes, path: Path) -> None:
        if len(raw) != 32:
            raise ConfigError(f"{path}: a cluster key is 64 hex digits", field="cluster_key")
        self.path = path
        self._token = hmac.new(raw, b"trouper cluster token", hashlib.sha256).hexdigest()
        self._check = hmac.new(raw, b"trouper cluster check", hashlib.sha256).hexdigest()
        self._seal = AESGCM(hmac.new(raw, b"trouper cluster seal", hashlib.sha256).digest())

    @classmethod
    def load(cls, path: Path, *, create: bool) -> ClusterKey:
        """The key in ``path``; made (0600, never replacing one) when ``create`` and there is
        none. Raises ConfigError for a missing or malformed file, or one others may read."""
        try:
            return cls._read(path)
        except FileNotFoundError:
            if not create:
                raise ConfigError(
                    f"no cluster key at {path}: this store belongs to a cluster; copy the "
                    f"key file of one of its daemons here (chmod 600), or name it with "
                    f"--cluster-key FILE", field="cluster_key") from None
        private_dir(path.parent)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except FileExistsError:  # another process made it meanwhile: theirs stands
            return cls._read(path)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
        return cls._read(path)

    @classmethod
    def _read(cls, path: Path) -> ClusterKey:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as source:
            if os.fstat(source.fileno()).st_mode & 0o077:
                raise ConfigError(f"{path}: a cluster key must be readable by its owner only "
                                  f"(chmod 600 {path})", field="cluster_key")
            text = source.read().strip()
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = b""
        return cls(raw, path)

    @property
    def token(self) -> str:
        """The bearer token every daemon of the cluster answers."""
        return self._token

    @property
    def check_value(self) -> str:
        """What the store keeps to know the cluster's key (it reveals nothing of it)."""
        return self._check

    def seal(self, purpose: str, subject: str, value: Any) -> bytes:
        """``value`` (JSON-able) sealed for ``purpose`` and ``subject`` (a session id...)."""
        nonce = secrets.token_bytes(_NONCE)
        body = json.dumps(value, separators=(",", ":")).encode()
        return _VERSION + nonce + self._seal.encrypt(nonce, body, _bound(purpose, subject))

    def open(self, purpose: str, subject: str, sealed: bytes) -> Any:
        """What ``seal`` sealed for the same purpose and subject; StoreError otherwise."""
        sealed = bytes(sealed)
        if sealed[:1] != _VERSION or len(sealed) < 1 + _NONCE + 16:
            raise StoreError(f"a sealed {purpose} of {subject!r} is not one this trouper made")
        nonce, body = sealed[1:1 + _NONCE], sealed[1 + _NONCE:]
        try:
            return json.loads(self._seal.decrypt(nonce, body, _bound(purpose, subject)))
        except InvalidTag:
            raise StoreError(f"the sealed {purpose} of {subject!r} does not open with this "
                             "cluster's key (another cluster's, or altered)") from None


def _bound(purpose: str, subject: str) -> bytes:
    return f"trouper\0{purpose}\0{subject}".encode()


def key_path(home_root: Path, given: str | os.PathLike[str] | None = None) -> Path:
    """Where the key is: ``given``, else ``$TROUPER_CLUSTER_KEY_FILE``, else the home's."""
    chosen = given or os.environ.get(KEY_ENV, "").strip()
    return Path(chosen).expanduser().resolve() if chosen else home_root / KEY_FILE
