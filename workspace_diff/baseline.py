"""A session's baseline: its workspace as it was when the session started.

``take_baseline`` runs in ``Trouper.start_session``, before the session's actors exist,
so before its first action. It copies the workspace's files (those git would track: the
ignored ones, a repository's ``.git`` and any repository inside the workspace aside)
into a shadow git repository of the session's own, ``<home>/sessions/<id>/baseline.git``
(owner-only, like all the home), and records what it did in ``baseline.json`` beside it.
A git repository the user has in the workspace is only read, never written.

Four kinds of baseline:

- ``snapshot``: the copy above, as a commit of the shadow repository;
- ``empty``: the workspace was an empty folder (a new one, the usual case): nothing to
  copy, and no git to run (a session's start costs nothing more);
- ``clone``: a session that clones a repository starts from an empty folder, so its
  baseline is the commit the clone checked out, read when a diff is asked for from the
  clone's reflog (its first entry): the diff then shows the agent's work, not the whole
  clone as new;
- ``none``: no diff can be made, and ``reason`` says why (the workspace is on a runtime
  server's machine, git is missing, the workspace is past the limits).

It never raises: a baseline that cannot be taken is recorded as ``none`` with its cause,
and the session starts as it would have.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..config.models import SessionConfig
from ..config.settings import Settings, env_name, settings
from ..home.paths import Home, write_private
from ..runtimes.sandbox.mask import MIN_SECRET_CHARS, forms
from .git import NO_GIT, GitFailed, ShadowGit, find_git, nul_input, workspace_excludes
from .selection import holding_secrets, home_inside, new_files, select, size_text

logger = logging.getLogger(__name__)

BASELINE_GIT = "baseline.git"
"""The shadow repository, in the session's folder."""
BASELINE_RECORD = "baseline.json"
"""What ``take_baseline`` did, in the session's folder."""
BASELINE_REF = "refs/trouper/baseline"
REMOTE = ("the workspace is on the runtime server's machine, not this one: trouper cannot "
          "compare it (run git there, or download the files)")


class Baseline(BaseModel):
    """What a session's diff is made against (``baseline.json``)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: Literal["snapshot", "empty", "clone", "none"]
    taken_at: datetime
    """UTC."""
    commit: str = ""
    """The shadow repository's commit of the workspace (``snapshot``)."""
    reason: str = ""
    """Why there is no diff (``none``)."""
    too_large: tuple[str, ...] = ()
    """Files left out for their size (``snapshot``)."""
    repositories: tuple[str, ...] = ()
    """Repositories inside the workspace, left out (``snapshot``)."""
    with_secrets: tuple[str, ...] = ()
    """Files that held a secret value of the session, left out (``snapshot``): a secret
    is stored nowhere but the secrets file."""
    max_file_bytes: int = 0
    """The size limit the baseline was taken with."""


def baseline_git(home: Home, session_id: str) -> Path:
    return home.session_dir(session_id) / BASELINE_GIT


def read_baseline(home: Home, session_id: str) -> Baseline | None:
    """The session's baseline record; None when it has none (a session from before
    baselines, or a record that cannot be read)."""
    path = home.session_dir(session_id) / BASELINE_RECORD
    try:
        return Baseline.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as e:
        logger.debug("session %s: no baseline record (%s)", session_id, e)
        return None


def take_baseline(home: Home, session_id: str, config: SessionConfig,
                  limits: Settings | None = None, secrets: Iterable[str] = ()) -> Baseline:
    """Record the session's workspace as it is now (see the module docstring); never
    raises. ``secrets``: the session's secret values (its own, its credentials): a file
    that holds one is not copied."""
    limits = limits or settings()
    values = secret_bytes(secrets)
    try:
        baseline = _take(home, session_id, config, limits, values)
    except (GitFailed, OSError) as e:
        baseline = _none(f"no baseline of the workspace could be taken: {e}")
    if baseline.kind == "none":
        logger.warning("session %s: no diff of its workspace will be possible: %s",
                       session_id, baseline.reason)
    write_private(home.session_dir(session_id) / BASELINE_RECORD, baseline.model_dump_json())
    return baseline


