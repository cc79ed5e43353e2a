"""Only the LLM broker holds litellm (``actors/lazy_broker.py``): the root, the admin and
every session process are forked without it, so forking a session copies the page tables
of about 35 MB rather than 180."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # a program of its own, with its actor system

PROGRAM = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from trouper import Trouper
    from trouper.testing import FakeLLMServer, load_script

    home, workspace = Path(sys.argv[1]), sys.argv[2]
    with FakeLLMServer(load_script([{"say": "hi"}])) as server, Trouper(home=home) as t:
        session = t.start_session("t", llm={"model": "hosted_vllm/x", "base_url": server.url,
                                            "api_key": "k"}, workspace=workspace)
        session.wait(timeout=60)
        pid_files = {"admin": home / "actors" / "admin.pid", "root": home / "actors" / "root.pid",
                     "broker": home / "actors" / "broker.pid",
                     "session": t.home.actor_pid_path("session", session.id)}
        found = {}
        for role, path in pid_files.items():
            pid = path.read_text().split()[0]
            maps = open(f"/proc/{pid}/maps").read()
            found[role] = sorted({p.split("site-packages/")[1].split("/")[0]
                                  for p in maps.split() if "site-packages/" in p})
        print(json.dumps({"program": "litellm" in sys.modules, "processes": found}))
""")


def test_only_the_broker_holds_litellm(tmp_path):
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / "home"),
                           str(tmp_path / "ws")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    processes = report["processes"]
    assert report["program"], "the program checks the model with litellm, after the fork"
    assert "tiktoken" in processes["broker"]  # the check can see litellm's libraries
    for role in ("admin", "root", "session"):
        assert not {"tiktoken", "aiohttp"} & set(processes[role]), (role, processes[role])
