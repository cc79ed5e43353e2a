"""The local shell's confinement as trouper asks for it (``LocalRuntime``): what the shell
may not read by default (the trouper home, the places where a user's credentials usually
live), what it may write, and the sandbox server's options that say so.

The local runtime's shell and the runtime server's shells run as a real user of their
machine, so without confinement a model could ``cat`` that user's SSH keys, cloud
credentials or the trouper home (its sessions' ``secrets.json``, the daemon's token) and
write them anywhere, encoded past any masking. The lists here are a default, not a
guarantee: a session adds its own (``LocalRuntime(unreadable=...)``), and docs/runtimes.md
says what the kernel enforces.

    >>> paths = unreadable_paths(Path("/home/ann/.trouper"), home=Path("/home/ann"), env={})
    >>> "/home/ann/.ssh" in paths and "/home/ann/.trouper" in paths
    True
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..config.models import LocalRuntime

IN_HOME = (
    ".ssh", ".gnupg", ".password-store", ".local/share/keyrings",
    ".aws", ".azure", ".config/gcloud", ".kube", ".oci", ".config/doctl",
    ".docker", ".netrc", ".git-credentials", ".config/git/credentials", ".config/gh",
    ".config/hub", ".npmrc", ".yarnrc.yml", ".pypirc",
    ".cargo/credentials", ".cargo/credentials.toml", ".gem/credentials",
    ".m2/settings.xml", ".m2/settings-security.xml", ".gradle/gradle.properties",
    ".terraform.d/credentials.tfrc.json", ".vault-token", ".pgpass", ".my.cnf",
    ".s3cfg", ".boto", ".config/rclone", ".databrickscfg", ".cache/huggingface/token",
    ".huggingface/token", ".config/op", ".trouper",
)
"""Credential stores under a user's home directory (``~/.trouper``: the default trouper
home, whichever home a program opened)."""
SYSTEM = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers", "/etc/sudoers.d",
          "/etc/ssh/ssh_host_*_key")
"""Secrets of the system itself (only root can read them anyway: this matters for a
shell that runs as root)."""
FROM_ENV = ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "GOOGLE_APPLICATION_CREDENTIALS",
            "CLOUDSDK_CONFIG", "AZURE_CONFIG_DIR", "KUBECONFIG", "DOCKER_CONFIG", "NETRC",
            "PGPASSFILE", "GNUPGHOME", "TROUPER_TRANSPORT_KEY_FILE")
"""Variables that move a credential store elsewhere (``KUBECONFIG`` may list several,
separated by ``:``); what they name is unreadable too."""


def unreadable_paths(
    trouper_home: Path | None,
    *,
    home: Path | None = None,
    env: Mapping[str, str] | None = None,
    extra: Iterable[str] = (),
) -> list[str]:
    """Absolute paths a confined shell may not read: the trouper home, ``IN_HOME`` under
    the user's ``home`` (default: ``~``), ``SYSTEM``, what the ``FROM_ENV`` variables of
    ``env`` (default: this process's) name, and ``extra``. Paths that do not exist are
    kept (they cost nothing and may appear later); globs are expanded now."""
    env = os.environ if env is None else env
    home_dir = os.path.expanduser("~") if home is None else str(home)
    found: list[str] = []
    if trouper_home is not None:
        found.append(str(trouper_home))
    # strings, not Paths: a Path a credential store cost 7 ms of a sandbox's start
    found += [os.path.join(home_dir, relative) for relative in IN_HOME]
    for pattern in SYSTEM:
        found += sorted(glob.glob(pattern)) if "*" in pattern else [pattern]
    for name in FROM_ENV:
        for path in (env.get(name) or "").split(":" if name == "KUBECONFIG" else "\0"):
            if path and os.path.isabs(path):
                found.append(path)
    found += [os.path.expanduser(path) for path in extra]
    return list(dict.fromkeys(os.path.normpath(path) for path in found))


def temporary_folders(env: Mapping[str, str] | None = None) -> list[str]:
    """The folders a shell writes its temporary files in: ``/tmp``, ``/var/tmp``,
    ``/dev/shm`` and ``$TMPDIR``, those that exist."""
    env = os.environ if env is None else env
    folders = ["/tmp", "/var/tmp", "/dev/shm", env.get("TMPDIR") or ""]
    return list(dict.fromkeys(f for f in folders if f and os.path.isdir(f)))


def confinement_args(config: Any, state_dir: Path) -> list[str]:
    """The sandbox server's options for a shell of ``config`` (``LocalRuntime``; None: its
    defaults) whose state folder is ``state_dir``: ``--confine``, the temporary folders
    and ``config.writable`` writable (the server adds the workspace), the state folder,
    the trouper home and the credential stores unreadable. None for another backend."""
    config = LocalRuntime() if config is None else config
    if getattr(config, "kind", "") != "local" or not config.confine:
        return []
    unreadable = [str(state_dir), *unreadable_paths(trouper_home_of(state_dir),
                                                    extra=config.unreadable)]
    args = ["--confine", *([] if config.network else ["--no-network"])]
    args += [part for path in temporary_folders() for part in ("--temporary", path)]
    args += [part for path in config.writable for part in ("--writable", path)]
    return args + [part for path in unreadable for part in ("--unreadable", path)]


def trouper_home_of(state_dir: Path) -> Path | None:
    """The trouper home a sandbox's state folder lies in (``<home>/sessions/<id>/runtime``),
    or None when it lies elsewhere."""
    parents = Path(state_dir).parents
    if Path(state_dir).name == "runtime" and len(parents) > 2 and parents[1].name == "sessions":
        return parents[2]
    return None


def unconfined_warning(config: Any, confined: dict[str, Any] | None) -> str | None:
    """The one line that names what of the confinement a started server could not apply
    (``confined``: its ``server.json``'s report); None when nothing is missing."""
    config = LocalRuntime() if config is None else config
    missing = (confined or {}).get("missing")
    if getattr(config, "kind", "") != "local" or not config.confine or not missing:
        return None
    return (f"the shell is not fully confined on this machine: no {'; no '.join(missing)} "
            "(docs/runtimes.md, Local)")
