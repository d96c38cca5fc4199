"""bench/releases.py: both Slurm releases in one run (issue 48 point 6).

(a) For each release (`--from`, then `--to`): the default cluster (`hp create --name X
--slurm R`: controller, login, 4 cpu.small workers, accounting on), the time from `hp
create` starting until the first `hp exec X -- srun -N4 hostname` has finished
(bench/create.py first_srun), against the same cluster and first job with plain docker-py
on that release's images (bench/common.py first_job_floor), measured in the same run:
`--first-runs` alternated pairs, medians.
(b) `hp upgrade --from -> --to` of the default cluster and of a cluster of `--workers`
cpu.nano workers (cpu.small controller, a cpu.nano login node, accounting on), with a
short job (`sleep 1`) submitted every `--submit-every` s through `hp exec` before, during
and after it: from `hp upgrade` to the operation's end (its StartTime to EndTime in `hp
operations NAME --json`: the last node back), and the longest time a job submitted during
it waited in the queue (sacct Submit -> Start), against the longest wait of the jobs
submitted in the `--before` s before it (the same loop on the same cluster: the floor of
a queued job's wait). The upgrade's seconds are also given per node it replaced and as a
ratio to the new release's first-job floor of (a) (the whole default cluster brought up
once with plain docker-py: an upgrade brings every node up once more).

    .venv/bin/python bench/releases.py [--workers 16] [--batch-size 1] [--write-docs]

Clusters are made under a private HP_HOME and deleted at the end, also on failure.
Images of both releases must be built (`hp images build --slurm R`).
"""

from __future__ import annotations

import argparse
import calendar
import json
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchdocs
from common import bench_env, first_job_floor, hp, timestamp, write_json
from create import first_srun

from orchestrator.cluster.upgrade import jump_problem
from orchestrator.releases import BEFORE_CHOICE, DEFAULT, problem
from orchestrator.spec.model import DEFAULT_SPEC

PREFIX = "rbrel"  # the bench's cluster names


def name(what: str) -> str:
    return f"{PREFIX}{what}-{secrets.token_hex(2)}"


def first_jobs(releases: list[str], runs: int) -> dict[str, float]:
    """(a): per release, `runs` alternated pairs of the floor and a create to the first
    srun (this host drifts by a third within minutes: a pair's two are adjacent); the
    medians, and the median floor per release (returned)."""
    floors = {}
    print("default cluster (accounting on): hp create start to the first srun -N4 finished, per release")
    print(f"{'release':>8} {'floor s':>8} {'hp s':>8} {'ratio':>6}  (medians of {runs}; each pair floor/hp)")
    for r in releases:
        pairs = []
        for i in range(runs):
            with tempfile.TemporaryDirectory() as home:
                if i % 2 == 0:
                    pairs.append((first_job_floor(r), first_srun(home, name("first"), r)[0]))
                else:
                    hp_s = first_srun(home, name("first"), r)[0]
                    pairs.append((first_job_floor(r), hp_s))
        fl, s = statistics.median(f for f, _ in pairs), statistics.median(h for _, h in pairs)
        floors[r] = fl
        each = ", ".join(f"{f:.2f}/{h:.2f}" for f, h in pairs)
        print(f"{r:>8} {fl:>8.2f} {s:>8.2f} {s / fl:>6.2f}  ({each})")
    return floors


class Submitter(threading.Thread):
    """`sbatch --wrap 'sleep 1'` through `hp exec`, one every `every` s; a refused submission
    (slurmctld restarting, the login node being replaced) is tried again after 1 s."""

    def __init__(self, env: dict[str, str], cluster: str, every: float):
        super().__init__(daemon=True)
        self.env, self.cluster, self.every = env, cluster, every
        self.stop = threading.Event()
        self.jobs: list[int] = []
        self.refused = 0

    def run(self) -> None:
        while not self.stop.is_set():
            r = hp(
                self.env,
                "exec",
                self.cluster,
                "--",
                "sbatch",
                "--parsable",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 1",
                check=False,
            )
            if r.returncode == 0 and r.stdout.strip().isdigit():
                self.jobs.append(int(r.stdout.strip()))
                self.stop.wait(self.every)
            else:
                self.refused += 1
                self.stop.wait(1.0)


