"""What each actor process holds and says: instruments a trouper from the bench's process.

``install(out_dir)`` is called in the program before it opens a ``Trouper``; every actor
process is forked from it (admin, root, broker, and below), so it inherits what this
module patches:

- at each fork (``os.register_at_fork``), a snapshot: how many modules ``sys.modules``
  held, the collector's frozen objects, pymalloc's allocated blocks, minor page faults,
  ``smaps_rollup``'s private kB;
- the same when the trouper actor object is made (``TrouperActor.__init__``, after
  Thespian's child start), where it also takes ``SIGUSR2`` (Thespian sets a handler for
  every signal before that);
- on ``SIGUSR2``, a report written to ``<out_dir>/<pid>.json``: the snapshots and one
  taken now, the modules imported since the fork (``sys.modules`` keeps insertion order),
  the objects the collector tracks that were made since the actor froze its heap
  (``gc.get_objects`` leaves frozen ones out) by type, threads, pymalloc's arena figures
  (``sys._debugmallocstats``), private and shared kB by kind of mapping
  (``/proc/self/smaps``), and, with ``count_hops``, every message this process sent and
  received by peer port and type, with the CPU its pickling and MAC took.

Its own cost is small (a few microseconds a message, a few kB a process) but nonzero:
use it for anatomy and counts, not for the bench's figures.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

_state: dict[str, Any] = {"out": None, "fork": None, "init": None, "hops": None, "port": None,
                         "reports": 0, "profile_start": False, "profiler": None,
                         "start_profile": None, "mappings_at": {}, "forks": [0, 0.0, 0.0]}


def _private_kb() -> int:
    total = 0
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    except OSError:
        pass
    return total


def _snapshot() -> dict[str, Any]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"t": time.monotonic(), "cpu_s": time.process_time(), "modules": len(sys.modules),
            "frozen": gc.get_freeze_count(), "blocks": sys.getallocatedblocks(),
            "minflt": usage.ru_minflt, "private_kb": _private_kb()}


def _forked() -> None:
    _state["fork"] = _snapshot()
    _state["init"], _state["port"], _state["reports"] = None, None, 0
    _state["start_profile"], _state["mappings_at"] = None, {}
    _state["forks"] = [0, 0.0, 0.0]
    if _state["profile_start"]:  # from here to the actor object: Thespian's child start
        _state["mappings_at"]["fork"] = mapping_kinds()
        import cProfile

        profiler = cProfile.Profile(time.process_time)
        _state["profiler"] = profiler
        profiler.enable()
    if _state["hops"] is not None:
        _state["hops"] = _new_hops()


def _new_hops() -> dict[str, Any]:
    return {"sent": defaultdict(lambda: [0, 0, 0.0, 0.0]),
            "received": defaultdict(lambda: [0, 0, 0.0, 0.0])}


def _port(address: Any) -> int | None:
    details = getattr(address, "addressDetails", None)
    sockname = getattr(details, "sockname", None)
    return sockname[1] if isinstance(sockname, tuple) and len(sockname) > 1 else None


def _patch_actor() -> None:
    from trouper.actors.base import TrouperActor

    original = TrouperActor.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        profiler = _state.get("profiler")
        if profiler is not None:
            profiler.disable()
            _state["profiler"], _state["start_profile"] = None, _top(profiler)
            _state["mappings_at"]["init"] = mapping_kinds()
        _state["init"] = _snapshot()
        signal.signal(signal.SIGUSR2, _report_signal)

    TrouperActor.__init__ = init  # type: ignore[method-assign]


def _patch_transport() -> None:
    """Count every frame: sent (pickle + MAC, by the peer's port and the message's type)
    and received (MAC check + unpickle, by the sender's port)."""
    from thespian.system.transport import TCPTransport

    from trouper.actors.transport import MAC_BYTES, AuthenticatedCodec, seal
    from trouper.security.transport_key import TRANSPORT_KEY_FILE_ENV

    # sealed first, as the Trouper would (it checks Thespian's own source before it patches;
    # its own call later finds the transport sealed with the same key and keeps it)
    seal(os.environ.get(TRANSPORT_KEY_FILE_ENV) or None)

    transport_cls = TCPTransport.TCPTransport
    make_buffer = transport_cls.serializer

    def serializer(self: Any, intent: Any) -> Any:
        began = time.thread_time()
        out = make_buffer(self, intent)
        spent = time.thread_time() - began
        hops = _state["hops"]
        if hops is not None:
            _state["port"] = _port(self.myAddress)
            row = hops["sent"][(_port(intent.targetAddr), type(intent.message).__name__)]
            row[0] += 1
            row[1] += len(out)
            row[2] += spent
            codec = TCPTransport.serializer
            if isinstance(codec, AuthenticatedCodec):  # the MAC alone, once more
                payload = out[out.index(b">") + 1 + MAC_BYTES:]
                mac_began = time.thread_time()
                codec.mac(payload)
                row[3] += time.thread_time() - mac_began
                _sample(type(intent.message).__name__, payload)
        return out

    transport_cls.serializer = serializer  # type: ignore[method-assign]
    loads = AuthenticatedCodec.loads

    def counted_loads(self: Any, frame: bytes) -> Any:
        began = time.thread_time()
        obj = loads(self, frame)
        spent = time.thread_time() - began
        hops = _state["hops"]
        if hops is None:
            return obj
        if isinstance(obj, tuple) and len(obj) == 2:
            sender, msg = obj
            row = hops["received"][(_port(sender), type(msg).__name__)]
        else:  # Thespian's acknowledgement of a frame this process sent
            row = hops["received"][(None, "ack")]
        row[0] += 1
        row[1] += len(frame)
        row[2] += spent
        if row is not hops["received"][(None, "ack")]:
            mac_began = time.thread_time()  # the MAC alone, once more, to split the cost
            self.mac(frame[MAC_BYTES:])
            row[3] += time.thread_time() - mac_began
        return obj

    AuthenticatedCodec.loads = counted_loads  # type: ignore[method-assign]


def _sample(kind: str, payload: bytes) -> None:
    """Keep the first frame of each message type (its pickle, as sent) for ``codec``."""
    path = Path(_state["out"]) / f"sample-{kind}.pickle"
    if kind not in _sampled and not path.exists():
        _sampled.add(kind)
        try:
            path.write_bytes(payload)
        except OSError:
            pass


_sampled: set[str] = set()


def _top(profiler: Any, lines: int = 30) -> list[list[Any]]:
    """The functions with the most CPU of their own: [ms own, ms inclusive, calls, name]."""
    import pstats

    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [[round(tt * 1000, 3), round(ct * 1000, 3), nc, f"{fn}:{line}({name})"]
            for (fn, line, name), (_cc, nc, tt, ct, _callers) in stats.items()]
    return sorted(rows, key=lambda r: -r[0])[:lines]


def install(out_dir: Path, count_hops: bool = True, profile_start: bool = False) -> None:
    """Instrument every process this one forks from now on (see the module doc);
    ``profile_start``: also cProfile (CPU clock) each one from its fork to its actor
    object, and read its mappings at both ends."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _state["out"] = str(out_dir)
    _state["profile_start"] = profile_start
    if count_hops:
        _state["hops"] = _new_hops()
        _patch_transport()
    _patch_actor()
    _patch_fork()
    os.register_at_fork(after_in_child=_forked)


def _patch_fork() -> None:
    """Time each ``os.fork`` in the parent (CPU of its thread, and wall): what forking an
    actor costs the process that forks it, apart from the copy-on-write that follows."""
    fork = os.fork

    def timed_fork() -> int:
        cpu, wall = time.thread_time(), time.perf_counter()
        pid = fork()
        if pid:
            row = _state["forks"]
            row[0] += 1
            row[1] += time.thread_time() - cpu
            row[2] += time.perf_counter() - wall
        return pid

    os.fork = timed_fork


def _report_signal(signum: int, frame: Any) -> None:
    try:
        report = build_report()
        _state["reports"] += 1  # <pid>-1.json, <pid>-2.json...: one per signal
        path = Path(_state["out"]) / f"{os.getpid()}-{_state['reports']}.json"
        path.write_text(json.dumps(report, default=str))
    except Exception as exc:  # noqa: BLE001 - a probe must never take the actor down
        Path(_state["out"], f"{os.getpid()}.error").write_text(repr(exc))


def build_report() -> dict[str, Any]:
    fork = _state["fork"] or {"modules": 0}
    now = _snapshot()
    names = list(sys.modules)
    objects = gc.get_objects()  # only what was made since the actor froze its heap
    by_type: Counter[str] = Counter()
    size_by_type: Counter[str] = Counter()
    for obj in objects:
        name = f"{type(obj).__module__}.{type(obj).__qualname__}"
        by_type[name] += 1
        try:
            size_by_type[name] += sys.getsizeof(obj)
        except TypeError:
            pass
    del objects
    hops = _state["hops"] or {"sent": {}, "received": {}}
    return {
        "pid": os.getpid(),
        "comm": Path("/proc/self/comm").read_text().strip(),
        "port": _state["port"],
        "fork": _state["fork"], "init": _state["init"], "now": now,
        "imported_since_fork": names[fork["modules"]:],
        "new_objects": by_type.most_common(40),
        "new_object_bytes": size_by_type.most_common(25),
        "new_objects_total": sum(by_type.values()),
        "threads": [t.name for t in threading.enumerate()],
        "start_profile": _state["start_profile"],
        "forks": _state["forks"],
        "mappings_at": _state["mappings_at"],
        "pymalloc": pymalloc_stats(),
        "mappings": mapping_kinds(),
        "sent": [[port, kind, *row] for (port, kind), row in hops["sent"].items()],
        "received": [[port, kind, *row] for (port, kind), row in hops["received"].items()],
    }


def pymalloc_stats() -> dict[str, int]:
    """pymalloc's totals from ``sys._debugmallocstats`` (it writes to fd 2)."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(sink.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        text = sink.read().decode(errors="replace")
    wanted = ("# arenas allocated total", "# arenas reclaimed", "# arenas highwater mark",
              "# arenas allocated current", "bytes in allocated blocks",
              "bytes in available blocks", "unused pools", "bytes lost to pool headers",
              "bytes lost to quantization", "bytes lost to arena alignment")
    out = {}
    for line in text.splitlines():
        key, _, value = line.rpartition("=")
        key = key.strip()
        for name in wanted:
            if key.endswith(name):
                try:
                    out[name.lstrip("# ")] = int(value.strip().replace(",", ""))
                except ValueError:
                    pass
    return out


def mapping_kinds(pid: int | str = "self") -> dict[str, dict[str, int]]:
    """Private and shared kB by kind of mapping: ``[heap]`` (malloc's brk heap), ``anon``
    (pymalloc's arenas, mmap'd mallocs, thread stacks: anonymous mappings), ``stack``, a
    ``.so`` file (its relocated data), another file, and the rest."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"private": 0, "shared": 0, "rss": 0,
                                                          "mappings": 0})
    kind = "other"
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        first = line.split(None, 1)[0]
        if "-" in first and not first.endswith(":"):  # a mapping's header line
            parts = line.split()
            path = parts[5] if len(parts) > 5 else ""
            start, end = (int(x, 16) for x in first.split("-"))
            size_kb = (end - start) // 1024
            if path == "[heap]":
                kind = "heap"
            elif path.startswith("[stack"):
                kind = "stack"
            elif path.startswith("["):
                kind = "other"
            elif not path:
                kind = "anon 8 MB+ (thread stacks)" if size_kb >= 8192 else "anon"
            elif ".so" in path:
                kind = "shared libraries"
            else:
                kind = "other files"
            out[kind]["mappings"] += 1
            continue
        field, _, value = line.partition(":")
        if field in ("Private_Clean", "Private_Dirty"):
            out[kind]["private"] += int(value.split()[0])
        elif field in ("Shared_Clean", "Shared_Dirty"):
            out[kind]["shared"] += int(value.split()[0])
        elif field == "Rss":
            out[kind]["rss"] += int(value.split()[0])
    return dict(out)
