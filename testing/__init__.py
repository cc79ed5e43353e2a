"""trouper's test harness: a scripted, fault-injecting LLM server and its scripts."""

from __future__ import annotations

from .checks import check_log
from .fake_llm import FakeLLMServer, RecordedRequest, serve
from .script import Script, ScriptError, Step, load_script

__all__ = [
    "check_log",
    "FakeLLMServer",
    "RecordedRequest",
    "Script",
    "ScriptError",
    "Step",
    "load_script",
    "serve",
]
