"""Which failures of a sandbox's start are the configuration's fault, and what fixes each.

A fault that can heal (a Docker engine restarting, a killed container, a network blip, a
full disk) is retried under the restart policy. A failure no retry can mend is raised as
``RuntimeMisconfigured`` with the cause and the fix in its message, and the session waits
in ERROR for the user instead (docs/recovery.md, "What is never retried"):

    the workspace cannot be made or used     not a folder, no permission, read-only, ...
    an image missing and not pullable        the engine answered the pull with an error
    an image name the engine refuses         not a valid reference (a 400)
    an image that cannot run the sandbox     no ``sh``, built for another platform
    a workspace Docker cannot mount          the engine refused the bind mount
    the docker SDK or CLI missing            nothing to start a container with

The remote runtime's own (a refused token, an address that is no runtime server) are in
``remote_errors``. Pure functions of the error: unit-tested without an engine.
"""

from __future__ import annotations

import errno
from pathlib import Path

from ..exceptions import RuntimeMisconfigured

WORKSPACE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST,
                              errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP})
"""Why a workspace cannot be made or written that waiting does not mend (a full disk,
ENOSPC, or an I/O error may pass: those are retried)."""

NO_SHELL = ('exec: "sh"', "exec: sh:", "exec /bin/sh:", "exec sh failed")
"""What the engine (or the container's init, tini, in its log) says when the container's
``sh`` does not exist."""
WRONG_PLATFORM = ("exec format error",)
MOUNT_REFUSED = ("invalid mount config", "bind source path does not exist", "mounts denied",
                 "error while creating mount source path", "not a directory: unknown")
"""What the engine says when it cannot bind-mount the workspace."""


def prepare_workspace(workspace: Path) -> None:
    """Make ``workspace`` if it is not there, and check it is a folder;
    ``RuntimeMisconfigured`` when it cannot be, the ``OSError`` of a fault that may pass."""
    try:
        workspace.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        unusable = workspace_unusable(workspace, e)
        if unusable is None:
            raise
        raise unusable from e
    if not workspace.is_dir():
        raise RuntimeMisconfigured(f"the workspace {workspace} is not a folder: remove it "
                                   "or choose another workspace")


def workspace_unusable(workspace: Path, error: OSError) -> RuntimeMisconfigured | None:
    """The misconfiguration an ``OSError`` on the workspace means, or None (may pass)."""
    if error.errno not in WORKSPACE_ERRNOS:
        return None
    if error.errno == errno.EEXIST:  # mkdir's word for a file where the folder should be
        return RuntimeMisconfigured(
            f"the workspace {workspace} exists and is not a folder: move it away, or choose "
            "another workspace (--workspace)")
    what = error.strerror or type(error).__name__
    where = f" ({error.filename})" if error.filename and str(error.filename) != str(
        workspace) else ""
    return RuntimeMisconfigured(
        f"the workspace {workspace} cannot be used: {what}{where}: choose a folder trouper "
        "may create and write (--workspace), or fix its permissions")


def image_not_pulled(image: str, error: Exception) -> RuntimeMisconfigured:
    """The image is not on this machine and the engine could not pull it."""
    return RuntimeMisconfigured(
        f"image {image!r} is not on this machine and cannot be pulled ({_said(error)}): "
        f"build or pull it (docker build -t {image} ..., or docker pull {image}) or choose "
        "another image (--image, or DockerRuntime(image=))")


def image_name_refused(image: str, error: Exception) -> RuntimeMisconfigured:
    """The engine refused the image's name itself (a 400: not a valid reference)."""
    return RuntimeMisconfigured(
        f"image {image!r} is not a name the Docker engine accepts ({_said(error)}): give a "
        "valid image reference (lowercase repository, one tag: name:tag) with --image, or "
        "DockerRuntime(image=)")


def container_refused(image: str, error: Exception | str) -> RuntimeMisconfigured | None:
    """The misconfiguration a failed create or start of a container means (by what the
    engine said, or the container's exit and log), or None when it may be a fault that
    passes."""
    if said := _line_with(error, WRONG_PLATFORM):  # its sh exists, but cannot run here
        return RuntimeMisconfigured(
            f"image {image!r} is built for another platform than this machine's ({said}): "
            "build or pull it for this one (docker pull --platform ...)")
    if said := _line_with(error, NO_SHELL):
        return RuntimeMisconfigured(
            f"image {image!r} has no sh, which the sandbox runs its shell with ({said}): "
            "choose an image with a POSIX shell (busybox, alpine, debian, ...) or add one "
            "to it")
    if said := _line_with(error, MOUNT_REFUSED):
        return RuntimeMisconfigured(
            f"the Docker engine cannot mount the workspace ({said}): choose a workspace on "
            "a path the engine can see (with a remote engine or Docker Desktop, a shared "
            "folder)")
    return None


def _line_with(error: Exception | str, markers: tuple[str, ...]) -> str:
    """The line of what the engine said (or the log quoted) that holds one of
    ``markers``, in one line; "" when none does."""
    said = getattr(error, "explanation", None) or str(error)
    for line in str(said).splitlines():
        if any(marker in line.lower() for marker in markers):
            return " ".join(line.split())[:300]
    return ""


def docker_missing(what: str) -> RuntimeMisconfigured:
    """The docker runtime needs ``what`` (the SDK, the CLI) on this machine."""
    return RuntimeMisconfigured(
        f"the docker runtime needs {what} on this machine: install Docker (its CLI, and "
        "the docker Python package trouper depends on), or use --runtime local")


def _said(error: Exception | str) -> str:
    """What the engine said, in one line (the SDK's ``explanation`` when it has one)."""
    said = getattr(error, "explanation", None) or str(error)
    return " ".join(str(said).split())[-500:]
