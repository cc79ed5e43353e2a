"""What a session's checkpoints keep (``runtimes/sandbox/checkpoints.py`` takes them).

    >>> CheckpointPolicy.model_validate(False).enabled
    False
    >>> CheckpointPolicy(max_file_bytes=1_000_000).limits()["max_file_bytes"]
    1000000
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from ..runtimes.sandbox.checkpoints import IGNORED, MAX_FILE_BYTES, MAX_FILES
from .base import Frozen


class CheckpointPolicy(Frozen):
    """Snapshots of the workspace after every action that may change it: ``True`` (the
    defaults), ``False`` (none), or these limits."""

    enabled: bool = True
    max_file_bytes: int = Field(default=MAX_FILE_BYTES, gt=0)
    """A file larger than this is left out (named in the snapshot)."""
    max_files: int = Field(default=MAX_FILES, gt=0)
    """Files past this many are left out (named)."""
    ignore: tuple[str, ...] = IGNORED
    """Names (of a file or folder, at any depth) left out of every snapshot."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value

    def limits(self) -> dict[str, Any]:
        """What the sandbox is told with each action (JSON)."""
        return {"max_file_bytes": self.max_file_bytes, "max_files": self.max_files,
                "ignore": list(self.ignore)}
