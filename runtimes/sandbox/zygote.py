"""A sandbox-server zygote: a parent that imported the server once and forks each new one.

A server started afresh (``python -I -S``) pays ~55 ms of CPU importing its modules
(``http.server``, ``logging``, ``argparse``...) and holds ~9 MB more private memory than
a bare interpreter. Forked from this process, a server shares those pages and starts in
a few milliseconds; everything else about it is as if started: its own session, folder,
log, umask and environment (the request's, replacing this process's), the server's own
``main`` with the request's arguments.

No listener: the program that starts the zygote keeps one end of a ``SOCK_SEQPACKET``
socketpair (``channel``); its forked actors inherit it. A request is one message on it
carrying, as its only content, the requester's end of a fresh stream socketpair
(``SCM_RIGHTS``): the request (one JSON line: argv, env, cwd, log, umask) and the answer
(``{"pid": N}`` or ``{"error": ...}``) travel on that private pair, so requests from many
processes never mix. The pair stays open until the server exits, when the zygote, its
parent, reaps it and sends ``{"exit": status}``, or until the requester closes its end
(it no longer cares). Only a holder of the channel can ask. When every holder has closed
it (the program and its actors are gone) the zygote exits; the servers it forked live on
(they lead their own sessions) and it reaps them while it runs.

It is single-threaded, so a fork never copies a lock another thread held.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from typing import Any

from . import confinement, landlock, shared_layer
from .__main__ import _name_process, main, parse_args
from .confinement import Policy, Resolver, warm

MAX_REQUEST_BYTES = 1024 * 1024
"""Longest request line read (the environment's secrets travel in it)."""
REQUEST_TIMEOUT_S = 5.0
"""How long a requester may take to send its request (all are trouper's own processes)."""
WARM_ARGV = ["--state-dir", "s", "--workspace", "w", "--epoch", "1", "--confine",
             "--unreadable", "u", "--temporary", "t", "--shell-umask", "077"]
"""Options of each kind parsed once here: the regular expressions argparse compiles at a
parse (0.5 ms of a forked server's start) are then compiled in every server."""


def serve(channel_fd: int) -> int:
    """Answer spawn requests on ``channel_fd`` until every other holder closed it."""
    _name_process(b"trouper-zygote")
    channel = socket.socket(fileno=channel_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through wake_w
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the program's
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ, "channel")
    selector.register(wake_r, selectors.EVENT_READ, "wake")
    closing = [channel.fileno(), wake_r, wake_w, selector.fileno()]
    watchers: dict[int, socket.socket] = {}
    """A live server's pid -> its requester's pair, told the exit status."""
    try:
        warm()  # what confinement finds of the kernel, once for every server
        parse_args(WARM_ARGV)  # argparse compiles its patterns at the first parse
    except Exception:  # noqa: BLE001 - each server then finds it, and fails, itself
        traceback.print_exc()
    gc.freeze()  # what the servers share stays shared: their collector never writes to it
    while True:
        for key, _ in selector.select():
            if key.data == "wake":
                os.read(wake_r, 4096)
                _reap(watchers, selector)
                continue
            if key.data == "layer":  # what the shared layer was built from changed
                _unwatch(selector)
                shared_layer.discard()
                continue
            if isinstance(key.data, int):  # a requester closed its pair: it no longer asks
                _forget(key.data, watchers, selector)
                continue
            try:
                message, fds, _flags, _addr = socket.recv_fds(channel, 16, 1)
            except InterruptedError:
                continue
            if not message and not fds:
                _reap(watchers, selector)
                return 0  # every holder is gone
            for fd in fds:
                conn = socket.socket(fileno=fd)
                pid = _answer(conn, [*closing, *(w.fileno() for w in watchers.values())],
                              selector)
                if pid is None:
                    conn.close()
                else:
                    watchers[pid] = conn
                    selector.register(conn, selectors.EVENT_READ, pid)
                    _reap(watchers, selector)  # one that ended before it was filed


def _answer(conn: socket.socket, closing: list[int],
            selector: selectors.BaseSelector) -> int | None:
    """Read one request from ``conn``, fork its server, answer with the pid (returned)."""
    try:
        conn.settimeout(REQUEST_TIMEOUT_S)
        request = _read_line(conn)
        _unwatch(selector)
        try:
            _shared_layer([str(a) for a in request["argv"]], str(request.get("cwd", "/")))
        except Exception:  # noqa: BLE001 - the server then builds all its rules itself
            traceback.print_exc()
        _watch(selector)
        pid = _spawn(request, [*closing, conn.fileno()])
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        return pid
    except Exception as e:  # noqa: BLE001 - the requester hears why and starts one afresh
        try:
            conn.sendall(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode() + b"\n")
        except OSError:
            pass
        return None


def _read_line(conn: socket.socket) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ValueError("the requester closed before its request ended")
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            raise ValueError(f"request over {MAX_REQUEST_BYTES} bytes")
    request = json.loads(data)
    if not isinstance(request, dict) or not isinstance(request.get("argv"), list):
        raise ValueError("a request is an object with argv")
    return request


def _spawn(request: dict[str, Any], inherited: list[int]) -> int:
    argv = [str(a) for a in request["argv"]]
    env = {str(k): str(v) for k, v in dict(request.get("env") or {}).items()}
    cwd, log = str(request["cwd"]), str(request["log"])
    umask = int(request.get("umask", 0o077))
    pid = os.fork()
    if pid:
        return pid
    # the server, from here: nothing of the zygote's may leak into it
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        for fd in inherited:
            try:
                os.close(fd)
            except OSError:
                pass
        os.setsid()
        os.chdir(cwd)
        os.umask(umask)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        out = os.open(log, flags, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        os.environ.clear()
        os.environ.update(env)
        time.tzset()  # the request's TZ, not the zygote's
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the server's last words go to its log
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    return 0  # not reached: the child exits above


_LAYER_OPTIONS = ("--workspace", "--temporary", "--writable", "--unreadable")
_watched: list[int] = []
"""The shared layer's inotify descriptor, while the selector watches it."""


def _shared_layer(argv: list[str], cwd: str) -> None:
    """Before forking a confined local server: the layer of the rules its shell shares
    with every session's (``shared_layer``), kept while fresh, else built for its paths.
    Its server checks that the layer is its own (else builds all its rules itself), so
    these paths read from its command line are only a guess of them."""
    if "--confine" not in argv or "--container" in argv:
        return
    layer = shared_layer.current()
    if layer is not None and not shared_layer.mismatched() and layer.fresh():
        return  # its servers check it is theirs, and say when it is not
    values: dict[str, list[str]] = {name: [] for name in _LAYER_OPTIONS}
    for option, value in zip(argv, argv[1:]):
        if option in values:
            values[option].append(value)
    if not values["--workspace"]:
        return
    workspace = os.path.join(cwd, values["--workspace"][-1])
    unreadable = tuple(values["--unreadable"])
    policy = Policy(writable=(workspace, *values["--temporary"], *values["--writable"]),
                    unreadable=unreadable)
    resolver = Resolver()
    grants = confinement._grants(policy, resolver)
    grants.append((resolver.real(workspace), landlock.WRITE))  # the server makes it
    version = confinement._landlock_abi(confinement._libc(), [])
    shared_layer.ensure(version, grants, resolver.existing(unreadable))


def _watch(selector: selectors.BaseSelector) -> None:
    layer = shared_layer.current()
    if layer is not None and layer.watch >= 0:
        selector.register(layer.watch, selectors.EVENT_READ, "layer")
        _watched.append(layer.watch)


def _unwatch(selector: selectors.BaseSelector) -> None:
    while _watched:
        try:
            selector.unregister(_watched.pop())
        except (KeyError, ValueError):
            pass


def _reap(watchers: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    """Collect every server that exited (they are this process's children); tell each
    one's requester, if it still listens, its exit status."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = watchers.get(pid)
        if conn is not None:
            try:
                conn.setblocking(False)  # a few bytes into an empty buffer; never waits
                conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode()
                          + b"\n")
            except OSError:
                pass  # it closed its end meanwhile
            _forget(pid, watchers, selector)


def _forget(pid: int, watchers: dict[int, socket.socket],
            selector: selectors.BaseSelector) -> None:
    conn = watchers.pop(pid, None)
    if conn is not None:
        selector.unregister(conn)
        conn.close()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
