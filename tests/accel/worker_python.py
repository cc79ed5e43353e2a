"""The ``python`` that pytest-xdist starts for each worker: it asks the suite's zygote
(``zygote.py`` here, started by pytest's controller through ``forkserver.serve_workers``)
to fork the worker with this process's descriptors, environment and folder, then stands
for it until it exits, with its exit status.

    python -I -S worker_python.py -u -c "import sys;exec(eval(sys.stdin.readline()))"

A worker forked so starts with trouper, litellm and pytest imported (~3.5 s of CPU each
otherwise); what it forks in turn (``forkserver``) comes from the same zygote. Standard
library only, and ``-S``: this process costs a few milliseconds. Signals it can catch it
passes on to the worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

SOCKET_ENV = "TROUPER_TEST_ZYGOTE_SOCKET"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def main() -> int:
    path = os.environ.get(SOCKET_ENV)
    if not path:
        sys.exit(f"worker_python: {SOCKET_ENV} names no zygote socket")
    control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    control.connect(path)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    request = {"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(),
               "targets": [0, 1, 2], "new_session": False, "sigint_ignored": False}
    socket.send_fds(control, [json.dumps(request).encode()], [theirs.fileno(), 0, 1, 2])
    theirs.close()
    control.close()  # the zygote keeps its end until the worker is reaped; nothing more to ask
    started = json.loads(ours.recv(4096) or b"{}")
    if "pid" not in started:
        sys.exit("worker_python: the zygote did not fork the worker")
    pid = started["pid"]
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, _frame: _forward(pid, signum))
    while True:
        try:
            answer = ours.recv(4096)
            break
        except InterruptedError:
            continue
    code = json.loads(answer)["exit"] if answer else -signal.SIGKILL
    if code < 0:  # died by a signal: so does its stand-in
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main())
