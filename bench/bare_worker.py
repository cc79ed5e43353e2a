"""The floor: a bare agent loop in one process, no actors, no log.

    python bench/bare_worker.py '{"url": ..., "model": ..., "workspace": ..., "steps": K}'

Each step is one ``litellm.completion`` with the whole history, the loop a user writes
by hand (with ``"route": "direct"`` in the config, trouper's direct route instead,
``llm/direct.py``: the same request for less CPU, the floor under trouper's own model
calls); the system prompt and tool specs come in the config, so the bench sends
trouper's own and the requests are the same size. Then the tool call runs in one
persistent bash (cd and
variables persist, as in trouper's shell). Nothing is written anywhere but the shell's
own files. Prints one JSON line: start and end times, the lines of ``out.txt``, the
process's CPU seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a command in a persistent bash shell.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "End the task.",
            "parameters": {
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
            },
        },
    },
]


class Shell:
    """One bash process; each command's end is found by a marker it prints after it."""

    def __init__(self, cwd: str) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )
        self.marker = f"__bench_{uuid.uuid4().hex}__"

    def run(self, command: str) -> tuple[str, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        line = f"{command}\nprintf '\\n{self.marker} %d\\n' $?\n"
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()
        fd, buf = self.proc.stdout.fileno(), b""
        token = self.marker.encode()
        while token not in buf or not buf.endswith(b"\n"):
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the shell exited")
            buf += chunk
        out, _, tail = buf.partition(b"\n" + token + b" ")
        return out.decode(errors="replace"), int(tail.split()[0])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _headers(cfg: dict) -> dict[str, str]:
    """Names the loop to the fake model when several run at once (``bare_fleet.py``)."""
    return {"x-trouper-session": cfg["session"]} if cfg.get("session") else {}


def warm_up(cfg: dict) -> None:
    """One model call, so that litellm's lazy setup is done before forking loops."""
    step(cfg, _first_messages(cfg), None)


def step(cfg: dict, messages: list[dict], shell: Shell | None) -> bool:
    """One model call and its tool calls; False once the model is done."""
    if cfg.get("route") == "direct":  # trouper's own route for this endpoint
        from trouper.config.models import LLMConfig
        from trouper.llm import direct

        llm = LLMConfig(model=cfg["model"], base_url=cfg["url"], api_key="x", timeout_s=60)
        response = direct.complete(llm, cfg["model"], messages,
                                   {"tools": cfg.get("tools") or TOOLS}, _headers(cfg))
    else:
        response = litellm.completion(
            model=cfg["model"],
            api_base=cfg["url"],
            api_key="x",
            messages=messages,
            tools=cfg.get("tools") or TOOLS,
            num_retries=0,
            timeout=60,
            extra_headers=_headers(cfg),
        )
    message = response.choices[0].message
    calls = message.tool_calls or []
    messages.append(
        {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ]
            or None,
        }
    )
    more = bool(calls)
    for call in calls:
        args = json.loads(call.function.arguments or "{}")
        if call.function.name == "finish":
            content, more = "ok", False
        elif shell is None:  # a warm-up call: nothing runs
            content = ""
        else:
            output, code = shell.run(args["command"])
            content = f"{output}\n[exit code {code}]"
        messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return more


def _first_messages(cfg: dict) -> list[dict]:
    return [
        {"role": "system", "content": cfg.get("system") or "You are a coding agent."},
        {"role": "user", "content": "bench: append the numbers to out.txt"},
    ]


def run(cfg: dict) -> dict:
    shell = Shell(cfg["workspace"])
    messages = _first_messages(cfg)
    started, before, calls = time.time(), os.times(), 0
    try:
        while calls < cfg["steps"] + 5:
            more = step(cfg, messages, shell)
            calls += 1
            if calls == 1:  # CPU is counted from here: the first call warms litellm up
                before = os.times()
            if not more:
                break
    finally:
        shell.close()
    ended, after = time.time(), os.times()
    out = os.path.join(cfg["workspace"], "out.txt")
    lines = open(out).read().split() if os.path.exists(out) else []
    cpu_s = sum(after[i] - before[i] for i in range(4))  # user, system, and the shell's
    return {
        "started_s": started,
        "ended_s": ended,
        "lines": lines,
        "cpu_s": cpu_s,
        "cpu_steps": calls - 1,
    }


def main() -> int:
    cfg = json.loads(sys.argv[1])
    sys.stdout.write(json.dumps(run(cfg)) + "\n")
    return 0


if __name__ == "__main__":
    from common import exit_now  # the bench's folder is this script's sys.path[0]

    exit_now(main())
