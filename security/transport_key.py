"""The actor transport's shared key file: where it is named, and how it is read.

Thespian-free, so the masker (which must hide the key's text wherever it turns up) can
use it without importing the actor layer. The transport itself is ``actors/transport.py``.
"""

from __future__ import annotations

import stat
from pathlib import Path

from ..exceptions import TrouperError

KEY_BYTES = 32
"""The shortest transport key: 256 bits."""
TRANSPORT_KEY_FILE_ENV = "TROUPER_TRANSPORT_KEY_FILE"
"""Names an operator's key file, shared by every member of a system spread over hosts."""


def read_key_file(path: Path) -> bytes:
    """A shared transport key: the file must be owner-only and hold 32 bytes or more."""
    try:
        info = path.stat()
        data = path.read_bytes().strip()
    except OSError as exc:
        raise TrouperError(f"cannot read the transport key file {path}: {exc}") from exc
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TrouperError(f"the transport key file {path} is readable by others "
                           f"(mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 it")
    if len(data) < KEY_BYTES:
        raise TrouperError(f"the transport key file {path} holds {len(data)} bytes; "
                           f"it needs {KEY_BYTES} or more")
    return data
