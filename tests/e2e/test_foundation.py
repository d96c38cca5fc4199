"""Issue 2: the default cluster, jobs across its nodes, honest status, clean delete."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from orchestrator.core.agentlock import holder
from orchestrator.docker.engine import DockerEngine as DockerProvider
from tests.conftest import ROOT, small_spec, write_spec


def leftovers(name: str) -> tuple[list, list, list]:
    p = DockerProvider()
    return p.containers(name), p.networks(name), p.volumes(name)


@pytest.mark.releases
def test_default_cluster_end_to_end(hp, tmp_path):
    name = hp.name("found")
    r = hp("create", "--name", name, "--json", check=True)
    doc = json.loads(r.stdout)
    assert doc["ClusterStatus"] == "InService"
    assert {g["InstanceGroupName"]: g["CurrentCount"] for g in doc["InstanceGroups"]} == {
        "controller": 1,
        "login": 1,
        "cpu-a": 2,
        "cpu-b": 2,
    }

    # srun across the four compute nodes from the login node
    r = hp("exec", name, "--", "srun", "-N4", "hostname", check=True)
    hosts = r.stdout.split()
    assert len(hosts) == 4 and len(set(hosts)) == 4, r.stdout

    # an sbatch --wait job in one group's partition, as the default user; output read on the login node
    script = "#!/bin/bash\n#SBATCH -p cpu-b -N2 -o job-%j.out\nsrun bash -c 'echo $(hostname) $(id -un)'\n"
    r = hp(
        "exec",
        name,
        "--",
        "bash",
        "-c",
        f"cat > job.sh <<'EOF'\n{script}EOF\nsbatch --parsable --wait job.sh",
        check=True,
    )
    job = r.stdout.strip().splitlines()[-1]
    r = hp("exec", name, "--", "cat", f"job-{job}.out", check=True)
    lines = sorted(r.stdout.split("\n"))
    lines = [l for l in lines if l]
    assert lines == ["cpu-b-1 hpuser", "cpu-b-2 hpuser"], r.stdout
    assert hp("exec", name, "--", "id", "-u", check=True).stdout.strip() == "1000"
    assert hp("exec", name, "--root", "--", "id", "-u", check=True).stdout.strip() == "0"
    assert hp("exec", name, "--", "sh", "-c", "exit 7").returncode == 7

    quick_and_full_exec_alike(hp, name)

    nodes = hp.json("nodes", name)["ClusterNodeSummaries"]
    assert len(nodes) == 6
    assert all(n["InstanceStatus"]["Status"] == "Running" for n in nodes), nodes
    workers = [n for n in nodes if n["NodeRole"] == "worker"]
    assert len(workers) == 4 and all(n["SlurmState"] == "idle" for n in workers), workers
    assert all(n["NodeId"].startswith("i-") and n["LaunchTime"] for n in nodes)
    assert {n["SlurmNodeName"] for n in hp.json("nodes", name, "--group", "cpu-a")["ClusterNodeSummaries"]} == {
        "cpu-a-1",
        "cpu-a-2",
    }
    assert name in [c["ClusterName"] for c in hp.json("list")["ClusterSummaries"]]

    # the auth key never leaves hp's private state
    key = hp.home / "clusters" / name / "slurm.key"
    assert oct(key.stat().st_mode & 0o777) == "0o600"

    # a second create with the same name fails clearly and touches nothing
    before = {c.id for c in leftovers(name)[0]}
    r = hp("create", "--name", name)
    assert r.returncode == 2 and "already exists" in r.stderr
    assert {c.id for c in leftovers(name)[0]} == before

    r = hp("delete", name, check=True)
    assert leftovers(name) == ([], [], [])
    r = hp("delete", name)
    assert r.returncode == 2 and "does not exist" in r.stderr  # a name that is not a cluster: bad input


def loaded(hp, *args: str) -> tuple[int, str, set[str]]:
    """`hp ARGS` with Python's import trace: (exit code, stdout, the modules it imported)."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "orchestrator.cli", *args],
        env=hp.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.returncode, r.stdout, set(re.findall(r"^import time:.*\|\s*([\w.]+)$", r.stderr, re.M))


