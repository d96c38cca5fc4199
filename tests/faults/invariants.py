"""What every fault test asserts once a cluster has converged: no duplicate, no leak,
Slurm matching Docker, every node where its target says. Read from the real engine and
the real slurmctld, never from hp's own records alone."""

from __future__ import annotations

import json
import os
import signal
import sys
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


@dataclass
class Box:
    """One container as the engine's list shows it (no inspect: Docker 20.10 makes an
    inspect wait while an exec is stuck starting in a container that froze)."""

    id: str
    name: str
    status: str
    labels: dict[str, str]


def containers(client: Any, cluster: str) -> list[Box]:
    raw = client.api.containers(all=True, filters={"label": f"io.hp.cluster={cluster}"})
    return [Box(c["Id"], c["Names"][0].lstrip("/"), c["State"], c.get("Labels") or {}) for c in raw]


def observe(hp: Hp, name: str) -> Seen:
    client = docker.from_env()
    problems: list[str] = []
    cs = containers(client, name)
    roles: dict[str, list[Any]] = {}
    for c in cs:
        roles.setdefault(c.labels.get("io.hp.role", ""), []).append(c)
    by_node: dict[str, list[Any]] = {}
    for c in roles.get("worker", []) + roles.get("login", []) + roles.get("controller", []):
        by_node.setdefault(c.labels["io.hp.node"], []).append(c)
    problems += [f"duplicate containers for {n}: {[c.name for c in v]}" for n, v in by_node.items() if len(v) > 1]
    targets = _targets(hp, name)
    workers = {c.labels["io.hp.node"]: c for c in roles.get("worker", [])}
    for g, t in targets.items():
        have = sorted(n for n, c in by_node.items() if n.rsplit("-", 1)[0] == g)
        if len(have) != t:
            problems.append(f"group {g}: {len(have)} containers {have}, target {t}")
    problems += [
        f"{c.name} is {c.status}" for c in cs if c.labels.get("io.hp.role") != "check" and c.status != "running"
    ]
    if roles.get("check"):
        req = hp.json("health-check", "status", name).get("Request") or {}
        if req.get("State") not in ("Pending", "Running"):
            problems.append(f"check containers left: {[c.name for c in roles['check']]}")
    ctl = next(iter(roles.get("controller", [])), None)
    if ctl is None or ctl.status != "running":
        return Seen(problems + ["controller not running"], {})
    try:
        ex = client.api.exec_create(ctl.id, ["scontrol", "show", "nodes", "--json"])
        out = client.api.exec_start(ex["Id"])
        code = client.api.exec_inspect(ex["Id"])["ExitCode"]
    except docker.errors.APIError as e:  # paused or stopped since the list
        return Seen(problems + [f"scontrol: {e.explanation}"], {})
    if code != 0:
        return Seen(problems + [f"scontrol: {out.decode()[:200]}"], {})
    try:
        snodes = {n["name"]: n for n in json.loads(out.decode()).get("nodes", [])}
    except ValueError:  # docker-py lost the output's start (docker/docker-py#2042; hp's wire.py does not): look again
        return Seen(problems + [f"scontrol's JSON came back cut: {out[:80]!r}"], {})
    if set(snodes) != set(workers):
        problems.append(f"Slurm has {sorted(snodes)}, Docker has {sorted(workers)}")
    for n, sn in snodes.items():
        st = set(sn.get("state") or [])
        if st & {"NOT_RESPONDING", "DOWN", "DRAIN", "FAIL"} or "IDLE" not in st:
            problems.append(f"{n} is {sorted(st)} ({sn.get('reason') or ''}) in Slurm")
    if problems:  # what the engine and slurmctld say is enough; hp's own view last, once they agree
        return Seen(problems, {n: c.status for n, c in workers.items()})
    views = hp.json("nodes", name)["ClusterNodeSummaries"]
    problems += [
        f"{v['SlurmNodeName']} shows {v['InstanceStatus']}" for v in views if v["InstanceStatus"]["Status"] != "Running"
    ]
    return Seen(problems, {n: c.status for n, c in workers.items()})


def _targets(hp: Hp, name: str) -> dict[str, int]:
    """Each group's target count, from the cluster's spec as hp stores it (read in this
    process: a CLI call per poll kept one of two cores busy and slowed what it waited for)."""
    from orchestrator.state.store import Store

    store = Store(hp.home)
    try:
        row = store.cluster(name)
    finally:
        store.close()
    assert row is not None, f"cluster {name} is gone"
    return {g["InstanceGroupName"].lower(): g["InstanceCount"] for g in row.spec["InstanceGroups"]}


LOOK_EVERY_S = 15.0


def converge(hp: Hp, name: str, timeout: float = 120.0) -> float:
    """Seconds until the cluster satisfies every invariant; AssertionError with what is
    still wrong (and the agent's log) at the timeout."""
    t0 = time.monotonic()
    last: list[str] = []
    looked = -LOOK_EVERY_S
    while time.monotonic() - t0 < timeout:
        t1 = time.monotonic()
        if t1 - looked >= LOOK_EVERY_S:  # as a user would: `hp describe` (it restarts a dead agent)
            looked = t1
            hp("describe", name, "--json")
        t2 = time.monotonic()
        last = observe(hp, name).problems
        if os.environ.get("HP_FAULT_TRACE"):
            took = f"describe {t2 - t1:.1f} s, observe {time.monotonic() - t2:.1f} s"
            print(f"  {time.monotonic() - t0:6.1f} s ({took}) {last}", file=sys.stderr)
        if not last:
            return time.monotonic() - t0
        time.sleep(1.0)
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
