"""trouper's test harness: a scripted, fault-injecting LLM server and its scripts."""

from __future__ import annotations

from .checks import check_log
from .fake_llm import FakeLLMServer, RecordedRequest, serve
from .faults import (
    actor_pid,
    hang,
    kill,
    kill_actor,
    kill_sandbox,
    sandbox_pid,
    wait_until,
)
from .replay import Divergence, ReplayReport, replay, replay_session
from .script import Script, ScriptError, Step, load_script

__all__ = [
    "actor_pid",
    "hang",
    "kill_actor",
    "kill",
    "kill_sandbox",
    "sandbox_pid",
    "wait_until",
    "check_log",
    "FakeLLMServer",
    "RecordedRequest",
    "Script",
    "ScriptError",
    "Step",
    "load_script",
    "Divergence",
    "ReplayReport",
    "replay",
    "replay_session",
    "serve",
]
