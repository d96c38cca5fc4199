"""bench/continuous.py: a short group costs nothing, and an idle agent costs no CPU.

In one run: the default cluster (continuous mode) plus one group that finds no
capacity for its 3 nodes, against the same cluster without the short group: time from
`hp create` starting to the first successful `srun -N4` (target: ratio <= 1.1). Then
the agent's CPU use while the cluster is idle (with the short group still retrying,
and without), over a window (target < 1% of a core). Also prints the plain-docker
floor of the same run. The idle window is BENCH_IDLE_WINDOW seconds (default 30);
--write-docs writes the figures into docs/benchmarks.md (section continuous).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchdocs
from common import ROOT, bench_env, floor, hp, write_json

sys.path.insert(0, str(ROOT))
from orchestrator.spec.model import DEFAULT_SPEC  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def spec(name: str, short: bool) -> dict:
    doc = {
        **DEFAULT_SPEC,
        "ClusterName": name,
        "NodeProvisioningMode": "Continuous",
        "InstanceGroups": list(DEFAULT_SPEC["InstanceGroups"]),
    }
    if short:
        doc["InstanceGroups"].append(
            {
                "InstanceGroupName": "short",
                "InstanceType": "short.type",
                "InstanceCount": 3,
                "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["short"]},
            }
        )
    return doc


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def run(short: bool, window: float) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as home:
        env = bench_env(home)
        Path(env["HP_INSTANCE_TYPES"]).write_text(
            Path(env["HP_INSTANCE_TYPES"]).read_text() + "short.type: {VCpus: 1, CpuLimit: 0.05, MemoryMiB: 128}\n"
        )
        name = "benchshort" if short else "benchfull"
        f = write_json(Path(home) / "s.json", spec(name, short))
        if short:
            hp(env, "capacity", "set", "short.type", "0")
        t0 = time.monotonic()
        hp(env, "create", "-f", f)
        while True:
            r = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "exec", name, "--", "srun", "-N4", "hostname"],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            if r.returncode == 0 and len(set(r.stdout.split())) == 4:
                break
            time.sleep(0.05)
        first = time.monotonic() - t0
        time.sleep(5)  # let the cluster settle: every node joined, the short group retrying
        pid = int((Path(home) / "clusters" / name / "agent.pid").read_text())
        c0, w0 = cpu_seconds(pid), time.monotonic()
        time.sleep(window)
        idle = (cpu_seconds(pid) - c0) / (time.monotonic() - w0)
        hp(env, "delete", name)
        return first, idle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    benchdocs.add_option(ap)
    a = ap.parse_args()
    with benchdocs.section("continuous", a.write_docs):
        figures(float(os.environ.get("BENCH_IDLE_WINDOW", "30")))


def figures(window: float) -> None:
    fl = floor(4)
    full, idle_full = run(False, window)
    short, idle_short = run(True, window)
    print(f"plain-docker floor, controller + 4 workers idle: {fl:.2f} s")
    print(f"first srun -N4, default cluster:                   {full:.2f} s")
    print(
        f"first srun -N4, default cluster + short group:     {short:.2f} s   ratio {short / full:.2f} (target <= 1.1)"
    )
    print(
        f"agent CPU while idle: {100 * idle_full:.2f}% of a core; with a group retrying on no capacity: "
        f"{100 * idle_short:.2f}% (target < 1%)"
    )


if __name__ == "__main__":
    main()
