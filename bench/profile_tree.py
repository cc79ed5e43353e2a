"""Where a session tree's cost goes: each actor process's memory, messages and start.

    .venv/bin/python bench/profile_tree.py anatomy [--n 100] [--steps 20] [--latency-ms 50]
    .venv/bin/python bench/profile_tree.py hops [--k 200]
    .venv/bin/python bench/profile_tree.py start [--m 20]
    .venv/bin/python bench/profile_tree.py codec      # after hops: its sampled messages

Every mode instruments the trouper with ``tree_probe`` (see there: what each actor
process imported, built and wrote after its fork, and every frame it sent and received):

- ``anatomy``: N sessions of ``steps`` echo steps at once, as the concurrency workload
  runs them; once all settled (their processes still up), each actor process's
  ``smaps_rollup`` from outside and its probe report from inside, by role (the median
  process): private and shared MB, private MB by kind of mapping, private MB at its
  fork, once its actor object was made, and now; the modules it imported since its fork,
  the objects it made since it froze its heap, its threads, pymalloc's arenas; and the
  messages of the whole run per step, by pair of roles.
- ``hops``: one session of K steps (model latency 0); the frames of steps 2..K by pair of
  roles and message type, per step, with the bytes and the CPU of pickling and of the MAC
  on each side (the bench's own ``AuthenticatedCodec`` figures), and the acknowledgements.
- ``start``: M sessions started one after another, each until its first model request
  (the model never answers, so no step runs): CPU and minor page faults of a start by
  role (``/proc``), each new process's CPU and faults from its fork to its actor object
  and on to its first request, the start's timeline, and the frames a start costs.
- ``codec``: the CPU of pickling, MAC-ing and unpickling each message type the last
  ``hops`` run sampled (as trouper sends it), against pydantic's JSON for the same.

Prints a summary and writes the JSON to ``bench/results/tree-<mode>-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tree_probe  # noqa: E402
from common import RESULTS_DIR, chat_requests, echo_script, median  # noqa: E402
from contenders import TASK, llm_config, wait_until  # noqa: E402
from procs import (  # noqa: E402
    _stat,
    cpu_delta,
    role_cpu_s,
    roles,
    session_processes,
    smaps_rollup_kb,
    trouper_tree,
)

from trouper.host.processes import listening_sockets, socket_inodes  # noqa: E402

ACTOR_ROLES = ("trouper-root", "trouper-llm", "trouper-session", "trouper-proxy",
               "trouper-ctl")
"""The processes that run a trouper actor (the admin and its logger are Thespian's)."""


def open_probed(workdir: Path, count_hops: bool = True,
                profile_start: bool = False) -> tuple[Any, int, Path]:
    from trouper import Trouper
    from trouper.client.actor_system import free_port

    probe_dir = workdir / "probe"
    tree_probe.install(probe_dir, count_hops=count_hops, profile_start=profile_start)
    port = free_port()
    t = Trouper(home=workdir / "home", admin_port=port)
    if not wait_until(lambda: t.home.actor_pid_path("broker").exists(), 120.0):
        raise TimeoutError("the LLM broker did not boot within 120 s")
    return t, port, probe_dir


def port_roles(pids: dict[int, str], admin_port: int) -> dict[int, str]:
    """Listening port -> the role of the process that listens on it."""
    ports = {port: inode for inode, (_ip, port) in listening_sockets().items()}
    by_inode = {inode: port for port, inode in ports.items()}
    out = {admin_port: "trouper-admin"}
    for pid, role in pids.items():
        for inode in socket_inodes(pid):
            if inode in by_inode and by_inode[inode] not in out:
                out[by_inode[inode]] = role if role != "trouper-admin" else "thespian-logger"
    return out


def collect(pids: Iterable[int], probe_dir: Path, timeout_s: float = 30.0) -> dict[int, Any]:
    """SIGUSR2 each actor process; its newest report once written."""
    wanted = {}
    for pid in pids:
        seen = len(list(probe_dir.glob(f"{pid}-*.json")))
        try:
            os.kill(pid, signal.SIGUSR2)
            wanted[pid] = seen + 1
        except OSError:
            pass
    deadline = time.monotonic() + timeout_s
    out: dict[int, Any] = {}
    while wanted and time.monotonic() < deadline:
        for pid, seq in list(wanted.items()):
            path = probe_dir / f"{pid}-{seq}.json"
            if path.exists():
                try:
                    out[pid] = json.loads(path.read_text())
                    del wanted[pid]
                except ValueError:
                    pass  # still being written
        time.sleep(0.05)
    return out


def session_pids(port: int, home: Path, session_id: str) -> dict[int, str]:
    """pid -> role of the processes serving one session (its own and the shared ones)."""
    found = session_processes(trouper_tree(port, home), home, session_id)
    return found if found is not None else roles(trouper_tree(port, home))


def actor_pids(port: int, home: Path) -> dict[int, str]:
    return {pid: role for pid, role in roles(trouper_tree(port, home)).items()
            if role in ACTOR_ROLES}


# -- anatomy ----------------------------------------------------------------------------

def anatomy(n: int, steps: int, latency_s: float, workdir: Path) -> dict[str, Any]:
    from trouper.testing import FakeLLMServer

    with FakeLLMServer(echo_script(steps), latency_s=latency_s, keep_bodies=False) as server:
        t, port, probe_dir = open_probed(workdir)
        try:
            sessions = [t.start_session(TASK, llm=llm_config(server),
                                        workspace=workdir / f"ws-{i}", max_iterations=steps + 5)
                        for i in range(n)]
            for s in sessions:
                s.wait(timeout=120 + n * steps * 0.2)
            done_steps = len(chat_requests(server)) - n  # a step ends at the next request
            every = roles(trouper_tree(port, t.home.root))
            outside = {pid: smaps_rollup_kb(pid) for pid in every}
            reports = collect([p for p, r in every.items() if r in ACTOR_ROLES], probe_dir)
            ports = port_roles(every, port)
            kinds = _outside_kinds(every, reports)
        finally:
            t.close()
    return {"mode": "anatomy", "n": n, "steps": steps,
            "latency_ms": latency_s * 1000, "steps_done": done_steps,
            "roles": _roles_summary(every, outside, reports, kinds),
            "hops_per_step": _pairs(reports, ports, None, max(1, done_steps))}


def _mb(kb: float | None) -> float | None:
    return None if kb is None else round(kb / 1024, 2)


def _outside_kinds(every: dict[int, str], reports: dict[int, Any],
                   per_role: int = 20) -> dict[int, dict[str, Any]]:
    """Mappings read from outside for processes with no report (sandbox servers, the
    zygote, shells, the admin): ``per_role`` of each role."""
    taken: Counter[str] = Counter()
    out = {}
    for pid, role in every.items():
        if pid not in reports and taken[role] < per_role:
            taken[role] += 1
            out[pid] = tree_probe.mapping_kinds(pid)
    return out


def _roles_summary(every: dict[int, str], outside: dict[int, dict[str, int]],
                   reports: dict[int, Any], kinds: dict[int, dict[str, Any]]) -> dict[str, Any]:
    by_role: dict[str, list[int]] = defaultdict(list)
    for pid, role in every.items():
        by_role[role].append(pid)
    out = {}
    for role, pids in sorted(by_role.items()):
        rollups = [outside[p] for p in pids if outside.get(p)]

        def med(*keys: str, rollups: list[dict[str, int]] = rollups) -> float | None:
            return _mb(median(sum(r.get(k, 0) for k in keys) for r in rollups))

        row: dict[str, Any] = {
            "processes": len(pids),
            "rss_mb": med("Rss"), "pss_mb": med("Pss"),
            "private_mb": med("Private_Clean", "Private_Dirty"),
            "private_dirty_mb": med("Private_Dirty"),
            "shared_mb": med("Shared_Clean", "Shared_Dirty"),
            "anonymous_mb": med("Anonymous"),
        }
        mine = [reports[p] for p in pids if p in reports]
        if mine:
            row.update(_inside(mine))
        else:  # not an actor (sandbox server, zygote, shell, admin): its mappings from outside
            mine_kinds = [kinds[p] for p in pids if p in kinds]
            names = {k for m in mine_kinds for k in m}
            row["private_mb_by_mapping"] = {
                k: _mb(median(m.get(k, {}).get("private", 0) for m in mine_kinds))
                for k in sorted(names)}
        out[role] = row
    return out


def _inside(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The median process's figures from its own reports."""
    def med(values: Iterable[float | None]) -> float | None:
        return median(v for v in values if v is not None)

    kinds = {k for r in reports for k in r["mappings"]}
    imported: Counter[str] = Counter()
    for r in reports:
        imported.update(r["imported_since_fork"])
    objects: dict[str, list[int]] = defaultdict(list)
    for r in reports:
        for name, count in r["new_objects"]:
            objects[name].append(count)
    stages = {}
    for stage in ("fork", "init", "now"):
        snaps = [r[stage] for r in reports if r.get(stage)]
        stages[stage] = {"private_mb": _mb(med(s["private_kb"] for s in snaps)),
                         "minflt": med(s["minflt"] for s in snaps),
                         "cpu_ms": med(s["cpu_s"] * 1000 for s in snaps),
                         "pymalloc_blocks": med(s["blocks"] for s in snaps),
                         "modules": med(s["modules"] for s in snaps)}
    return {
        "private_mb_by_mapping": {k: _mb(med(r["mappings"].get(k, {}).get("private", 0)
                                              for r in reports)) for k in sorted(kinds)},
        "stages": stages,
        "imported_since_fork": {"median_count": med(len(r["imported_since_fork"])
                                                    for r in reports),
                                "most_common": imported.most_common(60)},
        "new_objects_median_total": med(r["new_objects_total"] for r in reports),
        "new_objects": sorted(((name, median(c)) for name, c in objects.items()),
                              key=lambda kv: -(kv[1] or 0))[:25],
        "threads": Counter(name.split("-")[0].split("_")[0] for r in reports
                           for name in r["threads"]).most_common(8),
        "threads_median": med(len(r["threads"]) for r in reports),
        "pymalloc": {key: med(r["pymalloc"].get(key) for r in reports)
                     for key in reports[0]["pymalloc"]},
    }


def _pairs(now: dict[int, Any], ports: dict[int, str], before: dict[int, Any] | None,
           steps: int) -> dict[str, Any]:
    """Frames per step by (sender role -> receiver role, type), from the senders' and the
    receivers' counts (``before``: reports to subtract, by pid)."""
    sent: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0])
    received: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0])
    acks: Counter[str] = Counter()
    for pid, report in now.items():
        me = report["comm"]
        old = (before or {}).get(pid, {"sent": [], "received": []})
        for side, table, peer_first in (("sent", sent, False), ("received", received, True)):
            was = {(p, k): row for p, k, *row in old[side]}
            for port, kind, *row in report[side]:
                base = was.get((port, kind), [0, 0, 0.0, 0.0])
                diff = [a - b for a, b in zip(row, base, strict=True)]
                if kind == "ack":
                    acks[me] += int(diff[0])
                    continue
                peer = ports.get(port, "program or gone") if port else "?"
                key = (peer, me, kind) if peer_first else (me, peer, kind)
                for i, value in enumerate(diff):
                    table[key][i] += value
    rows = []
    for key in sorted(set(sent) | set(received), key=lambda k: -(sent.get(k) or
                                                               received.get(k) or [0])[0]):
        s, r = sent.get(key), received.get(key)
        count = (s or r)[0]  # type: ignore[index]
        if count == 0:
            continue
        rows.append({
            "from": key[0], "to": key[1], "kind": key[2],
            "per_step": round(count / steps, 3),
            "bytes": int((s or r)[1] / count),  # type: ignore[index]
            "send_us": round(s[2] / s[0] * 1e6, 1) if s and s[0] else None,
            "send_mac_us": round(s[3] / s[0] * 1e6, 1) if s and s[0] else None,
            "receive_us": round(r[2] / r[0] * 1e6, 1) if r and r[0] else None,
            "receive_mac_us": round(r[3] / r[0] * 1e6, 1) if r and r[0] else None,
        })
    return {"steps": steps, "frames": rows,
            "acks_received_per_step": {k: round(v / steps, 3) for k, v in acks.items()}}


