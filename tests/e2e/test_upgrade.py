"""Issue 48 point 4 on real containers: `hp upgrade NAME --slurm 26.05` of a running 24.11
cluster with accounting and NodePackages (controller, login, 2 cpu.nano workers) while jobs run and are
submitted, its agent SIGKILLed mid-upgrade. Every job submitted before, during and after
ends COMPLETED; sacct after it lists the jobs from before; every node and slurmctld say
26.05; the long job finished on its node before that node was replaced; the cluster's
recorded release is 26.05."""

from __future__ import annotations

import calendar
import os
import signal
import subprocess
import threading
import time
from typing import Any

import pytest
from conftest import Hp, small_spec, wait_until, write_spec

FROM, TO = "24.11", "26.05"
SUBMIT_EVERY_S = 2.0


def sh(h: Hp, name: str, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return h("exec", name, "--", "bash", "-c", f"cd ~ && {script}", check=check, timeout=120)


def upgrade_op(h: Hp, name: str) -> dict[str, Any] | None:
    ops = h.json("operations", name)["Operations"]
    return next((o for o in reversed(ops) if o["OperationType"] == "Upgrade"), None)


def events(h: Hp, name: str) -> list[dict[str, Any]]:
    return h.json("events", name, "--limit", "10000")["Events"]


class Submitter(threading.Thread):
    """Short jobs, one every SUBMIT_EVERY_S, from whatever node hp exec reaches; a refused
    submission (the controller restarting, the login node being replaced) is tried again."""

    def __init__(self, h: Hp, name: str):
        super().__init__(daemon=True)
        self.h, self.name = h, name
        self.stop = threading.Event()
        self.jobs: list[int] = []
        self.refused = 0

    def run(self) -> None:
        while not self.stop.is_set():
            r = sh(self.h, self.name, 'sbatch --parsable -o /dev/null --wrap "sleep 1"', check=False)
            if r.returncode == 0 and r.stdout.strip().isdigit():
                self.jobs.append(int(r.stdout.strip()))
                self.stop.wait(SUBMIT_EVERY_S)
            else:
                self.refused += 1
                self.stop.wait(1.0)


def test_upgrade_under_load_with_agent_killed(hp: Hp) -> None:
    for release in (FROM, TO):  # both releases' images (a no-op when built)
        hp("images", "build", "--slurm", release, check=True, timeout=1800)
    name = hp.name("hu")
    spec = write_spec(
        hp.home / "spec.json",
        small_spec(name, [("cpu", "cpu.nano", 2)], Accounting={"Enabled": True}, NodePackages=["jq"]),
    )
    hp("create", "-f", str(spec), "--slurm", FROM, "--timeout", "300", check=True)

    # bad input: refused, exit 2, every problem named, nothing changed
    r = hp("upgrade", name, "--slurm", "23.02", "--batch-size", "0")
    assert r.returncode == 2 and "23.02" in r.stderr and "--batch-size" in r.stderr, r.stderr
    r = hp("upgrade", name, "--slurm", FROM)
    assert r.returncode == 2 and "already runs" in r.stderr, r.stderr
    assert upgrade_op(hp, name) is None

    long_job = int(sh(hp, name, 'sbatch --parsable -w cpu-1 -o /dev/null --wrap "sleep 40"').stdout.strip())
    loop = Submitter(hp, name)
    loop.start()
    wait_until(lambda: len(loop.jobs) >= 3, 60, "jobs submitted before the upgrade")
    before = list(loop.jobs) + [long_job]

    t0 = time.monotonic()
    doc = hp.json("upgrade", name, "--slurm", TO, "--batch-size", "1")
    assert doc["Status"] == "InProgress" and (doc["From"], doc["To"]) == (FROM, TO), doc
    # the agent SIGKILLed once the controller runs the new release, mid-upgrade; any hp command restarts it
    wait_until(
        lambda: any(f"runs Slurm {TO}" in e["Description"] for e in events(hp, name)), 400, "the controller upgraded"
    )
    pid = int((hp.home / "clusters" / name / "agent.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic() - t0
    hp("describe", name, check=True)
    op = wait_until(
        lambda: (o := upgrade_op(hp, name)) is not None and o["Status"] != "InProgress" and o, 600, "the upgrade's end"
    )
    took = time.monotonic() - t0
    assert op["Status"] == "Done", op
    time.sleep(6)  # jobs after it
    loop.stop.set()
    loop.join(130)
    print(
        f"upgrade {FROM} -> {TO}: {took:.1f} s (agent killed at {killed_at:.1f} s); {loop.refused} submissions refused"
    )

    jobs = sorted(set(before + loop.jobs))
    assert len(jobs) >= 8, jobs

    def ended() -> list[str] | None:
        out = sh(hp, name, f"sacct -n -X -P -j {','.join(map(str, jobs))} -o JobID,State,Submit,Start,End,NodeList")
        rows = [line.split("|") for line in out.stdout.split()]
        done = {int(r[0]): r for r in rows if r[0].isdigit() and r[1] not in ("PENDING", "RUNNING", "COMPLETING")}
        return [done[j] for j in jobs] if set(done) >= set(jobs) else None

    rows = wait_until(ended, 180, "every job's end in sacct")
    assert [r[1] for r in rows] == ["COMPLETED"] * len(rows), rows  # before, during and after; sacct kept them
    waits = [_t(r[3]) - _t(r[2]) for r in rows]
    print(f"longest wait of a queued job: {max(waits):.0f} s")

    # every node and the controller on the new release; the cluster's recorded release too
    nodes = sh(hp, name, "scontrol show nodes | grep -o 'Version=[0-9.]*'").stdout.split()
    assert nodes and all(v.startswith(f"Version={TO}.") for v in nodes), nodes
    ctld = subprocess.run(
        ["docker", "exec", f"hp-{name}-controller-1", "slurmctld", "-V"], capture_output=True, text=True, check=True
    )
    assert ctld.stdout.startswith(f"slurm-wlm {TO}."), ctld.stdout
    login = subprocess.run(  # sackd and the client commands of the login node
        ["docker", "exec", f"hp-{name}-login-1", "dpkg-query", "-W", "-f", "${Version}\n", "sackd", "slurm-client"],
        capture_output=True,
        text=True,
    )
    assert login.returncode == 0, login.stderr
    assert [v.split(".")[:2] for v in login.stdout.split()] == [TO.split(".")] * 2, login.stdout
    assert hp.json("describe", name)["SlurmVersion"] == TO
    # its NodePackages, built on the new release before any node was touched, on every node
    assert sh(hp, name, "srun -N2 jq -n 1+1").stdout.split() == ["2", "2"]
    assert sh(hp, name, "jq -n 2+2").stdout.strip() == "4"  # the login node

    # the long job ended on cpu-1 before cpu-1 was replaced
    long_row = next(r for r in rows if int(r[0]) == long_job)
    assert long_row[5] == "cpu-1", long_row
    replaced = [
        e for e in events(hp, name) if e.get("SlurmNodeName") == "cpu-1" and "is being replaced" in e["Description"]
    ]
    assert replaced, "cpu-1 was never replaced"
    assert _t(long_row[4]) <= _iso(replaced[-1]["EventTime"]), (long_row, replaced[-1])


class Killer(threading.Thread):
    """The fault: every start of a container named `container` on release `release`'s image
    (a new one, or one restarted by a reboot) is answered by `docker kill`, from Docker's
    event stream: at once, however loaded the machine (a `docker ps` poll every 0.1 s was
    seconds late under the suite's load, and a replacement came up before its kill)."""

    def __init__(self, container: str, release: str):
        super().__init__(daemon=True)
        self.container, self.release = container, release
        self.stop = threading.Event()
        self.killed: list[str] = []  # each container once, however often it was killed
        self.events = subprocess.Popen(
            ["docker", "events", "--filter", "type=container", "--filter", "event=start",
             "--filter", f"container={container}", "--format", "{{.ID}} {{.From}} {{.Actor.Attributes.name}}"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run(self) -> None:
        assert self.events.stdout is not None
        for line in self.events.stdout:
            cid, image, name = line.split()
            if self.stop.is_set():
                return
            if name == self.container and image.rsplit(":", 1)[-1].startswith(f"{self.release}-"):
                subprocess.run(["docker", "kill", cid], capture_output=True)
                if cid[:12] not in self.killed:
                    self.killed.append(cid[:12])

    def join(self, timeout: float | None = None) -> None:
        self.stop.set()
        self.events.terminate()
        super().join(timeout)


def test_a_node_that_cannot_come_back_is_retried_then_reported(hp: Hp) -> None:
    """Issue 48 point 4 with a real fault: cpu-2's every container on 26.05 is killed as soon
    as it runs. The upgrade tries it MAX_TRIES times (a Warning naming the node and the try
    each), then ends Failed naming it; cpu-3, drained by the upgrade while a job ran on it,
    is resumed (its job untouched, still on 24.11); once the fault stops, the agent's
    provisioning brings cpu-2 back on the release the cluster runs (24.11: the upgrade
    failed, its SlurmVersion unchanged) and jobs run on every worker."""
    for release in (FROM, TO):  # a no-op when built
        hp("images", "build", "--slurm", release, check=True, timeout=1800)
    name = hp.name("rbf")
    spec = write_spec(hp.home / "spec.json", small_spec(name, [("cpu", "cpu.nano", 3)]))
    hp("create", "-f", str(spec), "--slurm", FROM, "--timeout", "300", check=True)
    held = int(sh(hp, name, 'sbatch --parsable -w cpu-3 -o /dev/null --wrap "sleep 300"').stdout.strip())
    wait_until(lambda: "RUNNING" in sh(hp, name, f"squeue -h -j {held} -o %T").stdout, 30, "cpu-3's job running")
    killer = Killer(f"hp-{name}-cpu-2", TO)
    killer.start()
    t0 = time.monotonic()
    try:
        hp("upgrade", name, "--slurm", TO, "--batch-size", "2", check=True)
        op = wait_until(
            lambda: (o := upgrade_op(hp, name)) is not None and o["Status"] != "InProgress" and o, 180, "the end"
        )
    finally:
        killer.stop.set()
        killer.join(10)
    failed_after = time.monotonic() - t0
    cpu2 = [
        f"{e['EventTime']} {e['EventLevel']} {e['Description']}"
        for e in events(hp, name)
        if e["SlurmNodeName"] == "cpu-2"
    ]
    print("\n".join(cpu2), f"\nkilled: {killer.killed}")
    assert op["Status"] == "Failed" and "cpu-2" in op["Message"], op
    warned = [e["Description"] for e in events(hp, name) if e["EventLevel"] == "Warning"]
    for n in range(1, 3):  # MAX_TRIES = 3: two Warnings, then the Error that ends it
        assert any("cpu-2" in d and f"(try {n} of 3)" in d for d in warned), warned
    assert any(
        e["EventLevel"] == "Error" and "cpu-2" in e["Description"] and "(3 tries)" in e["Description"]
        for e in events(hp, name)
    )
    assert len(killer.killed) >= 3, killer.killed
    # cpu-3, drained by the upgrade while its job ran, is back in service with its job, on 24.11
    drained = sh(hp, name, "sinfo -h -N -R -o '%N %E'").stdout
    assert "upgrading" not in drained, drained
    state = sh(hp, name, f"squeue -h -j {held} -o %T").stdout
    if "RUNNING" not in state:  # why, in the failure's own lines (once seen PENDING, not reproduced)
        job = sh(hp, name, f"scontrol show job {held}").stdout
        said = [
            f"{e['EventTime']} {e['EventLevel']} {e.get('SlurmNodeName')} {e['Description']}" for e in events(hp, name)
        ]
        raise AssertionError(f"cpu-3's job {state.strip()}:\n{job}\n" + "\n".join(said[-25:]))
    image = subprocess.run(
        ["docker", "inspect", "-f", "{{.Config.Image}}", f"hp-{name}-cpu-3"], capture_output=True, text=True
    )
    assert f":{FROM}-" in image.stdout, image.stdout
    sh(hp, name, f"scancel {held}")

    # the fault stopped: the agent launches cpu-2 again, on the cluster's release (24.11)
    def back() -> bool:
        r = sh(hp, name, "sinfo -h -N -p cpu -o '%N %t'", check=False)
        return r.returncode == 0 and dict(line.split() for line in r.stdout.splitlines()).get("cpu-2") == "idle"

    wait_until(back, 60, "cpu-2 idle again")
    image = subprocess.run(
        ["docker", "inspect", "-f", "{{.Config.Image}}", f"hp-{name}-cpu-2"], capture_output=True, text=True
    )
    assert f":{FROM}-" in image.stdout, image.stdout
    ran = sh(hp, name, "srun -p cpu -N3 hostname").stdout.split()
    assert sorted(ran) == ["cpu-1", "cpu-2", "cpu-3"], ran
    assert hp.json("describe", name)["SlurmVersion"] == FROM
    print(f"upgrade Failed {failed_after:.1f} s after hp upgrade; cpu-2 killed {len(killer.killed)} times")


def _t(s: str) -> float:
    """sacct's time (the containers run UTC) in seconds."""
    return float(calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%S")))


def _iso(s: str) -> float:
    return _t(s[:19])


pytestmark = pytest.mark.xdist_group("upgrade")
