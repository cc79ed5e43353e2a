"""A session's workspace as it is now, compared with its baseline (``baseline.py``).

The comparison runs on a copy of the shadow repository's index, in the session's folder,
removed afterwards: the files git lists that the baseline lacks are added to that copy
as intent-to-add (their content is read, never stored), so ``git diff <baseline>`` shows
the new, changed and deleted files at once. Nothing is written to the workspace, to a
repository of the user's, or to the baseline itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..config.models import SessionConfig
from ..config.settings import Settings, settings
from ..home.paths import Home
from .baseline import REMOTE, Baseline, baseline_git, init_shadow, read_baseline
from .git import (
    NO_GIT,
    GitFailed,
    ShadowGit,
    find_git,
    nul_input,
    nul_list,
    shown,
    workspace_excludes,
)
from .model import WorkspaceDiff
from .patches import MAX_PATCH_BYTES, changes, file_patches, name_status, numstat
from .selection import Selection, file_size, home_inside, new_files, select, size_text

DIFF_OPTIONS = ("--no-renames", "--no-ext-diff", "--no-textconv", "--no-color",
                "--ignore-submodules=all")
NO_BASELINE = ("this session has no baseline of its workspace (it started before trouper "
               "took one, or its record was removed): there is nothing to compare with")
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
"""git's empty tree (every repository knows it): the baseline of an empty workspace."""
NAMED = 5
"""Paths a note names before it says how many more."""


class Unavailable(Exception):
    """No diff can be made; the message says why."""


def workspace_diff(home: Home, session_id: str, config: SessionConfig,
                   limits: Settings | None = None) -> WorkspaceDiff:
    """What changed in the session's workspace since its baseline (unmasked: the caller
    masks what it shows). Never raises for a diff it cannot make: ``available`` is False
    and ``reason`` says why."""
    workspace = Path(config.workspace)
    try:
        return _compare(home, session_id, workspace, config, limits or settings())
    except (Unavailable, GitFailed, OSError, ValueError) as e:
        reason = str(e) if isinstance(e, Unavailable) else f"the diff could not be made: {e}"
        return WorkspaceDiff(session_id=session_id, workspace=str(workspace),
                             available=False, reason=reason)


def _compare(home: Home, session_id: str, workspace: Path, config: SessionConfig,
             limits: Settings) -> WorkspaceDiff:
    baseline = _usable_baseline(home, session_id, config)
    program = find_git()
    if program is None:
        raise Unavailable(NO_GIT)
    if not workspace.is_dir():
        raise Unavailable(f"the workspace {workspace} is gone: nothing to compare")
    with _index_copy(home, session_id, baseline) as index:
        cloned = baseline.kind == "clone"
        git = ShadowGit(program, baseline_git(home, session_id), workspace, index,
                        alternates=(workspace / ".git" / "objects",) if cloned else (),
                        excludes_file=workspace_excludes(workspace))
        init_shadow(git)  # an empty or a clone's baseline made none at the start
        if cloned:
            commit = clone_commit(workspace)
            git.run("read-tree", "--end-of-options", commit)
            base = f"commit {commit[:12]}, which the repository was cloned at"
        else:
            commit = baseline.commit or EMPTY_TREE
            base = ("the workspace when the session started "
                    f"({baseline.taken_at:%Y-%m-%d %H:%M:%S} UTC)")
        hidden = home_inside(home.root, workspace)
        return _diff(git, session_id, commit, base, baseline, limits, hidden)


def _usable_baseline(home: Home, session_id: str, config: SessionConfig) -> Baseline:
    if config.runtime.kind == "remote":
        raise Unavailable(REMOTE)
    baseline = read_baseline(home, session_id)
    if baseline is None:
        raise Unavailable(NO_BASELINE)
    if baseline.kind == "none":
        raise Unavailable(baseline.reason)
    return baseline