# -- hops -------------------------------------------------------------------------------

def hops(k: int, workdir: Path) -> dict[str, Any]:
    from trouper.testing import FakeLLMServer

    with FakeLLMServer(echo_script(k)) as server:
        t, port, probe_dir = open_probed(workdir)
        try:
            session = t.start_session(TASK, llm=llm_config(server), workspace=workdir / "ws",
                                      max_iterations=k + 5)
            if not wait_until(lambda: len(chat_requests(server)) >= 2, 60.0):
                raise TimeoutError("the session did not start")
            every = session_pids(port, t.home.root, session.id)
            pids = {p: r for p, r in every.items() if r in ACTOR_ROLES}
            before = collect(pids, probe_dir)
            # CPU from /proc, between the two reports (each report's own cost left out)
            cpu_before, first = role_cpu_s(every), len(chat_requests(server))
            wait_until(lambda: len(chat_requests(server)) >= k + 1, 60 + k * 2.0, poll_s=0.005)
            cpu = cpu_delta(cpu_before, role_cpu_s(every))
            steps = len(chat_requests(server)) - first
            after = collect(pids, probe_dir)
            ports = port_roles(roles(trouper_tree(port, t.home.root)), port)
            SAMPLES.mkdir(parents=True, exist_ok=True)
            for sample in probe_dir.glob("sample-*.pickle"):  # for the codec mode
                (SAMPLES / f"{sample.stem}-k{k}.pickle").write_bytes(sample.read_bytes())
            session.wait(timeout=60)
        finally:
            t.close()
    return {"mode": "hops", "k": k, "steps": steps,
            "cpu_ms_per_step": {role: round(s * 1000 / steps, 3) for role, s in cpu.items()},
            "hops_per_step": _pairs(after, ports, before, steps)}


