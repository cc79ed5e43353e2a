"""How a sandbox starts a stdio MCP server: where the agent's shell runs, as it runs.

- Local: the program itself, in the workspace, confined in the child exactly as the shell
  is (``Prepared.apply``: Landlock, seccomp, the dropped uid), with the shell's umask and
  default signal dispositions.
- Docker: ``docker exec -i`` into the session's container, as the shell's user, in the
  workspace's folder there; the values of ``env`` reach it by name (``-e NAME``) from the
  docker CLI's environment, never in argv.

Either way the server's environment is a minimal one (``BASE_NAMES`` of the shell's) plus
the server's own ``env``: the session's other secrets are not in it.
"""

from __future__ import annotations

import os
import posixpath
import signal
import sys
from typing import Any, Callable

from .bash import _default_signals
from .container import _HOME_FIX, ContainerShell
from .shell_policy import ShellConfinement
from .syscalls import Libc

_PR_SET_PDEATHSIG = 1

BASE_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "USER", "LOGNAME",
              "SHELL", "TMPDIR", "TZ")
"""Variables of the shell's environment a stdio server gets too."""


def launcher(workspace: str, env: dict[str, str], umask: int | None,
             container: ContainerShell | None,
             confinement: ShellConfinement | None) -> Callable[[dict[str, Any]], Any]:
    """The function that makes a server's ``Launch`` from its spec (a dict: ``command``,
    ``env``, ``cwd``), for this sandbox."""
    def launch(spec: dict[str, Any]) -> Any:
        from .mcp_stdio import Launch  # needs the mcp package: only once a server is used

        extra = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        command = [str(part) for part in spec["command"]]
        cwd = spec.get("cwd") or ""
        if container is not None:
            inside = posixpath.join(container.workdir, cwd) if cwd else container.workdir
            argv = container.exec_argv("sh", "-c", _HOME_FIX + 'cd -- "$0" && exec "$@"',
                                       inside, *command, names=sorted(extra), stdin=True)
            return Launch(argv, {**env, **extra}, None, _default_signals)
        base = {name: env[name] for name in BASE_NAMES if name in env}
        prepared = confinement.prepared if confinement is not None else None
        calls, server = Libc(), os.getpid()  # resolved before the fork (syscalls.py)

        def child() -> None:  # in the forked child, before exec
            _default_signals()
            if umask is not None:
                os.umask(umask)
            if prepared is not None:
                prepared.apply()
            # after apply, which clears it when it changes the uid: the server dies with
            # the sandbox server even if it ignores its stdin's end (a SIGKILLed server)
            calls.prctl("parent death signal", _PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != server:
                os._exit(1)  # the sandbox server died before the signal was set

        return Launch(command, {**base, **extra}, os.path.join(workspace, cwd) if cwd
                      else workspace, child)
    return launch


def hub_class() -> Any:
    """``mcp_hub.McpHub``, importing the ``mcp`` package: from this Python's
    site-packages, which a server started with ``-S`` (``runtimes/launch.py``: a lean
    start) adds only now, for the first MCP action, with OpenSSL (which that start keeps
    out, and an HTTP client needs). Raises ImportError without it."""
    for name in ("ssl", "_hashlib"):
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
    try:
        from .mcp_hub import McpHub
    except ImportError:
        if not sys.flags.no_site:
            raise
        import site

        site.main()  # the user's site stays out under -I (sys.flags.no_user_site)
        from .mcp_hub import McpHub
    return McpHub
