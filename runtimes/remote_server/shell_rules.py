"""How a runtime server confines its sessions' shells, and whom they run as.

The same confinement as the local runtime's (``sandbox/confinement.py``): each shell
writes only its session's workspace and the temporary folders, and cannot read the
server's workdir (the other sessions, every journal), its token and TLS key files, nor
the usual credential stores of the server's user. A server that runs as root never gives
a shell root: the shell becomes the workspace owner, or, for a root-owned workspace (the
server makes them), the dedicated unprivileged uid (``TROUPER_SANDBOX_UID``, 65532), to
whom the workspace is handed; and nothing the shell does leaves a setuid or setgid file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..docker_user import choose_user, hand_over
from ..sandbox.shell_policy import ShellConfinement, confine_shell
from ..shell_confinement import temporary_folders, unreadable_paths


@dataclass(frozen=True)
class ShellRules:
    """The runtime server's options for every session's shell."""

    network: bool = True
    """Whether shells may open network sockets (``--no-network``: Unix sockets only)."""
    unreadable: tuple[str, ...] = ()
    """More paths no shell may read (``--unreadable``)."""
    writable: tuple[str, ...] = ()
    """More folders every shell may write (``--writable``)."""
    secret_files: tuple[str, ...] = ()
    """The server's own secrets (its token file, its TLS key): never readable."""
    sandbox_uid: int | None = None
    """The uid (and gid) for root-owned workspaces when the server is root; None: the
    ``sandbox_uid`` setting."""

    def confine(self, workspace: Path, workdir: Path, env: dict[str, str]) -> ShellConfinement:
        """The confinement of a new shell of the session whose workspace is ``workspace``
        (``env`` is its environment: a private ``TMPDIR``/``HOME`` may be set in it)."""
        drop_to = None
        if os.geteuid() == 0:
            info = workspace.stat()
            drop_to, hand = choose_user(None, (info.st_uid, info.st_gid),
                                        dedicated=self.sandbox_uid)
            if hand:
                hand_over(workspace, drop_to)
        unreadable = [str(workdir), *self.secret_files,
                      *unreadable_paths(None, extra=self.unreadable)]
        return confine_shell(str(workspace), tuple(temporary_folders()), self.writable,
                             tuple(unreadable), self.network, drop_to, env)
