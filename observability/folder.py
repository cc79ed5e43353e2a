"""The folder the actor processes write their metrics to: ``<home>/metrics/``.

prometheus_client's multiprocess mode: each process writes its samples to files of its
own, ``counter_<pid>.db`` and ``histogram_<pid>.db`` (memory-mapped; a sample is a write
into a page, no system call), and the scraping program sums every file of the folder.
A process that died leaves its files: its counts must go on counting, so they are
merged (``compact``) into ``counter_archive.db`` and ``histogram_archive.db`` and its
own deleted. The folder thus holds the files of the live processes and two more:

- when scraped (``exposition.render``, under the folder's lock);
- when an actor system opens (its admin calls ``at_opening``): emptied, if no live
  process writes there (the usual case: the program starting is the home's only one),
  else compacted (another program on the home writes there: its counts stay);
- when an actor process starts and finds more than ``CROWDED`` files (a program that
  never serves its metrics, running for weeks), compacted.

A pid is taken for a live process while a process has it: a file whose pid was reused
by another process is merged once that one is gone too.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from ..home.paths import FILE_MODE, private_dir
from ..host.processes import pid_alive

logger = logging.getLogger(__name__)

FOLDER = "metrics"
LOCK = ".lock"
ARCHIVE = "archive"
"""The pid part of the merged files' names (``counter_archive.db``)."""
MERGED_TYPES = ("counter", "histogram", "summary")
"""Kinds of file whose dead processes' samples are kept (summed); a dead process's
gauge files are simply deleted (trouper writes none: its gauges are read at scrape time)."""
CROWDED = 512
"""Files past which a starting actor process compacts the folder."""
INITIAL_BYTES = 16 * 1024
"""A process's file to begin with (doubled as it fills; a Controller's stay within 64 KiB)."""


def folder_of(home: str | os.PathLike[str]) -> Path:
    """The metrics folder of the trouper home ``home``."""
    return Path(home) / FOLDER


def ensure(path: Path) -> Path:
    """The folder, created owner-only if missing."""
    return private_dir(path)


@contextlib.contextmanager
def locked(path: Path, wait: bool = True) -> Iterator[bool]:
    """Hold the folder's lock (between the programs of one home); yields False, without
    it, when ``wait`` is false and another holds it."""
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing lets go of the lock


@functools.cache
def allocated_dict_class() -> type:
    """prometheus_client's ``MmapedDict`` whose file's blocks are allocated before they are
    mapped. The library's file is sparse (``truncate``): on a full disk the first write
    into a page that has no block is a SIGBUS, which killed the Controller (its restarts
    too) instead of letting it wait in the store's fault (I6, docs/promises.md). Allocated
    first, a full disk is an ``OSError`` at the allocation, and recording stops in that
    process."""
    from prometheus_client.mmap_dict import MmapedDict

    class AllocatedMmapedDict(MmapedDict):
        def __init__(self, filename: str, read_mode: bool = False) -> None:
            if not read_mode:
                fd = os.open(filename, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
                try:
                    if os.fstat(fd).st_size < INITIAL_BYTES:
                        os.posix_fallocate(fd, 0, INITIAL_BYTES)
                finally:
                    os.close(fd)
            super().__init__(filename, read_mode)

        def _init_value(self, key: str) -> None:
            needed = self._used + len(key.encode()) + 32  # the entry: length, key, padding, value
            capacity = self._capacity
            while needed > capacity:
                capacity *= 2
            if capacity > self._capacity:  # the library grows it sparse: allocate it first
                os.posix_fallocate(self._f.fileno(), 0, capacity)
            super()._init_value(key)

    return AllocatedMmapedDict


def _pid_files(path: Path) -> list[tuple[Path, str, int]]:
    """``(file, kind, pid)`` of every process's file (the archives left out)."""
    found = []
    for entry in os.scandir(path):
        name = entry.name
        if not name.endswith(".db"):
            continue
        kind, _, rest = name[:-3].partition("_")
        pid_text = rest.rpartition("_")[2]  # gauge files: gauge_<mode>_<pid>.db
        if pid_text.isdigit():
            found.append((Path(entry.path), kind, int(pid_text)))
    return found


def compact(path: Path) -> int:
    """Merge the files of dead processes into the archives and delete them; returns how
    many files went. Call it holding ``locked(path)``."""
    own = os.getpid()
    dead = [(f, kind) for f, kind, pid in _pid_files(path) if pid != own and not pid_alive(pid)]
    if not dead:
        return 0
    for kind in {k for _, k in dead}:
        files = [f for f, k in dead if k == kind]
        if kind in MERGED_TYPES:  # a kind's files go as soon as its archive holds them:
            _merge_into_archive(path, kind, files)  # a failure later counts none twice
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
    return len(dead)


def _merge_into_archive(path: Path, kind: str, files: list[Path]) -> None:
    """The archive of ``kind`` rewritten with ``files`` added: summed by the library's own
    merge (histogram buckets left unaccumulated, as files hold them)."""
    from prometheus_client.mmap_dict import mmap_key
    from prometheus_client.multiprocess import MultiProcessCollector

    archive = path / f"{kind}_{ARCHIVE}.db"
    sources = [str(f) for f in files] + ([str(archive)] if archive.exists() else [])
    merged = MultiProcessCollector.merge(sources, accumulate=False)
    building = path / f".{kind}_{ARCHIVE}.building"  # never globbed: no .db
    building.unlink(missing_ok=True)
    out = allocated_dict_class()(str(building))  # owner-only, whatever the program's umask
    try:
        for metric in merged:
            for sample in metric.samples:
                key = mmap_key(metric.name, sample.name, list(sample.labels),
                               list(sample.labels.values()), metric.documentation)
                out.write_value(key, sample.value, 0.0)
    finally:
        out.close()
    os.replace(building, archive)


def at_opening(path: Path) -> None:
    """An actor system opens on the home: empty the folder if no live process writes
    there, else compact it."""
    ensure(path)
    with locked(path):
        files = _pid_files(path)
        own = os.getpid()
        if any(pid == own or pid_alive(pid) for _, _, pid in files):
            compact(path)
            return
        for f in [f for f, _, _ in files] + list(path.glob(f"*_{ARCHIVE}.db")):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()


def tidy_if_crowded(path: Path) -> None:
    """Compact the folder if it holds more than ``CROWDED`` files and nobody else is at
    it (a starting actor process: a scan of the folder, ~0.1 ms for hundreds of files)."""
    try:
        if sum(1 for _ in os.scandir(path)) <= CROWDED:
            return
        with locked(path, wait=False) as mine:
            if mine:
                logger.info("metrics folder %s: %d dead processes' files merged", path,
                            compact(path))
    except OSError as exc:
        logger.warning("metrics folder %s could not be tidied: %s", path, exc)