# -- codec ------------------------------------------------------------------------------

SAMPLES = RESULTS_DIR / "tree-samples"
"""One frame of each message type (as the hops mode last saw it sent), for ``codec``."""


def codec(rounds: int = 2000) -> dict[str, Any]:
    """CPU of each way to put a sampled message on the wire and take it off: Thespian's
    pickle of ``(address, message)`` (what trouper sends), the MAC, and JSON instead."""
    import pickle

    from trouper.actors.transport import AuthenticatedCodec

    mac = AuthenticatedCodec(b"k" * 32)

    def per_call_us(fn: Any) -> float:
        fn()
        began = time.thread_time()
        for _ in range(rounds):
            fn()
        return round((time.thread_time() - began) / rounds * 1e6, 2)

    out = {}
    for path in sorted(SAMPLES.glob("sample-*.pickle")):
        payload = path.read_bytes()
        address, msg = pickle.loads(payload)  # noqa: S301 - our own sample
        row: dict[str, Any] = {
            "pickle_bytes": len(payload),
            "pickle_dumps_us": per_call_us(
                lambda a=address, m=msg: pickle.dumps((a, m), pickle.HIGHEST_PROTOCOL)),
            "pickle_loads_us": per_call_us(lambda p=payload: pickle.loads(p)),  # noqa: S301
            "mac_us": per_call_us(lambda p=payload: mac.mac(p)),
            "address_pickle_bytes": len(pickle.dumps(address, pickle.HIGHEST_PROTOCOL)),
            "address_dumps_us": per_call_us(
                lambda a=address: pickle.dumps(a, pickle.HIGHEST_PROTOCOL)),
        }
        try:  # the same message as pydantic's JSON (messages that carry no address)
            as_json = msg.model_dump_json()
            kind = type(msg)
            row.update({
                "json_bytes": len(as_json),
                "json_dumps_us": per_call_us(lambda m=msg: m.model_dump_json()),
                "json_validate_us": per_call_us(lambda j=as_json, k=kind:
                                                k.model_validate_json(j)),
                "message_pickle_dumps_us": per_call_us(
                    lambda m=msg: pickle.dumps(m, pickle.HIGHEST_PROTOCOL)),
            })
        except Exception:  # noqa: BLE001, S110 - not a pydantic message, or one with an address
            pass
        out[path.stem.removeprefix("sample-")] = row
    return {"mode": "codec", "rounds": rounds, "messages": out}


