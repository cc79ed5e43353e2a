"""Sandbox backends behind one small protocol (see base.py); loaded lazily by name.

sandbox = load_sandbox("local", session_id="s1", workspace=ws, state_dir=rt)
attached = sandbox.start(epoch=1)
"""

from __future__ import annotations

import importlib
from typing import Any

from ..exceptions import ConfigError
from .base import JournalRecord, JournalState, Runtime, Sandbox, SandboxHealth

__all__ = [
    "BACKENDS",
    "JournalRecord",
    "JournalState",
    "Runtime",
    "Sandbox",
    "SandboxHealth",
    "load_sandbox",
]

BACKENDS: dict[str, str] = {"local": "local:LocalSandbox"}
"""Backend name -> ``module:Class`` inside this package, imported only when asked for."""


def load_sandbox(name: str, **kwargs: Any) -> Sandbox:
    """A new, not yet started sandbox of the backend ``name``, built with ``kwargs``.

    Raises ConfigError for an unknown name.
    """
    if name not in BACKENDS:
        known = ", ".join(sorted(BACKENDS))
        raise ConfigError(f"unknown sandbox backend {name!r}; known backends: {known}")
    module_name, class_name = BACKENDS[name].split(":")
    module = importlib.import_module(f".{module_name}", __name__)
    return getattr(module, class_name)(**kwargs)