def sacct_s(s: str) -> float:
    """sacct's time (the containers run UTC) as seconds since the epoch."""
    return float(calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%S")))


def waits(env: dict[str, str], cluster: str, jobs: list[int], timeout: float = 300) -> list[tuple[float, float, str]]:
    """Each job's (submit, wait in the queue, state) from sacct, once every job has ended."""
    deadline = time.monotonic() + timeout
    while True:
        r = hp(env, "exec", cluster, "--", "sacct", "-n", "-X", "-P", "-j", ",".join(map(str, jobs)),
               "-o", "JobID,State,Submit,Start", check=False)  # fmt: skip
        rows = [line.split("|") for line in r.stdout.split()]
        done = {int(x[0]): x for x in rows if x[0].isdigit() and x[1] not in ("PENDING", "RUNNING", "COMPLETING")}
        if set(done) >= set(jobs):
            return [(sacct_s(done[j][2]), sacct_s(done[j][3]) - sacct_s(done[j][2]), done[j][1]) for j in jobs]
        if time.monotonic() > deadline:
            raise SystemExit(
                f"jobs of {cluster} not ended in sacct within {timeout:g} s: {sorted(set(jobs) - set(done))}"
            )
        time.sleep(2)


def upgrade_one(what: str, doc: dict | None, a: argparse.Namespace, floor_s: float) -> None:
    """(b) for one cluster: `doc` a spec (None: the default cluster)."""
    with tempfile.TemporaryDirectory() as home:
        env = bench_env(home)
        cluster = name("up")
        if doc is None:
            hp(env, "create", "--name", cluster, "--slurm", a.from_, "--timeout", "600")
        else:
            spec = write_json(Path(home) / "spec.json", {**doc, "ClusterName": cluster})
            hp(env, "create", "-f", spec, "--slurm", a.from_, "--timeout", "600")
        try:
            loop = Submitter(env, cluster, a.submit_every)
            loop.start()
            time.sleep(a.before)
            t0 = time.time()
            hp(env, "upgrade", cluster, "--slurm", a.to, "--batch-size", str(a.batch_size))
            deadline = time.monotonic() + a.timeout
            while True:
                ops = json.loads(hp(env, "operations", cluster, "--json").stdout)["Operations"]
                op = next((o for o in reversed(ops) if o["OperationType"] == "Upgrade"), None)
                if op is not None and op["Status"] != "InProgress":
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"the upgrade of {cluster} did not end within {a.timeout:g} s")
                time.sleep(1)
            seen = time.time() - t0
            time.sleep(max(a.before / 2, 2 * a.submit_every))  # jobs after it
            loop.stop.set()
            loop.join(120)
            if op["Status"] != "Done":
                raise SystemExit(f"the upgrade of {cluster} ended {op['Status']}: {op.get('Message')}")
            took = timestamp(op["EndTime"]) - timestamp(op["StartTime"])
            nodes = sum(g["InstanceCount"] for g in (doc or DEFAULT_SPEC)["InstanceGroups"])
            rows = waits(env, cluster, loop.jobs)
            before = [w for s, w, _ in rows if s < int(t0)]
            during = [w for s, w, _ in rows if int(t0) <= s <= t0 + took]
            bad = [st for _, _, st in rows if st != "COMPLETED"]
        finally:
            hp(env, "delete", cluster, check=False)
    print(
        f"{what}: upgrade {a.from_} -> {a.to} (--batch-size {a.batch_size}) {took:.1f} s from start to the last "
        f"node back ({nodes} nodes: {took / nodes:.1f} s per node; {took / floor_s:.1f}x the {a.to} first-job floor "
        f"{floor_s:.2f} s; seen ended {seen:.1f} s after hp upgrade started)"
    )
    print(
        f"  longest queued wait of the {len(during)} jobs submitted during it {max(during, default=0):.0f} s, "
        f"of the {len(before)} submitted in the {a.before:g} s before it {max(before, default=0):.0f} s "
        f"(sacct Submit -> Start, whole seconds); {len(rows)} jobs in all, "
        f"{'all COMPLETED' if not bad else f'NOT COMPLETED: {bad}'}; {loop.refused} submissions refused"
    )


