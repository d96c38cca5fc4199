"""Time from `docker kill` of a worker to that node idle in Slurm again, 3 times; prints the median.

    .venv/bin/python bench/recovery.py [--runs 3]

Makes its own cluster (controller + 1 cpu.nano worker) under a private HP_HOME; the
per-cluster agent started by `hp create` runs the recovery watcher. Removes everything
at the end, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.slurm.model import parse_nodes  # noqa: E402


def hp(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout.strip()


def back_idle(name: str, started: str, timeout: float = 60) -> None:
    """Until the worker's container was started again and cpu-1 is idle in Slurm."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if docker("inspect", "-f", "{{.State.StartedAt}}", f"hp-{name}-cpu-1") != started:
            r = subprocess.run(
                ["docker", "exec", f"hp-{name}-controller-1", "scontrol", "show", "nodes", "--json"],
                capture_output=True,
                text=True,
            )
            if r.returncode == 0 and any(n.name == "cpu-1" and n.usable for n in parse_nodes(r.stdout)):
                return
        time.sleep(0.05)
    raise SystemExit(f"cpu-1 of {name} did not come back within {timeout:g} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="hp-bench-recovery-"))
    env = {**os.environ, "HP_HOME": str(home), "NO_COLOR": "1"}
    name = f"rc-bench-{uuid.uuid4().hex[:6]}"
    spec = {
        "ClusterName": name,
        "InstanceGroups": [
            {
                "InstanceGroupName": "controller",
                "InstanceType": "cpu.small",
                "InstanceCount": 1,
                "SlurmConfig": {"NodeType": "Controller"},
            },
            {
                "InstanceGroupName": "cpu",
                "InstanceType": "cpu.nano",
                "InstanceCount": 1,
                "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["cpu"]},
            },
        ],
    }
    (home / "spec.json").write_text(json.dumps(spec))
    try:
        r = hp(env, "create", "-f", str(home / "spec.json"))
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return 1
        time.sleep(2)  # the agent's recovery watcher subscribes to Docker events
        times = []
        for i in range(args.runs):
            started = docker("inspect", "-f", "{{.State.StartedAt}}", f"hp-{name}-cpu-1")
            t0 = time.monotonic()
            docker("kill", f"hp-{name}-cpu-1")
            back_idle(name, started)
            times.append(time.monotonic() - t0)
            print(f"run {i + 1}: docker kill -> idle in Slurm in {times[-1]:.2f} s", flush=True)
            time.sleep(1)
        print(f"median over {len(times)} runs: {statistics.median(times):.2f} s (target <= 10 s)")
        return 0
    finally:
        hp(env, "delete", name)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