def quick_and_full_exec_alike(hp, name: str) -> None:
    """`hp exec NAME -- CMD` goes the quick way (cli/quick.py: no typer, no docker-py); the
    same command without `--`, which only typer reads, goes the full way: the same run.
    With the agent killed, the full way runs it and starts the agent again."""
    rc, quick_out, quick_mods = loaded(hp, "exec", name, "--", "env")
    assert rc == 0 and "typer" not in quick_mods and "docker" not in quick_mods, sorted(quick_mods)
    rc, full_out, full_mods = loaded(hp, "exec", name, "env")
    assert rc == 0 and "typer" in full_mods and "docker" not in full_mods  # execs and listings: wire.py
    assert sorted(quick_out.splitlines()) == sorted(full_out.splitlines())
    assert "USER=hpuser" in quick_out.splitlines() and "HOME=/home/hpuser" in quick_out.splitlines()
    for opts, cmd in ((["--node", "cpu-a-1"], "hostname"), (["--root"], "id")):
        quick = hp("exec", name, *opts, "--", cmd, check=True).stdout
        assert quick == hp("exec", name, *opts, cmd, check=True).stdout and quick.strip()
    r = hp("exec", name, "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 5")
    assert (r.returncode, r.stdout, r.stderr) == (5, "to-out\n", "to-err\n")
    pid = holder(hp.home, name)
    assert pid and pid > 0
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while holder(hp.home, name) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    rc, out, mods = loaded(hp, "exec", name, "--", "hostname")
    assert rc == 0 and out.strip() == "login-1" and "typer" in mods  # no agent: the full way
    deadline = time.monotonic() + 10  # which started one: it takes the lock as it starts
    while not (again := holder(hp.home, name)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert again and again != pid
    assert "typer" not in loaded(hp, "exec", name, "--", "true")[2]  # and the next goes the quick way


def test_invalid_spec_creates_nothing(hp, tmp_path):
    name = hp.name("bad")
    doc = {
        "ClusterName": name,
        "Unknown": 1,
        "InstanceGroups": [
            {
                "InstanceGroupName": "l1",
                "InstanceType": "cpu.small",
                "InstanceCount": 1,
                "SlurmConfig": {"NodeType": "Login"},
            },
            {
                "InstanceGroupName": "l2",
                "InstanceType": "cpu.small",
                "InstanceCount": 1,
                "SlurmConfig": {"NodeType": "Login"},
            },
            {
                "InstanceGroupName": "bad_name",
                "InstanceType": "no.such",
                "InstanceCount": "x",
                "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["p"]},
            },
        ],
    }
    r = hp("create", "-f", str(write_spec(tmp_path / "s.json", doc)))
    assert r.returncode == 2, r.stderr
    for needle in (
        "Unknown: unknown key",
        "Controller is required",
        "at most one group",
        "no.such",
        "'bad_name' must match",
        "InstanceGroups[2].InstanceCount",
    ):
        assert needle in r.stderr, (needle, r.stderr)
    assert "Traceback" not in r.stderr
    assert leftovers(name) == ([], [], [])
    assert hp("create", "--mode", "sideways", "--name", name).returncode == 2
    assert hp("list", "--json").returncode == 0 and name not in hp("list").stdout


def test_failed_create_rolls_back_or_is_retained(hp, tmp_path):
    """A worker whose image does not exist: all-or-nothing create fails and leaves
    nothing; with --retain the containers stay for debugging."""
    name = hp.name("rb")
    doc = small_spec(name, [("cpu", "cpu.nano", 1)], login=False)
    doc["InstanceGroups"][1]["Image"] = "hp-worker:does-not-exist"
    spec = write_spec(tmp_path / "s.json", doc)
    r = hp("create", "-f", str(spec))
    assert r.returncode == 1 and "group cpu" in r.stderr and "ImageNotFound" in r.stderr, r.stderr
    assert leftovers(name) == ([], [], [])
    assert hp.json("describe", name)["ClusterStatus"] == "Failed"

    r = hp("create", "-f", str(spec), "--retain")
    assert r.returncode == 1
    cs, nets, vols = leftovers(name)
    # the controller (accounting, on by default, runs in its container)
    assert sorted(c.labels["io.hp.role"] for c in cs) == ["controller"] and nets and vols
    hp("delete", name, check=True)
    assert leftovers(name) == ([], [], [])


def test_no_docker_daemon_is_a_clear_message(hp):
    env = dict(hp.env, DOCKER_HOST="unix:///nonexistent.sock")
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "create", "--name", "x"], env=env, capture_output=True, text=True
    )
    assert r.returncode == 1
    assert "cannot reach a Docker engine" in r.stderr and "dockerd" in r.stderr
    assert "Traceback" not in r.stderr


