"""A confined shell's policy as a sandbox server builds it, and what of it applies here.

The local sandbox server and the runtime server confine their shells alike
(``confinement.py``): the workspace and the given folders writable, the given paths
unreadable, the network on or off, and, for a server running as root, the uid the shell
becomes. One thing needs care beyond the policy itself: a writable temporary folder that
an unreadable path splits (a trouper home under /tmp) can take no new entry in the shell,
so the shell gets a private temporary folder there, as ``TMPDIR``, that the server
removes when the shell's sandbox ends.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, replace

from .confinement import Policy, Prepared, Resolver, prepare

logger = logging.getLogger(__name__)


@dataclass
class ShellConfinement:
    """The policy every shell of a sandbox starts with, prepared once (its Landlock rule
    set serves each shell: a restart costs no walk), and what this machine applies."""

    policy: Policy
    prepared: Prepared
    """Applied in each shell's child; closed with ``close`` when the sandbox ends."""
    missing: tuple[str, ...]
    """What could not be applied here (``Prepared.missing``): said once, in the log and
    in ``report``."""
    split: tuple[str, ...]
    """Writable folders that take no new entry directly (``Prepared.split``)."""
    tmpdir: str | None
    """The shell's private temporary folder (its ``TMPDIR``), or None."""
    unreadable_real: tuple[str, ...]
    """``policy.unreadable`` resolved (``os.path.realpath``), in its order: what the file
    tools refuse as the shell would."""

    def report(self) -> dict[str, object]:
        """What a server says of it (``server.json``, a health answer)."""
        return {"missing": list(self.missing), "split": list(self.split),
                "network": self.policy.network, "tmpdir": self.tmpdir}

    def close(self) -> None:
        """Release the rule set and remove the private temporary folder (idempotent)."""
        self.prepared.close()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def confine_shell(workspace: str, temporary: tuple[str, ...], writable: tuple[str, ...],
                  unreadable: tuple[str, ...], network: bool,
                  drop_to: tuple[int, int] | None = None,
                  env: dict[str, str] | None = None) -> ShellConfinement:
    """Build the policy of a shell in ``workspace``: ``temporary`` and ``writable`` folders
    writable too, ``unreadable`` paths neither readable nor writable. Sets ``TMPDIR`` in
    ``env`` when the shell needs a private temporary folder (made here), and ``HOME`` too
    when the shell becomes ``drop_to`` (another user, whose home is not the server's).
    Logs what is missing on this machine."""
    policy = Policy(writable=(workspace, *temporary, *writable), unreadable=unreadable,
                    network=network, drop_to=drop_to)
    tmpdir = None
    resolver = Resolver()  # each path resolved once, for the split, the plan and the tools
    split_temp = _split(temporary, unreadable, resolver)
    dropped = drop_to is not None and os.geteuid() == 0
    if (split_temp or dropped) and temporary:
        tmpdir = tempfile.mkdtemp(prefix="trouper-shell-", dir=(split_temp or temporary)[0])
        if dropped:
            os.chown(tmpdir, *drop_to)  # type: ignore[misc]
        policy = replace(policy, writable=(*policy.writable, tmpdir))
        if env is not None:
            env["TMPDIR"] = tmpdir
            if dropped:
                env["HOME"] = tmpdir
    probe = prepare(policy, resolver)
    for hole in probe.missing:
        logger.warning("the shell is confined without %s", hole)
    if probe.split:
        logger.info("the shell cannot add entries directly in %s (an unreadable path lies "
                    "beneath)%s", ", ".join(probe.split),
                    f"; its TMPDIR is {tmpdir}" if tmpdir else "")
    return ShellConfinement(policy, probe, probe.missing, probe.split, tmpdir,
                            tuple(map(resolver.real, unreadable)))


def _split(folders: tuple[str, ...], unreadable: tuple[str, ...],
           resolver: Resolver) -> list[str]:
    """The ``folders`` Landlock will split: an existing unreadable path lies beneath (as
    ``landlock.plan`` finds, known before the walk, so that it is walked once)."""
    denied = resolver.existing(unreadable)
    return [f for f in folders
            if any(d.startswith(resolver.real(f).rstrip("/") + "/") for d in denied)]


def unreadable_refusal(workspace: str, path: str, unreadable: tuple[str, ...]) -> str | None:
    """Why the file tools refuse ``path`` (relative to ``workspace``, or absolute): it lies
    in a path the confined shell may not read (a credential store inside the workspace,
    such as ``~/.ssh`` when the workspace is a home folder). None when they may go on.
    ``workspace`` and ``unreadable`` are real paths; the tools refuse every symlink, so
    the path's text is where it leads."""
    full = os.path.normpath(os.path.join(workspace, path))
    if not full.startswith(workspace.rstrip("/") + "/"):
        return None  # outside the workspace: the tools refuse it themselves, and say so
    inside = [d for d in unreadable if d.startswith(workspace.rstrip("/") + "/")]
    for denied in inside:  # one around the workspace does not count: it is granted whole
        if full == denied or full.startswith(denied.rstrip("/") + "/"):
            return f"{path}: permission denied: the sandbox may not read or write it"
    return None
