"""Run one OpenHands SDK conversation against the bench's scripted LLM server.

Runs inside the OpenHands virtual environment (Python 3.12), never imports trouper:

    .venv-openhands/bin/python bench/openhands_worker.py '{"url": ..., "steps": 20, ...}'

The agent has the SDK's terminal tool and nothing else; persistence is on (a
``persistence_dir``), the visualizer is off (trouper prints nothing either). Prints one
JSON line on stdout: the versions, the terminal backend, the wall time and the lines of
``out.txt``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import uuid
from importlib.metadata import version


def _quiet() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
    logging.disable(logging.WARNING)


def run(cfg: dict) -> dict:
    from openhands.sdk import LLM, Agent, Conversation, Tool
    from openhands.tools.terminal import TerminalTool
    from pydantic import SecretStr

    llm = LLM(
        usage_id="bench",
        model=cfg["model"],
        base_url=cfg["url"],
        api_key=SecretStr("x"),
        num_retries=0,
    )
    params = {"terminal_type": cfg["terminal"]} if cfg.get("terminal") else {}
    agent = Agent(llm=llm, tools=[Tool(name=TerminalTool.name, params=params)])
    workspace = cfg["workspace"]
    started = time.time()
    cpu = {"before": os.times(), "steps": 0}

    def on_event(event: object) -> None:
        """CPU is counted from the first observation on: the first call warms litellm up."""
        if type(event).__name__ == "ObservationEvent":
            cpu["steps"] += 1
            if cpu["steps"] == 1:
                cpu["before"] = os.times()

    conversation = Conversation(
        agent=agent,
        callbacks=[on_event],
        workspace=workspace,
        persistence_dir=cfg["persistence_dir"],
        conversation_id=uuid.uuid4(),
        visualizer=None,
        max_iteration_per_run=cfg["steps"] + 10,
    )
    try:
        conversation.send_message("bench: append the numbers to out.txt")
        conversation.run()
        status = str(getattr(conversation.state, "execution_status", ""))
    finally:
        conversation.close()
    ended, after = time.time(), os.times()
    out = os.path.join(workspace, "out.txt")
    lines = open(out).read().split() if os.path.exists(out) else []
    return {
        "started_s": started,
        "ended_s": ended,
        "status": status,
        "lines": lines,
        "cpu_s": sum(after[i] - cpu["before"][i] for i in range(4)),
        "cpu_steps": cpu["steps"],
        "python": sys.version.split()[0],
        "versions": {p: version(p) for p in ("openhands-sdk", "openhands-tools", "litellm")},
        "terminal": cfg.get("terminal") or _terminal_backend(),
    }


def _terminal_backend() -> str:
    import shutil

    return "tmux" if shutil.which("tmux") else "subprocess"


def main() -> int:
    _quiet()
    cfg = json.loads(sys.argv[1])
    result = run(cfg)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