def _diff(git: ShadowGit, session_id: str, commit: str, base: str, baseline: Baseline,
          limits: Settings, hidden: str | None) -> WorkspaceDiff:
    limit = limits.diff_max_file_bytes
    chosen = select(git.work_tree, new_files(git), limit,
                    frozenset((*baseline.too_large, *baseline.with_secrets)), hidden)
    if chosen.files:
        git.run("add", "--intent-to-add", "--pathspec-from-file=-", "--pathspec-file-nul",
                stdin=nul_input(list(chosen.files)))
    statuses = name_status(git.run("diff", *DIFF_OPTIONS, "--name-status", "-z", commit))
    grown = {path: f"larger than {size_text(limit)}" for change, path in statuses
             if change != "deleted" and file_size(git.work_tree / path) > limit}
    statuses += [("added", path) for path in chosen.too_large]
    left_out = {**grown, **{p: f"larger than {size_text(limit)}" for p in chosen.too_large}}
    skip = [f":(exclude,literal){path}" for path in grown]
    counts = numstat(git.run("diff", *DIFF_OPTIONS, "--numstat", "-z", commit, "--", *skip,
                             literal=False))
    patch, more = git.run_capped("diff", *DIFF_OPTIONS, commit, "--", *skip,
                                 max_bytes=MAX_PATCH_BYTES, literal=False)
    patches = file_patches(patch, [path for path, *_ in counts], cut=more)
    files, cut = changes(sorted(statuses, key=lambda s: s[1]), counts, patches, left_out)
    notes = _notes(git, baseline, chosen, limit, cut)
    return WorkspaceDiff(session_id=session_id, workspace=str(git.work_tree), available=True,
                         base=base, files=tuple(files), notes=tuple(notes))


def _notes(git: ShadowGit, baseline: Baseline, chosen: Selection, limit: int,
           cut: int) -> list[str]:
    """What was not compared, in words."""
    notes = []
    ignored = nul_list(git.run("ls-files", "--others", "--ignored", "--exclude-standard",
                               "--directory", "-z"))
    if ignored:
        notes.append(f"ignored paths are not compared (.gitignore): {_named(ignored)}")
    if baseline.too_large:
        notes.append(f"files larger than {size_text(baseline.max_file_bytes)} when the "
                     f"session started are not compared: {_named(list(baseline.too_large))}")
    if chosen.too_large:
        notes.append(f"files larger than {size_text(limit)} are listed, their content not "
                     f"compared: {_named(list(chosen.too_large))}")
    if baseline.with_secrets:
        notes.append("files that held a secret value of the session when it started are "
                     f"not compared (never copied): {_named(list(baseline.with_secrets))}")
    repositories = sorted({*baseline.repositories, *chosen.repositories})
    if repositories:
        notes.append(f"repositories inside the workspace are not compared: "
                     f"{_named(repositories)}")
    if cut:
        notes.append(f"the diff is too long to show whole: {cut} file(s) are listed "
                     "without their patch")
    return notes


def _named(paths: list[str]) -> str:
    more = len(paths) - NAMED
    return ", ".join(shown(p) for p in paths[:NAMED]) + (f" and {more} more" if more > 0 else "")


_COMMIT_ID = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
"""A full object id, SHA-1 or SHA-256."""


def clone_commit(workspace: Path) -> str:
    """The commit a cloned repository checked out: its reflog's first entry (``clone:
    from ...``), read from the file, so the repository is not touched."""
    try:
        first = (workspace / ".git" / "logs" / "HEAD").read_text("utf-8", "replace")
    except OSError:
        raise Unavailable("the workspace holds no cloned repository (the clone has not run "
                          "yet, failed, or its .git was removed): nothing to compare "
                          "with") from None
    line = first.splitlines()[0] if first else ""
    fields = line.split("\t", 1)[0].split(" ")
    if len(fields) < 2 or "\tclone: " not in line:
        raise Unavailable("the workspace repository's history does not start with its "
                          "clone: the commit it was cloned at is unknown")
    # the agent can write this file: anything but a hash (an option such as
    # --index-output=PATH) would reach git, which runs outside the sandbox
    if not _COMMIT_ID.fullmatch(fields[1]):
        raise Unavailable("the workspace repository's history does not name the commit it "
                          "was cloned at: nothing to compare with")
    return fields[1]


@contextlib.contextmanager
def _index_copy(home: Home, session_id: str, baseline: Baseline) -> Iterator[Path]:
    """A private index for one comparison (a copy of the baseline's for a snapshot),
    removed afterwards."""
    folder = home.session_dir(session_id)
    fd, name = tempfile.mkstemp(prefix=".diff-index.", dir=folder)
    os.close(fd)
    path = Path(name)
    try:
        source = baseline_git(home, session_id) / "index"
        if baseline.kind == "snapshot" and source.exists():
            shutil.copyfile(source, path)
        else:
            path.unlink()  # git makes it; an empty file is no index
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


__all__ = ["NO_BASELINE", "clone_commit", "workspace_diff"]