def test_values_docker_would_refuse_later_are_refused_before_anything_is_made(hp, tmp_path):
    """Issue 24: a value that passed the spec check and failed at create (an Image that is
    no image reference: "invalid reference format" after the controller was started; an
    instance type below Docker's least memory or CPU quota) is refused by the spec check:
    exit 2, every problem named, nothing in Docker, no state in HP_HOME."""
    name = hp.name("late")
    doc = small_spec(name, [("cpu", "cpu.nano", 1)], login=False)
    doc["InstanceGroups"][1]["Image"] = "Hp-Worker:not a tag"
    r = hp("create", "-f", str(write_spec(tmp_path / "image.json", doc)))
    assert r.returncode == 2, r.stderr
    assert "InstanceGroups[1].Image: 'Hp-Worker:not a tag' is not a valid image reference" in r.stderr, r.stderr
    types = tmp_path / "types.yaml"
    types.write_text(
        "tiny.mem: {VCpus: 1, CpuLimit: 0.05, MemoryMiB: 4}\nno.cpu: {VCpus: 0, CpuLimit: 0, MemoryMiB: 64}\n"
    )
    doc = small_spec(name, [("cpu", "tiny.mem", 1), ("b", "no.cpu", 1)], login=False)
    hp.env["HP_INSTANCE_TYPES"] = str(types)
    try:
        r = hp("create", "-f", str(write_spec(tmp_path / "types.json", doc)))
    finally:
        del hp.env["HP_INSTANCE_TYPES"]
    assert r.returncode == 2, r.stderr
    for needle in ("tiny.mem: MemoryMiB must be at least 6", "no.cpu: VCpus must be at least 1", "no.cpu: CpuLimit"):
        assert needle in r.stderr, (needle, r.stderr)
    assert "Traceback" not in r.stderr
    assert leftovers(name) == ([], [], [])
    assert name not in hp("list", "--json", check=True).stdout
    assert not (hp.home / "clusters" / name).exists()
    assert hp("describe", name).returncode != 0


def test_make_demo_first_step_prints_no_error_on_a_fresh_machine(hp):
    """Issue 46 item 3: `make demo` first removes an earlier demo cluster; on a machine with
    none it said `make: [Makefile:36: demo] Error 2 (ignored)`. Its step, as make runs it,
    against the real engine and a fresh state folder: exit 0, one line, no error; and the
    demo's recipe ignores no failure (a `-` line would hide a real one)."""
    name = hp.name("demo")
    here = f"{sys.executable} -m orchestrator.cli"
    r = subprocess.run(
        ["make", "-s", "-n", "demo", f"DEMO={name}", f"HP={here}"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    step = next(line for line in r.stdout.splitlines() if line.startswith(f"{here} delete "))
    r = subprocess.run(["bash", "-c", step], env=hp.env, cwd=ROOT, capture_output=True, text=True)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", f"no cluster {name}: nothing to delete\n")
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert not [ln for ln in recipe.splitlines() if ln.startswith("\t-")], recipe
