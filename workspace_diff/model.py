"""What the agent changed in a session's workspace, as the API returns it.

``WorkspaceDiff`` is the answer of ``SessionHandle.diff()``, ``GET
/v1/sessions/{id}/diff`` and ``trouper diff``: the files added, modified and deleted since
the session's baseline, each with its unified diff, and what was not compared and why.
When no diff can be made (no baseline, a workspace on another machine), ``available`` is
False and ``reason`` says why: never a wrong diff.

    d = session.diff()
    print(d.patch())        # a unified diff, as git writes it
    print(d.stat())         #  A hello.txt | 1 +   ...   1 file changed, 1 insertion(+)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

ChangeKind = Literal["added", "modified", "deleted"]
LETTERS: dict[str, str] = {"added": "A", "modified": "M", "deleted": "D"}
BINARY_CHANGED = "binary file changed"


class FileChange(BaseModel):
    """One file that differs from the baseline."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    path: str
    """Relative to the workspace, ``/``-separated."""
    change: ChangeKind
    binary: bool = False
    """A binary file: its patch says only that it changed."""
    added_lines: int = 0
    removed_lines: int = 0
    patch: str = ""
    """Its unified diff (from ``diff --git``), ending with a newline; for a binary file
    git's header and ``binary file changed``; empty for one left out."""
    left_out: str = ""
    """Why its content is not compared (larger than the limit); empty when it is."""


class WorkspaceDiff(BaseModel):
    """A session's workspace compared with its baseline (the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    session_id: str
    workspace: str
    available: bool
    """False: no diff can be made, and ``reason`` says why."""
    reason: str = ""
    base: str = ""
    """What the workspace is compared with, in words."""
    files: tuple[FileChange, ...] = ()
    """In path order."""
    notes: tuple[str, ...] = ()
    """What was not compared, and why (ignored paths, files past the size limit,
    repositories inside the workspace)."""

    def patch(self) -> str:
        """The whole unified diff (empty when nothing changed or none is available)."""
        return "".join(change.patch for change in self.files)

    def stat(self) -> str:
        """A summary: one line a file (``A``/``M``/``D``, the path, lines added and
        removed), then the totals."""
        if not self.files:
            return "no changes\n"
        width = max(len(change.path) for change in self.files)
        lines = [f" {LETTERS[c.change]} {c.path:<{width}} | {_counts(c)}" for c in self.files]
        added = sum(c.added_lines for c in self.files)
        removed = sum(c.removed_lines for c in self.files)
        count = len(self.files)
        lines.append(f"{count} file{'s' if count != 1 else ''} changed, "
                     f"{added} insertion{'s' if added != 1 else ''}(+), "
                     f"{removed} deletion{'s' if removed != 1 else ''}(-)")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        """As the daemon's API writes it."""
        return self.model_dump(mode="json")


def masked(diff: WorkspaceDiff) -> WorkspaceDiff:
    """``diff`` with every secret this process knows masked (paths and patches too)."""
    from ..security.masking import known_masker

    masker = known_masker()
    if not masker.enabled:
        return diff
    files = tuple(change.model_copy(update={"path": masker.mask_text(change.path),
                                            "patch": masker.mask_text(change.patch)})
                  for change in diff.files)
    notes = tuple(masker.mask_text(note) for note in diff.notes)
    return diff.model_copy(update={"files": files, "notes": notes,
                                   "reason": masker.mask_text(diff.reason)})


def _counts(change: FileChange) -> str:
    if change.left_out:
        return f"not compared ({change.left_out})"
    if change.binary:
        return "binary"
    return f"+{change.added_lines} -{change.removed_lines}"


__all__ = ["BINARY_CHANGED", "ChangeKind", "FileChange", "WorkspaceDiff", "masked"]
