"""Time a 5-second InstanceStress on 1 node and on 8 nodes and print the overhead over
two floors: the least time the host's cores allow for 8 such checks (8 x 5 s of CPU at
each node's CPU limit, spread over the host's cores; 5 s at least), and the same
stress-ng command run in 8 plain containers (docker-py, the check image, the node
type's limits) at once, with no hp at all.
Nodes are bench.tiny (bench/common.py: 0.02 CPU, 128 MiB), so 8 fit a small host.
Run: cd bench && ../.venv/bin/python health.py   (creates and deletes hcb-*; private HP_HOME)"""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
from common import bench_env, hp, spec_doc, write_json

from orchestrator.docker.engine import DockerEngine as DockerProvider
from orchestrator.docker.images import CHECK_IMAGES, Images
from orchestrator.health.stress import StressOptions, stress_command

SECONDS = 5
N = 8
TINY_CPUS = 0.02  # bench.tiny's CpuLimit (common.BENCH_TYPES)
TINY_MIB = 128


def plain_floor(n: int) -> float:
    """Seconds for n plain containers (check image, bench.tiny limits) to run hp's
    stress-ng command at once and exit: what the checks cost without hp."""
    image = Images(DockerProvider()).refs(CHECK_IMAGES)["check-cpu"]
    cmd = stress_command(StressOptions(seconds=SECONDS), TINY_CPUS)
    client = docker.from_env()

    def one(i: int) -> None:
        c = client.containers.create(
            image, cmd, nano_cpus=int(TINY_CPUS * 1e9), mem_limit=f"{TINY_MIB}m", labels={"io.hp.bench": "health-floor"}
        )
        try:
            c.start()
            c.wait(timeout=300)
        finally:
            c.remove(force=True)

    t0 = time.monotonic()
    with ThreadPoolExecutor(n) as ex:
        list(ex.map(one, range(n)))
    return time.monotonic() - t0


def kill_to_idle(name: str, node: str = "w-1", timeout: float = 60) -> float:
    """Seconds from `docker kill` of a worker to that node idle in Slurm again, with no
    command: the cluster's agent sees Docker's die event and reboots (or replaces) it."""
    from orchestrator.errors import HpError
    from orchestrator.slurm.client import SlurmCli as Slurm

    p = DockerProvider()
    cname = f"hp-{name}-{node}"
    before = p.inspect(cname).state.started_at
    slurm = Slurm(p, f"hp-{name}-controller-1")
    t0 = time.monotonic()
    p.kill(cname)
    while time.monotonic() - t0 < timeout:
        try:
            again = p.inspect(cname).state.started_at != before
            if again and any(n.name == node and n.usable for n in slurm.nodes()):
                return time.monotonic() - t0
        except HpError:
            pass  # replaced: a moment with no container of that name
        time.sleep(0.05)
    raise SystemExit(f"{node} of {name} did not come back within {timeout:g} s")


def timed_check(env: dict[str, str], name: str, n: int) -> tuple[float, dict]:
    nodes = [a for i in range(1, n + 1) for a in ("--node", f"w-{i}")]
    t0 = time.monotonic()
    r = hp(
        env,
        "health-check",
        "start",
        name,
        *nodes,
        "--check",
        "InstanceStress",
        "--stress-seconds",
        str(SECONDS),
        "--wait",
        "--json",
        check=False,
    )
    took = time.monotonic() - t0
    doc = json.loads(r.stdout)["Request"]
    if r.returncode != 0:
        print(hp(env, "events", name, check=False).stdout[-4000:])
        raise SystemExit(f"check on {n} node(s) did not pass: {doc['Verdicts']}")
    return took, doc


def _t(s: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def stress_spans(doc: dict) -> float:
    """Seconds from the first check's start to the last one's end (hp's own records)."""
    cs = [c for g in doc["InstanceGroups"] for n in g["Nodes"] for c in n["Checks"]]
    return max(_t(c["EndTime"]) for c in cs) - min(_t(c["StartTime"]) for c in cs)


def phases(doc: dict) -> str:
    """Where a request's time went: before the first check (worker start, drain, wait
    idle, check containers), the checks, after them (remove containers, resume)."""
    cs = [c for g in doc["InstanceGroups"] for n in g["Nodes"] for c in n["Checks"]]
    first, last = min(_t(c["StartTime"]) for c in cs), max(_t(c["EndTime"]) for c in cs)
    return (
        f"before checks {first - _t(doc['CreationTime']):.1f} s, checks {last - first:.1f} s, "
        f"after {_t(doc['EndTime']) - last:.1f} s"
    )


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="hcb-") as home:
        env = bench_env(home)
        name = f"hcb-{secrets.token_hex(3)}"
        path = write_json(Path(home) / "spec.json", spec_doc(name, N))
        try:
            hp(env, "create", "-f", path, "--timeout", "300")
            one, d1 = timed_check(env, name, 1)
            eight, d8 = timed_check(env, name, N)
            cores = os.cpu_count() or 1
            least = SECONDS * max(1, math.ceil(N * TINY_CPUS / cores))
            plain1, plain8 = plain_floor(1), plain_floor(N)
            print(f"host cores {cores}; nodes bench.tiny ({TINY_CPUS} CPU); stress-ng {SECONDS} s per node")
            print(f"plain docker, same command and limits: 1 container {plain1:4.1f} s, {N} at once {plain8:4.1f} s")
            print(f"phases, 1 node: {phases(d1)}; {N} nodes: {phases(d8)}")
            print(f"1 node : request {one:5.1f} s (checks ran {stress_spans(d1):4.1f} s)")
            print(
                f"{N} nodes: request {eight:5.1f} s (checks ran {stress_spans(d8):4.1f} s); least for {N} "
                f"on {cores} cores: {least:.1f} s; overhead {eight / least:.2f} (request), "
                f"{stress_spans(d8) / least:.2f} (checks); over plain docker: {eight / plain8:.2f} (request), "
                f"{stress_spans(d8) / plain8:.2f} (checks); target <= 1.2"
            )
            time.sleep(2)
            print(f"docker kill of a worker -> idle in Slurm again: {kill_to_idle(name):.2f} s (target <= 10 s)")
        finally:
            hp(env, "delete", name, check=False)


if __name__ == "__main__":
    main()
