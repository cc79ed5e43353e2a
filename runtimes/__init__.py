"""Sandbox backends behind one small protocol (see base.py); loaded lazily by name.

sandbox = load_sandbox(LocalRuntime(), session_id="s1", workspace=ws, state_dir=rt)
attached = sandbox.start()

Every backend's class takes ``config`` (its runtime config: ``DockerRuntime`` and so on,
or None for the defaults) beside the keyword arguments the RuntimeProxy passes to all:
``session_id``, ``workspace``, ``state_dir`` (an owner-only folder of this machine for
the backend's own state), ``env``, ``secret_names`` and ``max_output_chars``.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

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

BACKENDS: dict[str, str] = {"local": "local:LocalSandbox", "docker": "docker:DockerSandbox",
                         "remote": "remote:RemoteSandbox"}
"""Backend name -> ``module:Class`` inside this package, imported only when asked for."""


class _Named(Protocol):
    @property
    def kind(self) -> str: ...


def load_sandbox(runtime: str | _Named, **kwargs: Any) -> Sandbox:
    """A new, not yet started sandbox of the backend ``runtime`` (a runtime config, or a
    backend's name for its defaults), built with ``kwargs``.

    Raises ConfigError for an unknown backend.
    """
    name = runtime if isinstance(runtime, str) else runtime.kind
    kwargs.setdefault("config", None if isinstance(runtime, str) else runtime)
    if name not in BACKENDS:
        known = ", ".join(sorted(BACKENDS))
        raise ConfigError(f"unknown sandbox backend {name!r}; known backends: {known}")
    module_name, class_name = BACKENDS[name].split(":")
    module = importlib.import_module(f".{module_name}", __name__)
    return getattr(module, class_name)(**kwargs)
