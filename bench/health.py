"""Time a 5-second InstanceStress on 1 node and on 8 nodes and print the overhead over
two floors: the least time the host's cores allow for 8 such checks (8 x 5 s of CPU at
each node's CPU limit, spread over the host's cores; 5 s at least), and the same
stress-ng command run in 8 plain containers (docker-py, the check image, the node
type's limits) at once, with no hp at all.
Nodes are bench.tiny (bench/common.py: 0.02 CPU, 128 MiB), so 8 fit a small host.

GPU section, only where hp's discovery finds GPUs on the Docker host: a cluster with
one node of <model>.1x per GPU, the time of the GPU check (InstanceStress) per node and
its parts (the check program's own timings: software, counters, compute, nccl), and
the passive GPU monitor's CPU per node while idle (its container's CPU time over 60 s;
target < 0.5% of a core), and the agent's CPU while it follows the monitors.
Run: cd bench && ../.venv/bin/python health.py [--gpu-only] [--write-docs]
(creates and deletes hcb-*; private HP_HOME)"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import benchdocs
import docker
from common import bench_env, hp, spec_doc, timestamp, write_json

from orchestrator.docker.engine import DockerEngine as DockerProvider
from orchestrator.docker.images import CHECK_IMAGES, Images
from orchestrator.health.tools.stress import StressOptions, stress_command
from orchestrator.releases import DEFAULT

SECONDS = 5
N = 8
TINY_CPUS = 0.02  # bench.tiny's CpuLimit (common.BENCH_TYPES)
TINY_MIB = 128


def plain_floor(n: int) -> float:
    """Seconds for n plain containers (check image, bench.tiny limits) to run hp's
    stress-ng command at once and exit: what the checks cost without hp."""
    image = Images(DockerProvider(), DEFAULT).refs(CHECK_IMAGES)["check-cpu"]
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


def stress_spans(doc: dict) -> float:
    """Seconds from the first check's start to the last one's end (hp's own records)."""
    cs = [c for g in doc["InstanceGroups"] for n in g["Nodes"] for c in n["Checks"]]
    return max(timestamp(c["EndTime"]) for c in cs) - min(timestamp(c["StartTime"]) for c in cs)


def phases(doc: dict) -> str:
    """Where a request's time went: before the first check (worker start, drain, wait
    idle, check containers), the checks, after them (remove containers, resume)."""
    cs = [c for g in doc["InstanceGroups"] for n in g["Nodes"] for c in n["Checks"]]
    first, last = min(timestamp(c["StartTime"]) for c in cs), max(timestamp(c["EndTime"]) for c in cs)
    return (
        f"before checks {first - timestamp(doc['CreationTime']):.1f} s, checks {last - first:.1f} s, "
        f"after {timestamp(doc['EndTime']) - last:.1f} s"
    )


def container_cpu_seconds(client, name: str) -> float:
    st = client.api.stats(name, stream=False)
    return st["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gpu_section(idle_seconds: float = 60.0) -> bool:
    """Only where GPUs are found (see the module's docstring); False when none was."""
    from orchestrator import assembly
    from orchestrator.state.store import Store

    with tempfile.TemporaryDirectory(prefix="hcb-gpu-") as home:
        gpus = assembly.env(Store(Path(home))).gpus(refresh=True)
        if not gpus.gpus:
            print(f"GPU section: skipped: no GPU found on the Docker host ({gpus.why})")
            return False
        model = gpus.gpus[0].model
        n = sum(1 for g in gpus.gpus if g.model == model)
        print(f"GPU section: {gpus.summary()}; {n} node(s) of {model}.1x")
        env = bench_env(home)
        name = f"hcb-gpu-{secrets.token_hex(3)}"
        path = write_json(Path(home) / "spec.json", spec_doc(name, n, itype=f"{model}.1x"))
        try:
            t0 = time.monotonic()
            hp(env, "create", "-f", path, "--timeout", "900")
            print(f"create (GPU check image built if needed): {time.monotonic() - t0:.1f} s")
            t0 = time.monotonic()
            r = hp(
                env,
                "health-check",
                "start",
                name,
                "--check",
                "InstanceStress",
                "--stress-seconds",
                "2",
                "--wait",
                "--json",
                check=False,
            )
            took = time.monotonic() - t0
            doc = json.loads(r.stdout)["Request"]
            print(f"GPU deep check of {n} node(s): request {took:.1f} s; verdicts {doc['Results']}")
            for g in doc["InstanceGroups"]:
                for node in g["Nodes"]:
                    for c in node["Checks"]:
                        f = c["Figures"]
                        parts = ", ".join(
                            f"{k.removeprefix('gpu.seconds.')} {v:.1f} s"
                            for k, v in sorted(f.items())
                            if k.startswith("gpu.seconds.")
                        )
                        span = timestamp(c["EndTime"]) - timestamp(c["StartTime"])
                        print(
                            f"  {node['Node']}: {span:.1f} s in all; GPU check parts: {parts}; "
                            f"gemm {f.get('gpu.gpu0.gemm', 0):.0f} TFLOP/s, hbm {f.get('gpu.gpu0.hbm', 0):.0f} GB/s"
                        )
            client = docker.from_env()
            deadline = time.monotonic() + 120
            mons = []
            while time.monotonic() < deadline and len(mons) < n:
                mons = [
                    c.name
                    for c in client.containers.list(
                        filters={"label": [f"io.hp.cluster={name}", "io.hp.role=gpu-monitor"]}
                    )
                ]
                time.sleep(2)
            if not mons:
                print("GPU monitors: none running after 120 s (see hp events)")
                return True
            time.sleep(10)  # past the monitor's start
            pid = int((Path(home) / "clusters" / name / "agent.pid").read_text())
            before = {m: container_cpu_seconds(client, m) for m in mons}
            agent0, t0 = process_cpu_seconds(pid), time.monotonic()
            time.sleep(idle_seconds)
            dt = time.monotonic() - t0
            for m in mons:
                used = container_cpu_seconds(client, m) - before[m]
                print(f"  monitor {m}: {100 * used / dt:.3f}% of a core while idle (target < 0.5%)")
            print(
                f"  the agent (all its threads, following {len(mons)} monitor(s)): "
                f"{100 * (process_cpu_seconds(pid) - agent0) / dt:.3f}% of a core"
            )
        finally:
            hp(env, "delete", name, check=False)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu-only", action="store_true", help="only the GPU section")
    benchdocs.add_option(ap)
    a = ap.parse_args()
    if not a.gpu_only:
        with benchdocs.section("health", a.write_docs):
            cpu_section()
    with benchdocs.section("health-gpu", a.write_docs) as rec:
        if not gpu_section():
            rec.discard()  # a host without GPUs leaves the figures of one with GPUs in place


def cpu_section() -> None:
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
