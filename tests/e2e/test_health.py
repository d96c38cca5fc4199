"""Deep health checks on real clusters, with real faults (docker update, network
disconnect) and real Slurm jobs."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import small_spec, write_spec

STRESS = ["--stress-seconds", "2", "--vm-bytes", "64M"]


def spec(hp, tmp_path, groups, **top):
    name = hp.name("hc")
    doc = small_spec(name, groups, login=False, **top)
    doc["InstanceGroups"][0]["InstanceType"] = "cpu.nano"  # the lab host is shared: keep the controller small
    return name, write_spec(tmp_path / f"{name}.json", doc)


def create(hp, tmp_path, groups, **top) -> str:
    name, path = spec(hp, tmp_path, groups, **top)
    hp("create", "-f", str(path), "--timeout", "120", check=True)
    return name


def slurm_nodes(hp, name) -> dict[str, dict]:
    return {n["SlurmNodeName"]: n for n in hp.json("nodes", name)["ClusterNodeSummaries"]}


def docker(*args: str) -> None:
    subprocess.run(["docker", *args], check=True, capture_output=True, text=True)


def check(hp, name, *args: str, timeout: float = 400) -> dict:
    r = hp("health-check", "start", name, *args, *STRESS, "--wait", "--json", timeout=timeout)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)["Request"]


def results(req: dict) -> dict[str, list[dict]]:
    return {n["Node"]: n["Checks"] for g in req["InstanceGroups"] for n in g["Nodes"]}


def test_healthy_group_passes_and_other_group_runs_undisturbed(hp, tmp_path):
    name = create(hp, tmp_path, [("cpu", "cpu.nano", 3), ("other", "cpu.nano", 1)])
    job = hp("exec", name, "--", "sbatch", "--parsable", "-p", "other", "--wrap", "sleep 6; echo done-other",
             check=True).stdout.strip()
    req = check(hp, name, "--group", "cpu")
    assert req["State"] == "Completed"
    assert req["Verdicts"] == {"cpu-1": "Passed", "cpu-2": "Passed", "cpu-3": "Passed"}, req
    res = results(req)
    for n in ("cpu-1", "cpu-2", "cpu-3"):
        states = {c["Check"]: c for c in res[n]}
        assert states["InstanceStress"]["State"] == "Passed"
        assert states["InstanceStress"]["Figures"]["cpu.bogo_ops_per_s_cpu"] >= states["InstanceStress"]["Figures"]["cpu.min_bogo_ops_per_s_cpu"]
        assert states["InstanceConnectivity"]["State"] == "Passed"
        assert states["InstanceConnectivity"]["Figures"]["mpi.ranks_reported"] == 3
        assert open(states["InstanceStress"]["Output"]).read().count("stress-ng")
    nodes = slurm_nodes(hp, name)
    assert all(nodes[n]["SlurmState"] == "idle" for n in ("cpu-1", "cpu-2", "cpu-3")), nodes
    assert "other-1" not in res
    # the other group's job ran to the end, undisturbed
    deadline = time.monotonic() + 60
    while hp("exec", name, "--", "squeue", "-h", "-j", job).stdout.strip() and time.monotonic() < deadline:
        time.sleep(1)
    out = hp("exec", name, "--", "sh", "-c", f"cat slurm-{job}.out").stdout
    assert "done-other" in out
    # a second request while one is active is refused
    rid = hp("health-check", "start", name, "--group", "cpu", "--check", "InstanceStress", *STRESS, check=True).stdout.strip()
    r2 = hp("health-check", "start", name, "--group", "cpu")
    assert r2.returncode in (1, 2) and "already has an active health check" in r2.stderr
    hp("health-check", "cancel", name)
    assert rid


@pytest.mark.parametrize("recovery", ["None", "Automatic"])
def test_real_faults_are_caught(hp, tmp_path, recovery):
    name = create(hp, tmp_path, [("cpu", "cpu.nano", 3)], NodeRecovery=recovery)
    docker("update", "--memory", "40m", "--memory-swap", "40m", f"hp-{name}-cpu-1")
    docker("update", "--cpus", "0.01", f"hp-{name}-cpu-2")  # docker's least: a fifth of cpu.nano's 0.05
    docker("network", "disconnect", "-f", f"hp-{name}", f"hp-{name}-cpu-3")
    req = check(hp, name, "--group", "cpu", timeout=600)
    res = results(req)
    first = {n: {c["Check"]: c for c in res[n] if c["Attempt"] == "initial"} for n in res}
    mem = first["cpu-1"]["InstanceStress"]
    assert mem["State"] == "Failed" and any("memory limit is 40 MiB" in r for r in mem["Reasons"]), mem
    assert any("vm did no work" in r or "stress-ng" in r for r in mem["Reasons"]), mem
    cpu = first["cpu-2"]["InstanceStress"]
    assert cpu["State"] == "Failed" and any("throttled by the node's own cgroup quota" in r for r in cpu["Reasons"]), cpu
    net = first["cpu-3"]["InstanceConnectivity"]
    assert net["State"] == "Failed" and any("iperf3" in r for r in net["Reasons"]), net
    # the iperf3 pairs name the disconnected node only (MPI may still fail on the starved nodes)
    assert not any("iperf3" in r for n in ("cpu-1", "cpu-2") for r in first[n]["InstanceConnectivity"]["Reasons"])
    nodes = slurm_nodes(hp, name)
    if recovery == "None":
        for n, check_name in (("cpu-1", "InstanceStress"), ("cpu-2", "InstanceStress"), ("cpu-3", "InstanceConnectivity")):
            assert req["Verdicts"][n].startswith("Failed"), req["Verdicts"]
            assert "drain" in nodes[n]["SlurmState"], nodes[n]
            assert nodes[n]["SlurmReason"].startswith(f"hp-health:{req['Id']}:{check_name} failed:"), nodes[n]
    else:
        # a reboot keeps docker-update'd limits and a disconnected network: replaced, then healthy
        for n in ("cpu-1", "cpu-2", "cpu-3"):
            assert req["Verdicts"][n].startswith("Passed after"), req["Verdicts"]
            assert nodes[n]["SlurmState"] == "idle", nodes[n]


def test_busy_node_waits_for_its_job_or_is_skipped(hp, tmp_path):
    name = create(hp, tmp_path, [("cpu", "cpu.nano", 1)])
    hp("exec", name, "--", "sbatch", "-w", "cpu-1", "--wrap", "sleep 6", check=True)
    time.sleep(1.5)
    t0 = time.time()
    req = check(hp, name, "--node", "cpu-1", "--check", "InstanceStress", "--wait-idle-timeout", "60")
    stress = results(req)["cpu-1"][0]
    assert stress["State"] == "Passed"
    assert req["Verdicts"]["cpu-1"] == "Passed"
    assert time.time() - t0 >= 4  # it waited for the job
    hp("exec", name, "--", "sbatch", "-w", "cpu-1", "--wrap", "sleep 30", check=True)
    time.sleep(1.5)
    req = check(hp, name, "--node", "cpu-1", "--check", "InstanceStress", "--wait-idle-timeout", "2")
    assert req["Verdicts"]["cpu-1"].startswith("Skipped: still running jobs"), req["Verdicts"]
    n = slurm_nodes(hp, name)["cpu-1"]
    assert "drain" not in n["SlurmState"], n  # hp gave it back


def test_foreign_drain_is_left_alone_and_bad_input(hp, tmp_path):
    name = create(hp, tmp_path, [("cpu", "cpu.nano", 1)])
    hp("exec", name, "--root", "--", "scontrol", "update", "nodename=cpu-1", "state=drain", "reason=admin work", check=True)
    req = check(hp, name, "--node", "cpu-1", "--check", "InstanceStress")
    assert "admin work" in req["Verdicts"]["cpu-1"]
    assert slurm_nodes(hp, name)["cpu-1"]["SlurmReason"] == "admin work"
    r = hp("health-check", "start", name, "--group", "nope", "--node", "cpu-9", "--check", "Bogus")
    assert r.returncode == 2 and "3 problems" in r.stderr, r.stderr