def workers_spec(n: int) -> dict:
    """`n` cpu.nano workers, a cpu.nano login node, a cpu.small controller, accounting on."""

    def group(g: str, t: str, count: int, kind: str, **slurm: object) -> dict:
        return {
            "InstanceGroupName": g,
            "InstanceType": t,
            "InstanceCount": count,
            "SlurmConfig": {"NodeType": kind, **slurm},
        }

    return {
        "InstanceGroups": [
            group("controller", "cpu.small", 1, "Controller"),
            group("login", "cpu.nano", 1, "Login"),
            group("cpu", "cpu.nano", n, "Compute", PartitionNames=["cpu"]),
        ],
        "Accounting": {"Enabled": True},
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked: every problem named in one message (exit 2, nothing run)."""
    ap = argparse.ArgumentParser(description="both Slurm releases: first job, and hp upgrade under load")
    ap.add_argument(
        "--from", dest="from_", metavar="RELEASE", default=BEFORE_CHOICE.value, help="the older release (%(default)s)"
    )
    ap.add_argument("--to", metavar="RELEASE", default=DEFAULT.value, help="the release upgraded to (%(default)s)")
    ap.add_argument("--first-runs", type=int, default=3, help="floor/create pairs per release (0: skip)")
    ap.add_argument("--workers", type=int, default=16, help="workers of the second upgraded cluster (0: skip it)")
    ap.add_argument("--batch-size", type=int, default=1, help="hp upgrade --batch-size, at least 1")
    ap.add_argument("--submit-every", type=float, default=2.0, help="seconds between the jobs submitted (> 0)")
    ap.add_argument("--before", type=float, default=20.0, help="seconds of jobs before each upgrade (> 0)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds an upgrade may take (> 0)")
    ap.add_argument("--no-upgrade", action="store_true", help="(a) only")
    benchdocs.add_option(ap)
    a = ap.parse_args(argv)
    problems = [bad for r, opt in ((a.from_, "--from"), (a.to, "--to")) if (bad := problem(r, opt))]
    if not problems and (why := jump_problem(a.from_, a.to)):
        problems.append(f"--from {a.from_} --to {a.to}: {why}")
    problems += [
        f"--{k} must be 0 or more, got {v}" for k, v in (("first-runs", a.first_runs), ("workers", a.workers)) if v < 0
    ]
    if a.batch_size < 1:
        problems.append(f"--batch-size must be 1 or more, got {a.batch_size}")
    problems += [
        f"--{k} must be more than 0, got {v:g}"
        for k, v in (("submit-every", a.submit_every), ("before", a.before), ("timeout", a.timeout))
        if not v > 0
    ]
    if a.no_upgrade and not a.first_runs:
        problems.append("--no-upgrade with --first-runs 0 measures nothing")
    if problems:
        ap.error("; ".join(problems))
    return a


def main() -> None:
    a = parse()
    with benchdocs.section("releases", a.write_docs, "releases: `bench/releases.py` (issue 48 point 6)"):
        floors = first_jobs([a.from_, a.to], a.first_runs) if a.first_runs else {}
        if not a.no_upgrade:
            floor_s = floors.get(a.to) or first_job_floor(a.to)
            upgrade_one("default cluster (4 cpu.small workers, login, accounting)", None, a, floor_s)
            if a.workers:
                upgrade_one(f"{a.workers} cpu.nano workers (login, accounting)", workers_spec(a.workers), a, floor_s)


if __name__ == "__main__":
    sys.exit(main())