# -- start ------------------------------------------------------------------------------

def minflt(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[7]) if fields else 0


def start(m: int, workdir: Path, profile: bool = False) -> dict[str, Any]:
    from trouper.testing import FakeLLMServer

    # the model answers after 10 minutes: a start and its first request, no step
    with FakeLLMServer(echo_script(1), latency_s=600.0, keep_bodies=False) as server:
        t, port, probe_dir = open_probed(workdir, profile_start=profile)
        try:
            llm = llm_config(server)
            t.start_session(TASK, llm=llm, workspace=workdir / "ws-warm")
            wait_until(lambda: len(chat_requests(server)) >= 1, 60.0)
            home = t.home.root
            old = actor_pids(port, home)
            before_reports = collect(old, probe_dir)
            every = roles(trouper_tree(port, home))
            cpu_before = role_cpu_s(every)
            faults_before = {p: minflt(p) for p in every}
            calls = []
            for i in range(m):
                called = time.time()
                t.start_session(TASK, llm=llm, workspace=workdir / f"ws-{i}")
                calls.append(called)
                wait_until(lambda i=i: len(chat_requests(server)) >= i + 2, 60.0)
            firsts = sorted(r.time_s for r in chat_requests(server))[1:]
            every_after = roles(trouper_tree(port, home))
            cpu = cpu_delta(cpu_before, role_cpu_s(every_after))
            faults: dict[str, int] = defaultdict(int)
            for pid, role in every_after.items():
                faults[role] += minflt(pid) - faults_before.get(pid, 0)
            now_pids = actor_pids(port, home)
            after_reports = collect(now_pids, probe_dir)
            ports = port_roles(every_after, port)
            clock = time.time() - time.monotonic()
        finally:
            t.close()
    new = {p: r for p, r in after_reports.items() if p not in old}
    forks: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for pid, report in after_reports.items():  # forks made during the starts, by parent
        was = before_reports.get(pid, {}).get("forks") or [0, 0.0, 0.0]
        for i, value in enumerate(report.get("forks") or [0, 0.0, 0.0]):
            forks[report["comm"]][i] += value - was[i]
    return {
        "mode": "start", "m": m,
        "cpu_ms_per_start": {role: round(s * 1000 / m, 2) for role, s in cpu.items()},
        "cpu_ms_per_start_total": round(sum(cpu.values()) * 1000 / m, 2),
        "minor_faults_per_start": {role: round(f / m) for role, f in faults.items()},
        "new_processes": _new_processes(new),
        "forks_per_start": {role: {"forks": round(n / m, 2),
                                   "parent_cpu_ms_each": round(cpu * 1000 / n, 3) if n else None,
                                   "parent_wall_ms_each": round(wall * 1000 / n, 3) if n else None}
                            for role, (n, cpu, wall) in forks.items() if n},
        "child_start_profile": _start_profiles(new),
        "timeline_ms": _timeline(new, calls, firsts, clock),
        "frames_per_start": _pairs(after_reports, ports, before_reports, m),
    }


