"""Checkpoints of a workspace: a snapshot after an action, kept outside the workspace.

A content-addressed store in the sandbox's state folder (never the workspace, and never a
git repository the user has there, which is read like any folder and never written):

- ``objects/ab/cdef...``: each file's content once, zlib-compressed, named by the SHA-256
  of the content (deduplicated across snapshots and files);
- ``snapshots/<name>.json``: a manifest, ``{files: {path: [sha, mode, size]}, links:
  {path: target}, dirs: {path: mode}, skipped: {path: why}}``; or ``{same_as: <name>}``
  when nothing changed since the snapshot before it.

Taking one walks the workspace without following a link and rehashes only files whose
size, mtime, ctime or inode changed since the last walk of this process. What is not
kept is said, per path, in ``skipped``: an ignored name (``IGNORED``: caches and
dependency folders a build makes again), a file over ``max_file_bytes``, anything but a
regular file, a link or a folder (a FIFO is never opened), a file it cannot read, and
everything past ``max_files``. Restoring writes a snapshot into an empty folder.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import threading
import time
import zlib
from typing import Any

from .util import private_dir, read_json, safe_name, write_json_atomic

IGNORED = (".trouper", "node_modules", ".venv", "__pycache__", ".pytest_cache",
           ".mypy_cache", ".ruff_cache", ".tox")
"""Names (of a file or folder, at any depth) left out of every snapshot."""
MAX_FILE_BYTES = 20 * 1024 * 1024
MAX_FILES = 100_000
CHUNK = 1024 * 1024
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Checkpoints:
    """The checkpoint store of one sandbox (its ``root``) for its workspace."""

    def __init__(self, root: str, workspace: str, max_file_bytes: int = MAX_FILE_BYTES,
                 max_files: int = MAX_FILES, ignored: tuple[str, ...] = IGNORED) -> None:
        self.root = root
        self.workspace = workspace
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files
        self.ignored = frozenset(ignored)
        self._seen: dict[str, tuple[tuple[int, int, int, int], str]] = {}
        """path -> (size, mtime_ns, ctime_ns, inode) and the sha it had: no rehash."""
        self._last: tuple[str, dict[str, Any]] | None = None
        """The name and tree of the last snapshot taken here."""
        self._lock = threading.Lock()
        self._made: set[str] = set()

    # ---- taking ----

    def take(self, name: str, max_file_bytes: int | None = None, max_files: int | None = None,
             ignored: tuple[str, ...] | None = None) -> dict[str, Any]:
        """Snapshot the workspace as ``name`` (within the limits given, else the store's);
        what it holds, in numbers."""
        with self._lock:
            if max_file_bytes is not None:
                self.max_file_bytes = max_file_bytes
            if max_files is not None:
                self.max_files = max_files
            if ignored is not None:
                self.ignored = frozenset(ignored)
            began = time.monotonic()
            self._folder(os.path.join(self.root, "snapshots"))
            tree, new_bytes = self._walk()
            manifest: dict[str, Any] = dict(tree)
            if self._last is not None and self._last[1] == tree:
                manifest = {"same_as": self._base(self._last[0])}
            write_json_atomic(self._manifest_path(name), manifest, durable=False)
            self._last = (name, tree)
            return {"name": name, "files": len(tree["files"]),
                    "bytes": sum(entry[2] for entry in tree["files"].values()),
                    "new_bytes": new_bytes, "skipped": len(tree["skipped"]),
                    "took_s": round(time.monotonic() - began, 6)}

    def _base(self, name: str) -> str:
        """The snapshot ``name`` stands for (itself, or the one it is the same as)."""
        data = read_json(self._manifest_path(name)) or {}
        return str(data.get("same_as") or name)

    def _walk(self) -> tuple[dict[str, Any], int]:
        files: dict[str, Any] = {}
        links: dict[str, str] = {}
        dirs: dict[str, int] = {}
        skipped: dict[str, str] = {}
        new_bytes = 0
        pending = [""]
        while pending:
            folder = pending.pop()
            try:
                entries = sorted(os.scandir(os.path.join(self.workspace, folder) or "."),
                                 key=lambda e: e.name)
            except OSError as e:
                skipped[folder or "."] = f"unreadable folder ({e.strerror})"
                continue
            for entry in entries:
                path = f"{folder}/{entry.name}" if folder else entry.name
                if entry.name in self.ignored:
                    skipped[path] = "ignored"
                    continue
                if len(files) + len(links) >= self.max_files:
                    skipped[path] = f"past max_files ({self.max_files})"
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError as e:
                    skipped[path] = f"cannot stat ({e.strerror})"
                    continue
                if stat.S_ISDIR(info.st_mode):
                    dirs[path] = stat.S_IMODE(info.st_mode)
                    pending.append(path)
                elif stat.S_ISLNK(info.st_mode):
                    links[path] = os.readlink(entry.path)
                elif not stat.S_ISREG(info.st_mode):
                    skipped[path] = "not a regular file"
                elif info.st_size > self.max_file_bytes:
                    skipped[path] = f"over max_file_bytes ({info.st_size} bytes)"
                else:
                    kept = self._kept(entry.path, path, info)
                    if isinstance(kept, str):
                        skipped[path] = kept
                    else:
                        files[path], added = kept
                        new_bytes += added
        return {"files": files, "links": links, "dirs": dirs, "skipped": skipped}, new_bytes

    def _kept(self, real: str, path: str, info: os.stat_result) -> Any:
        """``([sha, mode, size], bytes stored anew)``, or why the file is not kept."""
        key = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
        known = self._seen.get(path)
        mode = stat.S_IMODE(info.st_mode)
        if known is not None and known[0] == key:  # stored by this process: never removed
            return [known[1], mode, info.st_size], 0
        try:
            sha, added = self._store(real)
        except OSError as e:
            return f"unreadable ({e.strerror})"
        self._seen[path] = (key, sha)
        return [sha, mode, info.st_size], added

    def _store(self, real: str) -> tuple[str, int]:
        """Hash the file and store its content once; the sha and the bytes added."""
        fd = os.open(real, _READ_FLAGS)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            digest, chunks = hashlib.sha256(), []
            while True:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                digest.update(chunk)
                chunks.append(chunk)
        finally:
            os.close(fd)
        sha = digest.hexdigest()
        target = self._object(sha)
        if os.path.exists(target):
            return sha, 0
        self._folder(os.path.dirname(target))
        packer = zlib.compressobj(1)
        data = b"".join(packer.compress(chunk) for chunk in chunks) + packer.flush()
        tmp = f"{target}.tmp.{os.getpid()}.{threading.get_ident()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)  # owner-only whatever the umask (the content may be private)
        try:
            with os.fdopen(fd, "wb") as out:
                os.fchmod(out.fileno(), 0o600)
                out.write(data)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return sha, len(data)

    def _folder(self, path: str) -> None:
        """Make a folder of the store (and the folders above it, up to its root)
        owner-only, once per process."""
        if path not in self._made:
            if path != self.root:
                self._folder(os.path.dirname(path))
            private_dir(path)
            self._made.add(path)

    # ---- reading ----

    def manifest(self, name: str) -> dict[str, Any] | None:
        """The tree of snapshot ``name`` (following ``same_as``), or None."""
        data = read_json(self._manifest_path(name))
        for _ in range(2):
            if data is None or "same_as" not in data:
                return data
            data = read_json(self._manifest_path(str(data["same_as"])))
        return data

    def restore(self, name: str, target: str) -> dict[str, str]:
        """Write snapshot ``name`` into ``target`` (created; must be empty). What the
        snapshot did not keep, per path. Raises KeyError for an unknown snapshot."""
        tree = self.manifest(name)
        if tree is None:
            raise KeyError(name)
        os.makedirs(target, exist_ok=True)
        if os.listdir(target):
            raise OSError(errno.ENOTEMPTY, f"{target} is not empty")
        for path in sorted(tree["dirs"]):
            os.mkdir(os.path.join(target, path), 0o700)
        for path, (sha, mode, _size) in tree["files"].items():
            self._write(os.path.join(target, path), sha, mode)
        for path, link in tree["links"].items():
            os.symlink(link, os.path.join(target, path))
        for path in sorted(tree["dirs"], reverse=True):  # modes last: a 0500 folder
            os.chmod(os.path.join(target, path), tree["dirs"][path] & 0o1777)
        return dict(tree["skipped"])

    def _write(self, path: str, sha: str, mode: int) -> None:
        unpacker = zlib.decompressobj()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with os.fdopen(fd, "wb") as out, open(self._object(sha), "rb") as source:
            while True:
                chunk = source.read(CHUNK)
                if not chunk:
                    break
                out.write(unpacker.decompress(chunk))
            out.write(unpacker.flush())
            os.fchmod(out.fileno(), mode & 0o777)  # never a set-id bit, whoever restores

    def _object(self, sha: str) -> str:
        return os.path.join(self.root, "objects", sha[:2], sha[2:])

    def _manifest_path(self, name: str) -> str:
        return os.path.join(self.root, "snapshots", safe_name(name) + ".json")
