"""bench/create.py: hp create vs the plain-docker floor, for N = 4, 16, 64 workers.

(a) floor: controller + N workers started straight with docker-py until Slurm reports
N idle nodes; (b) `hp create --wait` of a cluster with N workers (the real CLI, a new
process: imports and all). Prints both and the ratio b/a (target <= 1.25), and the
time from `hp create` starting to the default cluster's first successful `srun`
(target <= 5 s). Then the default cluster with and without accounting, in one run
(alternated, --acct-runs times each): the create time each way and what accounting adds
(it must be under 2 s for accounting to be on by default), and the time to the first
`sacct` row: from `hp create` starting to a first job's record, and from a job's last
instruction to its record. With --lifecycle N: a cluster of N workers with and without a
10-line OnCreate script on every node (alternated, --lifecycle-runs times each): what
the script adds to create, against the script's own run time (the slowest node's, as
the script measured it): the rest is hp's cost on the critical path (target: under
0.3 s, the nodes' scripts running in parallel). Images must be built (`make images`).
With --write-docs, each part's figures replace its section of docs/benchmarks.md
(create, create-accounting, create-lifecycle).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchdocs
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


FIRST_SACCT = r"""
cd ~
id=$(sbatch --parsable -o /dev/null --wrap 'date +%s.%N > first-end')
while :; do
  s=$(sacct -n -X -P -j "$id" -o State 2>/dev/null | head -1)
  [ "$s" = COMPLETED ] && break
  sleep 0.02