def _new_processes(new: dict[int, Any]) -> dict[str, Any]:
    """Per role of the processes a start made: the median one's CPU, faults and private
    MB from its fork to its actor object (Thespian's child start) and on to now."""
    by_role: dict[str, list[Any]] = defaultdict(list)
    for report in new.values():
        by_role[report["comm"]].append(report)
    out = {}
    for role, reports in by_role.items():
        def med(stage: str, key: str, scale: float = 1.0,
                reports: list[Any] = reports) -> float | None:
            value = median(r[stage][key] for r in reports if r.get(stage))
            return None if value is None else round(value * scale, 2)

        out[role] = {
            "processes": len(reports),
            "fork_to_actor": {"cpu_ms": med("init", "cpu_s", 1000),
                              "minflt": med("init", "minflt"),
                              "private_mb": med("init", "private_kb", 1 / 1024)},
            "at_fork": {"minflt": med("fork", "minflt"),
                        "private_mb": med("fork", "private_kb", 1 / 1024)},
            "until_now": {"cpu_ms": med("now", "cpu_s", 1000), "minflt": med("now", "minflt"),
                          "private_mb": med("now", "private_kb", 1 / 1024)},
        }
    return out


def _start_profiles(new: dict[int, Any]) -> dict[str, Any]:
    """Per role, one new process's cProfile from fork to actor object, and the private
    kB by kind of mapping at both ends (with ``--profile``)."""
    out: dict[str, Any] = {}
    for report in new.values():
        role = report["comm"]
        if role not in out and report.get("start_profile"):
            out[role] = {"top_own_ms": report["start_profile"],
                         "mappings_at": report.get("mappings_at")}
    return out


