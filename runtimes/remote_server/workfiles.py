"""Files in and out of a session's workspace, and its actions' output by byte offset.

Uploads and downloads go through the sandbox package's confinement (``confine.locate``):
a path is relative to the workspace (or absolute inside it), ``..`` is resolved by name,
and a path that leaves the workspace or goes through a symlink is refused (``FileError``,
answered 400 PathRefused). An upload replaces the file atomically (a temporary file beside
it, then a rename), so it never writes through a link.
"""

from __future__ import annotations

import os
import stat

from ..sandbox import safefs
from ..sandbox.confine import FileError, locate

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY


def upload(workspace: str, path: str, data: bytes, umask: int) -> int:
    """Write ``data`` to ``path`` in ``workspace`` (folders made as needed); its size."""
    with locate(workspace, path, create_mode=0o777 & ~umask) as target:
        try:
            info = os.stat(target.name, dir_fd=target.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        except OSError as e:  # a name too long, a folder in the way...
            raise FileError(f"Cannot write {path}: {e.strerror or e}.") from e
        if info is not None:
            target.check_regular(info)
        mode = stat.S_IMODE(info.st_mode) if info is not None else 0o666 & ~umask
        try:
            safefs.replace_file(target.dir_fd, target.name, mode, lambda out: out.write(data))
        except OSError as e:
            raise FileError(f"Cannot write {path}: {e.strerror or e}.") from e
    return len(data)


def download(workspace: str, path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` in ``workspace`` (at most ``max_bytes``)."""
    with locate(workspace, path) as target:
        fd = target.open(_READ_FLAGS, "read")
        try:
            info = os.fstat(fd)
            target.check_regular(info)
            if info.st_size > max_bytes:
                raise FileError(f"{path} holds {info.st_size} bytes; at most {max_bytes} "
                                "are sent in one download")
            chunks, left = [], max_bytes + 1
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise FileError(f"{path} grew past {max_bytes} bytes while it was read")
    return data


def read_text_chunk(path: str, offset: int, limit: int) -> tuple[str, int]:
    """Text from byte ``offset`` of the file at ``path`` (written by the server: no
    confinement needed), at most ``limit`` bytes, cut before an incomplete UTF-8
    character; and the offset to ask for next. An absent file reads as empty."""
    try:
        with open(path, "rb") as src:
            if offset >= os.fstat(src.fileno()).st_size:
                return "", offset  # nothing there yet (a seek past 2**62 fails: not asked)
            src.seek(offset)
            data = src.read(limit)
    except FileNotFoundError:
        return "", offset
    cut = len(data)
    # at most 3 bytes of a character cut at the end: leave them for the next read
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the lead byte (or ASCII) of the last character
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 \
                else 4 if byte >> 3 == 0b11110 else 1
            if need > back:
                cut = len(data) - back
            break
    return data[:cut].decode("utf-8", "replace"), offset + cut
