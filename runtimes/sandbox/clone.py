"""The ``clone`` setup action: ``git clone`` into the empty workspace, with a deadline.

It runs where the sandbox server runs (this machine for the local and Docker runtimes,
the remote host for a runtime server), so a path on that machine is a repository too,
and the image of a container needs no git. git never prompts (no terminal, no askpass):
a repository that needs credentials fails at once with git's own words.

When the server runs as root and the workspace is someone else's (a Docker runtime's
workspace handed to its container's uid), the cloned tree is given to the workspace's
owner (``owners.chown_tree``), so the shell can change every file of it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from typing import Any

from .owners import chown_tree

_TAIL_CHARS = 4000
"""git's output kept in the outcome (its last characters: the error is at the end)."""


def clone(
    workspace: str, url: str, branch: str | None, timeout_s: float,
    umask: int | None = None,
) -> dict[str, Any]:
    """Clone ``url`` (at ``branch``) into ``workspace``; an outcome, never an exception."""
    git = shutil.which("git")
    if git is None:
        return _error(f"git is not installed where the sandbox runs; cannot clone {url}")
    os.makedirs(workspace, exist_ok=True)
    if os.listdir(workspace):
        return _error(f"the workspace {workspace} is not empty; a repository is cloned into an "
                      "empty folder only (nothing was changed)")
    argv = [git, "clone", "--no-hardlinks"]
    if branch:
        argv += ["--branch", branch]
    argv += ["--", url, "."]
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="", SSH_ASKPASS="",
               GIT_SSH_COMMAND="ssh -o BatchMode=yes")
    process = subprocess.Popen(
        argv, cwd=workspace, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
        umask=umask if umask is not None else -1)
    try:
        raw, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return _error(f"git clone {url} did not finish within {timeout_s:g} s and was killed")
    output = raw.decode("utf-8", "replace")[-_TAIL_CHARS:].strip()
    if process.returncode != 0:
        return {"status": "error", "exit_code": process.returncode,
                "content": f"git clone {url} failed (exit status {process.returncode}):\n"
                           f"{output}"}
    owner = os.stat(workspace)
    if (owner.st_uid, owner.st_gid) != (os.geteuid(), os.getegid()):
        chown_tree(workspace, owner.st_uid, owner.st_gid)  # root only; a no-op otherwise
    head, commit = _rev_parse(git, workspace, "--abbrev-ref"), _rev_parse(git, workspace, "--short")
    note = f"Cloned {url} into the workspace: {head or branch or 'HEAD'} at {commit}."
    return {"status": "ok", "exit_code": 0,
            "content": f"{output}\n{note}".strip()}


def _rev_parse(git: str, workspace: str, how: str) -> str:
    """``git rev-parse <how> HEAD`` in ``workspace``: its tree may belong to another user
    than this process (git would call it of dubious ownership), so it is named safe."""
    safe = f"safe.directory={os.path.realpath(workspace)}"
    argv = [git, "-c", safe, "rev-parse", how, "HEAD"]
    return subprocess.run(argv, cwd=workspace, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=30).stdout.strip()


def _error(text: str) -> dict[str, Any]:
    return {"status": "error", "content": text}