def _timeline(new: dict[int, Any], calls: list[float], firsts: list[float],
              clock: float) -> dict[str, Any]:
    """Median ms from ``start_session()`` to each role's fork and actor object, and to
    the first model request (each start matched to the processes forked after it)."""
    marks: dict[str, list[float]] = defaultdict(list)
    for i, called in enumerate(calls):
        until = calls[i + 1] if i + 1 < len(calls) else float("inf")
        for report in new.values():
            forked = report["fork"]["t"] + clock
            if called <= forked < until:
                marks[f"{report['comm']} forked"].append((forked - called) * 1000)
                if report.get("init"):
                    marks[f"{report['comm']} actor made"].append(
                        (report["init"]["t"] + clock - called) * 1000)
        if i < len(firsts):
            marks["first model request"].append((firsts[i] - called) * 1000)
    return {name: round(median(values) or 0, 2)
            for name, values in sorted(marks.items(), key=lambda kv: median(kv[1]) or 0)}


# -- main -------------------------------------------------------------------------------

def _print(result: dict[str, Any]) -> None:
    """A readable summary; the JSON has everything."""
    head = {k: v for k, v in result.items()
            if k not in ("hops_per_step", "frames_per_start", "roles", "new_processes")}
    print(json.dumps(head, indent=1, default=str))
    for role, row in (result.get("roles") or {}).items():
        print(f"== {role} x{row['processes']}: private {row['private_mb']} MB, shared "
              f"{row['shared_mb']}, PSS {row['pss_mb']}, RSS {row['rss_mb']}")
        if "private_mb_by_mapping" in row:
            print("   private MB by mapping: " + ", ".join(
                f"{k} {v}" for k, v in row["private_mb_by_mapping"].items() if v))
        if "stages" not in row:
            continue
        print("   at fork / actor made / now: " + "; ".join(
            f"{stage} private {x['private_mb']} MB, {x['minflt']} faults, "
            f"{x['cpu_ms'] and round(x['cpu_ms'], 1)} ms CPU, {x['pymalloc_blocks']} blocks, "
            f"{x['modules']} modules" for stage, x in row["stages"].items()))
        made = ", ".join(f"{name.rsplit('.', 1)[-1]} {count}"
                         for name, count in row["new_objects"][:8])
        print(f"   imported since fork: {row['imported_since_fork']['median_count']} "
              f"modules; objects made since the actor froze its heap: "
              f"{row['new_objects_median_total']} ({made}); "
              f"threads {row['threads_median']}; pymalloc {row['pymalloc']}")
    for role, row in (result.get("new_processes") or {}).items():
        print(f"== new {role} x{row['processes']}: {row}")
    table = result.get("hops_per_step") or result.get("frames_per_start")
    if table:
        print(f"frames (per {'start' if 'frames_per_start' in result else 'step'}):")
        for row in table["frames"]:
            print(f"  {row['per_step']:7.3f}  {row['from']:>16} -> {row['to']:<16} "
                  f"{row['kind']:<20} {row['bytes']:>7} B  send {row['send_us']} us "
                  f"(MAC {row['send_mac_us']})  receive {row['receive_us']} us "
                  f"(MAC {row['receive_mac_us']})")
        print("  acks received:", table["acks_received_per_step"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("anatomy", "hops", "start", "codec", "show"))
    parser.add_argument("--file", type=Path, help="show: a result written before")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--k", type=int, default=200)
    parser.add_argument("--m", type=int, default=20)
    parser.add_argument("--profile", action="store_true",
                        help="start: cProfile each new process from its fork to its actor")
    args = parser.parse_args()
    if args.mode == "show":
        _print(json.loads(args.file.read_text()))
        return 0
    with tempfile.TemporaryDirectory(prefix="trouper-tree-") as tmp:
        workdir = Path(tmp)
        if args.mode == "anatomy":
            result = anatomy(args.n, args.steps, args.latency_ms / 1000, workdir)
        elif args.mode == "hops":
            result = hops(args.k, workdir)
        elif args.mode == "codec":
            result = codec()
        else:
            result = start(args.m, workdir, args.profile)
    result["load_average"] = os.getloadavg()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    out = RESULTS_DIR / f"tree-{args.mode}-{stamp}.json"
    out.write_text(json.dumps(result, indent=1, default=str))
    _print(result)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    sys.exit(main())
