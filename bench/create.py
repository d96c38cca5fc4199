"""bench/create.py: hp create vs the plain-docker floor, for N = 4, 16, 64 workers.

(a) floor: controller + N workers started straight with docker-py until Slurm reports
N idle nodes; (b) `hp create --wait` of a cluster with N workers (the real CLI, a new
process: imports and all). Prints both and the ratio b/a (target <= 1.25), and the
time from `hp create` starting to the default cluster's first successful `srun`
(target <= 5 s). Images must be built (`make images`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, bench_env, floor, hp, spec_doc, write_json


def hp_create(n: int, home: str) -> float:
    env = bench_env(home)
    name = f"bench{n}"
    spec = write_json(Path(home) / f"{name}.json", spec_doc(name, n))
    t0 = time.monotonic()
    hp(env, "create", "-f", spec)
    dt = time.monotonic() - t0
    hp(env, "delete", name)
    return dt


def first_srun(home: str) -> float:
    env = bench_env(home)
    t0 = time.monotonic()
    hp(env, "create", "--name", "benchdefault")
    while True:
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "exec", "benchdefault", "--", "srun", "-N4", "hostname"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if r.returncode == 0 and len(set(r.stdout.split())) == 4:
            break
        time.sleep(0.1)
    dt = time.monotonic() - t0
    hp(env, "delete", "benchdefault")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4,16,64")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    print(f"{'N':>4} {'floor s':>9} {'hp s':>9} {'ratio':>7}  target <= 1.25")
    worst = 0.0
    for n in [int(x) for x in a.sizes.split(",")]:
        fl, hc = [], []
        for _ in range(a.repeat):
            fl.append(floor(n))
            with tempfile.TemporaryDirectory() as home:
                hc.append(hp_create(n, home))
        f, h = min(fl), min(hc)
        worst = max(worst, h / f)
        print(f"{n:>4} {f:>9.2f} {h:>9.2f} {h / f:>7.2f}", flush=True)
    with tempfile.TemporaryDirectory() as home:
        s = first_srun(home)
    print(f"default cluster: first successful srun -N4 {s:.2f} s after hp create started (target <= 5 s)")
    print(f"worst ratio {worst:.2f}: {'OK' if worst <= 1.25 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
