"""What the agent changed: a session's workspace compared with its baseline.

``take_baseline`` records the workspace when a session starts (``Trouper.start_session``
calls it); ``workspace_diff`` compares the workspace as it is now with it, as a
``WorkspaceDiff``. docs/api.md, "What the agent changed", says what is compared.
"""

from .baseline import Baseline, read_baseline, take_baseline
from .compare import workspace_diff
from .model import FileChange, WorkspaceDiff

__all__ = ["Baseline", "FileChange", "WorkspaceDiff", "read_baseline", "take_baseline",
           "workspace_diff"]
