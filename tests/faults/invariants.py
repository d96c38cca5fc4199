"""What every fault test asserts once a cluster has converged: no duplicate, no leak,
Slurm matching Docker, every node where its target says. Read from the real engine and
the real slurmctld, never from hp's own records alone."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from conftest import Hp


@dataclass
class Seen:
    problems: list[str]
    nodes: dict[str, str]  # worker node -> container state


def observe(hp: Hp, name: str) -> Seen:
    client = docker.from_env()
    problems: list[str] = []
    cs = client.containers.list(all=True, ignore_removed=True, filters={"label": f"io.hp.cluster={name}"})
    roles: dict[str, list[Any]] = {}
    for c in cs:
        roles.setdefault(c.labels.get("io.hp.role", ""), []).append(c)
    by_node: dict[str, list[Any]] = {}
    for c in roles.get("worker", []) + roles.get("login", []) + roles.get("controller", []):
        by_node.setdefault(c.labels["io.hp.node"], []).append(c)
    problems += [f"duplicate containers for {n}: {[c.name for c in v]}" for n, v in by_node.items() if len(v) > 1]
    doc = hp.json("describe", name)
    targets = {g["InstanceGroupName"].lower(): g["TargetCount"] for g in doc["InstanceGroups"]}
    workers = {c.labels["io.hp.node"]: c for c in roles.get("worker", [])}
    for g, t in targets.items():
        have = sorted(n for n, c in by_node.items() if n.rsplit("-", 1)[0] == g)
        if len(have) != t:
            problems.append(f"group {g}: {len(have)} containers {have}, target {t}")
    problems += [
        f"{c.name} is {c.status}" for c in cs if c.labels.get("io.hp.role") != "check" and c.status != "running"
    ]
    active = [
        r
        for r in (hp.json("health-check", "status", name).get("Request") or {},)
        if r.get("State") in ("Pending", "Running")
    ]
    if roles.get("check") and not active:
        problems.append(f"check containers left: {[c.name for c in roles['check']]}")
    ctl = next(iter(roles.get("controller", [])), None)
    if ctl is None or ctl.status != "running":
        return Seen(problems + ["controller not running"], {})
    r = ctl.exec_run(["scontrol", "show", "nodes", "--json"])
    if r.exit_code != 0:
        return Seen(problems + [f"scontrol: {r.output.decode()[:200]}"], {})
    snodes = {n["name"]: n for n in json.loads(r.output.decode()).get("nodes", [])}
    if set(snodes) != set(workers):
        problems.append(f"Slurm has {sorted(snodes)}, Docker has {sorted(workers)}")
    for n, sn in snodes.items():
        st = set(sn.get("state") or [])
        if st & {"NOT_RESPONDING", "DOWN", "DRAIN", "FAIL"} or "IDLE" not in st:
            problems.append(f"{n} is {sorted(st)} ({sn.get('reason') or ''}) in Slurm")
    views = hp.json("nodes", name)["ClusterNodeSummaries"]
    problems += [
        f"{v['SlurmNodeName']} shows {v['InstanceStatus']}" for v in views if v["InstanceStatus"]["Status"] != "Running"
    ]
    return Seen(problems, {n: c.status for n, c in workers.items()})


def converge(hp: Hp, name: str, timeout: float = 120.0) -> float:
    """Seconds until the cluster satisfies every invariant; AssertionError with what is
    still wrong (and the agent's log) at the timeout."""
    t0 = time.monotonic()
    last: list[str] = []
    while time.monotonic() - t0 < timeout:
        last = observe(hp, name).problems
        if not last:
            return time.monotonic() - t0
        time.sleep(0.5)
    log = hp.home / "clusters" / name / "agent.log"
    tail = log.read_text()[-4000:] if log.exists() else ""
    raise AssertionError(f"{name} did not converge in {timeout:g} s: {last}\nagent log:\n{tail}")


def agent_pid(hp: Hp, name: str) -> int | None:
    f = hp.home / "clusters" / name / "agent.pid"
    try:
        pid = int(f.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def kill_agent(hp: Hp, name: str) -> int | None:
    """SIGKILL the cluster's agent (the next hp command starts a new one)."""
    pid = agent_pid(hp, name)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    return pid


def summary(label: str, times: list[float]) -> str:
    s = sorted(times)
    med = s[len(s) // 2] if s else float("nan")
    return f"{label}: {len(s)} points, convergence median {med:.1f} s, worst {max(s) if s else float('nan'):.1f} s"


def report(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")
