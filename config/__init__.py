"""What a session and the program are given: the config models (``models.py``), their
checks (``checks.py``), the program's settings (``settings.py``) and confirmation mode
(``confirmation.py``). The models are re-exported here: ``from trouper.config import
DockerRuntime``."""

from .models import (
    Config,
    DockerRuntime,
    LLMConfig,
    LocalRuntime,
    RemoteRuntime,
    RuntimeConfig,
    SessionConfig,
)

__all__ = ["Config", "DockerRuntime", "LLMConfig", "LocalRuntime", "RemoteRuntime",
           "RuntimeConfig", "SessionConfig"]
