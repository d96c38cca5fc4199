"""Time a 5-second InstanceStress on 1 node and on 8 nodes and print the overhead:
the 8-node time over the least time the host's cores allow for 8 such checks.
Run: HP_HOME=/tmp/hc-bench .venv/bin/python bench/health.py  (creates and deletes hc-bench-*)"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import uuid

HP = [sys.executable, "-m", "orchestrator.cli"]


def hp(*a: str) -> str:
    return subprocess.run([*HP, *a], check=True, capture_output=True, text=True).stdout


def timed_check(name: str, n: int) -> float:
    nodes = [a for i in range(1, n + 1) for a in ("--node", f"cpu-{i}")]
    t0 = time.monotonic()
    hp("health-check", "start", name, *nodes, "--check", "InstanceStress", "--stress-seconds", "5", "--wait", "--json")
    return time.monotonic() - t0


def main() -> None:
    name = f"hc-bench-{uuid.uuid4().hex[:4]}"
    spec = {"ClusterName": name, "InstanceGroups": [
        {"InstanceGroupName": "controller", "InstanceType": "cpu.nano", "InstanceCount": 1, "SlurmConfig": {"NodeType": "Controller"}},
        {"InstanceGroupName": "cpu", "InstanceType": "cpu.nano", "InstanceCount": 8,
         "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["cpu"]}}]}
    path = f"/tmp/{name}.json"
    with open(path, "w") as f:
        json.dump(spec, f)
    try:
        hp("create", "-f", path)
        one = timed_check(name, 1)
        eight = timed_check(name, 8)
        cores = os.cpu_count() or 1
        least = 5.0 * max(1, math.ceil(8 * 0.05 / cores))  # cpu.nano: 0.05 CPU each
        print(f"1 node: {one:.1f} s; 8 nodes: {eight:.1f} s; least for 8 on {cores} cores: {least:.1f} s; "
              f"overhead {eight / least:.2f} (target <= 1.2)")
    finally:
        subprocess.run([*HP, "delete", name], capture_output=True)


if __name__ == "__main__":
    main()
