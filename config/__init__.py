"""What a session and the program are given: the config models (``models.py``), their
checks (``checks.py``), the program's settings (``settings.py``), confirmation mode
(``confirmation.py``), and the config files (``files.py``) with the precedence of their
values over the defaults and under the environment and flags (``layers.py``). The
models are re-exported here: ``from trouper.config import
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