done
echo "$(cat first-end) $(date +%s.%N)"
"""


def accounting_cost(runs: int) -> None:
    """The default cluster without and with accounting, alternated; medians."""
    times: dict[str, list[float]] = {"--no-accounting": [], "--accounting": []}
    first_row, after_end = [], []
    for i in range(runs):
        for flag in ("--no-accounting", "--accounting") if i % 2 == 0 else ("--accounting", "--no-accounting"):
            with tempfile.TemporaryDirectory() as home:
                env = bench_env(home)
                wall0, t0 = time.time(), time.monotonic()  # the containers' clock is the host's
                hp(env, "create", "--name", "benchacct", flag)
                times[flag].append(time.monotonic() - t0)
                if flag == "--accounting":
                    r = hp(env, "exec", "benchacct", "--", "bash", "-c", FIRST_SACCT)
                    end, seen = (float(x) for x in r.stdout.split()[-2:])
                    first_row.append(seen - wall0)
                    after_end.append(seen - end)
                hp(env, "delete", "benchacct")
    off, on = statistics.median(times["--no-accounting"]), statistics.median(times["--accounting"])
    print(f"default cluster, {runs} run(s) each, medians:")
    print(f"  hp create without accounting {off:.2f} s, with accounting {on:.2f} s: accounting adds {on - off:+.2f} s")
    print(
        f"  (each run, without: {', '.join(f'{x:.2f}' for x in times['--no-accounting'])}; with: "
        f"{', '.join(f'{x:.2f}' for x in times['--accounting'])})"
    )
    print(
        f"  first sacct row {statistics.median(first_row):.2f} s after hp create started "
        f"(a job submitted as soon as create returned)"
    )
    print(f"  a job's row in sacct {statistics.median(after_end) * 1000:.0f} ms after its last instruction")
    print(f"  accounting by default: {'OK' if on - off < 2.0 else 'ABOVE the 2 s budget'} (budget 2 s)")


# 10 lines, the kind of work an ops engineer's OnCreate does: facts read, a user, a tool
ONCREATE = """#!/bin/bash
t0=$(date +%s.%N)
set -eu
. /etc/hp/node.env
mkdir -p /opt/team/bin
printf '#!/bin/sh\\necho team tool on %s\\n' "$HP_NODE" > /opt/team/bin/team-tool
chmod +x /opt/team/bin/team-tool
grep -c '"InstanceName"' /opt/ml/config/resource_config.json > /opt/team/node-count
id alice >/dev/null 2>&1 || useradd -m -u 2001 alice
echo "$t0 $(date +%s.%N)" > /var/tmp/oncreate-time
"""


def lifecycle_cost(n: int, runs: int, cpu_limit: float | None = None) -> None:
    """N workers with and without the OnCreate script, alternated; medians. `cpu_limit`:
    the nodes' CPU share instead of bench.tiny's 0.02 (every fork of the script and of
    the node's entry runs at that share)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    script = []
    for i in range(runs):
        for with_lc in (False, True) if i % 2 == 0 else (True, False):
            with tempfile.TemporaryDirectory() as home:
                env = bench_env(home)
                if cpu_limit is not None:
                    Path(env["HP_INSTANCE_TYPES"]).write_text(
                        f"bench.tiny: {{VCpus: 1, CpuLimit: {cpu_limit}, MemoryMiB: 128}}\n"
                    )
                doc = spec_doc("benchlc", n, login=True)
                if with_lc:
                    d = Path(home) / "lifecycle"
                    d.mkdir()
                    (d / "on_create.sh").write_text(ONCREATE)
                    for g in doc["InstanceGroups"]:
                        if g["SlurmConfig"]["NodeType"] != "Controller":
                            g["LifeCycleConfig"] = {"SourceS3Uri": str(d), "OnCreate": "on_create.sh"}
                spec = write_json(Path(home) / "benchlc.json", doc)
                t0 = time.monotonic()
                hp(env, "create", "-f", spec)
                times[with_lc].append(time.monotonic() - t0)
                if with_lc:
                    own = []
                    for node in ["login-1"] + [f"w-{k}" for k in range(1, n + 1)]:
                        r = hp(env, "exec", "benchlc", "--node", node, "--root", "--", "cat", "/var/tmp/oncreate-time")
                        a, b = (float(x) for x in r.stdout.split())
                        own.append(b - a)
                    script.append(max(own))
                hp(env, "delete", "benchlc")
    off, on, own = (statistics.median(times[False]), statistics.median(times[True]), statistics.median(script))
    cost = on - off - own
    share = f", CpuLimit {cpu_limit}" if cpu_limit is not None else ", CpuLimit 0.02 (bench.tiny)"
    print(f"{n} workers + login{share}, {runs} run(s) each, medians:")
    print(f"  hp create without a lifecycle script {off:.2f} s, with a 10-line OnCreate on every node {on:.2f} s")
    print(f"  the script's own run time (slowest node) {own:.3f} s; hp's cost on the critical path {cost:+.2f} s")
    print(
        f"  (each run, without: {', '.join(f'{x:.2f}' for x in times[False])}; with: "
        f"{', '.join(f'{x:.2f}' for x in times[True])})"
    )
    print(f"  lifecycle overhead: {'OK' if cost < 0.3 else 'ABOVE the 0.3 s target'} (target < 0.3 s)")


def sizes_vs_floor(sizes: list[int], repeat: int) -> None:
    print(f"{'N':>4} {'floor s':>9} {'hp s':>9} {'ratio':>7}  target <= 1.25")
    worst = 0.0
    for n in sizes:
        fl, hc = [], []
        for _ in range(repeat):
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4,16,64", help="worker counts vs the floor ('none': skip)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--acct-runs", type=int, default=3, help="create runs with and without accounting (0: skip)")
    ap.add_argument("--lifecycle", type=int, default=0, help="workers of the OnCreate-script run (0: skip)")
    ap.add_argument("--lifecycle-runs", type=int, default=3)
    ap.add_argument("--lifecycle-cpu", type=float, default=None, help="the nodes' CpuLimit in that run")
    benchdocs.add_option(ap)
    a = ap.parse_args()
    if a.lifecycle:
        with benchdocs.section("create-lifecycle", a.write_docs):
            lifecycle_cost(a.lifecycle, a.lifecycle_runs, a.lifecycle_cpu)
    if a.sizes != "none":
        with benchdocs.section("create", a.write_docs):
            sizes_vs_floor([int(x) for x in a.sizes.split(",")], a.repeat)
    if a.acct_runs:
        with benchdocs.section("create-accounting", a.write_docs):
            accounting_cost(a.acct_runs)


if __name__ == "__main__":
    main()