def secret_bytes(secrets: Iterable[str]) -> tuple[bytes, ...]:
    """Each value as a file may hold it: every form text may take (``mask.forms``: a lone
    surrogate as U+FFFD, ``?`` or dropped...), in UTF-8, an undecodable byte as itself."""
    found: dict[bytes, None] = {}
    for value in secrets:
        if len(value) < MIN_SECRET_CHARS:
            continue
        for form in forms(value):
            try:
                found.setdefault(form.encode("utf-8", "surrogateescape"))
            except UnicodeEncodeError:  # a surrogate no byte decodes to: no file holds it
                continue
    return tuple(found)


def _take(home: Home, session_id: str, config: SessionConfig, limits: Settings,
          secrets: tuple[bytes, ...]) -> Baseline:
    if config.runtime.kind == "remote":
        return _none(REMOTE)
    now, workspace = datetime.now(UTC), Path(config.workspace)
    if config.repo is not None:  # compared with the commit the clone checks out
        return Baseline(kind="clone", taken_at=now, max_file_bytes=limits.diff_max_file_bytes)
    if not any(workspace.iterdir()):  # a new folder (the usual case): no git to run
        return Baseline(kind="empty", taken_at=now, max_file_bytes=limits.diff_max_file_bytes)
    program = find_git()
    if program is None:
        return _none(NO_GIT)
    git = ShadowGit(program, baseline_git(home, session_id), workspace,
                    excludes_file=workspace_excludes(workspace))
    init_shadow(git)
    chosen = select(workspace, new_files(git), limits.diff_max_file_bytes,
                    hidden=home_inside(home.root, workspace))
    if too_many := _past_limits(len(chosen.files), chosen.total_bytes, limits):
        return _none(too_many)  # before a file is read
    with_secrets = holding_secrets(workspace, chosen.files, secrets)
    left_out = set(with_secrets)
    commit = _commit(git, [path for path in chosen.files if path not in left_out])
    return Baseline(kind="snapshot", taken_at=now, commit=commit, too_large=chosen.too_large,
                    repositories=chosen.repositories, with_secrets=with_secrets,
                    max_file_bytes=limits.diff_max_file_bytes)


def _commit(git: ShadowGit, files: list[str]) -> str:
    """Copy ``files`` into the shadow repository; the commit that holds them."""
    if files:
        git.run("add", "--pathspec-from-file=-", "--pathspec-file-nul",
                stdin=nul_input(files))
    tree = git.run("write-tree").decode().strip()
    commit = git.run("commit-tree", "-m", "the workspace when the session started",
                     tree).decode().strip()
    git.run("update-ref", BASELINE_REF, commit)
    return commit


def init_shadow(git: ShadowGit) -> None:
    """Make the shadow repository if it is not there yet: owner-only, no hooks."""
    if not (git.git_dir / "HEAD").exists():
        git.run("init", "-q", "--shared=0600", "--template=")


def _past_limits(files: int, total: int, limits: Settings) -> str | None:
    """Why a workspace is too large for a baseline, naming the setting; None if it fits."""
    if files > limits.diff_max_files:
        return (f"the workspace has {files} files, more than {env_name('diff_max_files')}="
                f"{limits.diff_max_files}: no baseline was taken (raise it, or ignore "
                "what need not be compared in a .gitignore)")
    if total > limits.diff_max_bytes:
        return (f"the workspace's files add up to {size_text(total)}, more than "
                f"{env_name('diff_max_bytes')}={size_text(limits.diff_max_bytes)}: no "
                "baseline was taken (raise it, or ignore what need not be compared in a "
                ".gitignore)")
    return None


def _none(reason: str) -> Baseline:
    return Baseline(kind="none", taken_at=datetime.now(UTC), reason=reason)


__all__ = ["BASELINE_GIT", "BASELINE_RECORD", "Baseline", "baseline_git", "init_shadow",
           "read_baseline", "take_baseline"]
