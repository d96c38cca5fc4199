"""Deep health checks on real clusters, with real faults (docker update, network
disconnect) and real Slurm jobs."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime

import pytest
from conftest import small_spec, write_spec
from conftest import wait_until as conftest_wait_until

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


@pytest.mark.releases
def test_healthy_group_passes_and_other_group_runs_undisturbed(hp, tmp_path):
    name = create(hp, tmp_path, [("cpu", "cpu.nano", 3), ("other", "cpu.nano", 1)])
    job = hp(
        "exec", name, "--", "sbatch", "--parsable", "-p", "other", "--wrap", "sleep 6; echo done-other", check=True
    ).stdout.strip()
    hp("health-check", "start", name, "--group", "cpu", *STRESS, check=True)

    # while the check runs, hp nodes shows the checked nodes isolated, and only those
    def isolated():
        ns = slurm_nodes(hp, name)
        return (
            ns
            if all(
                ns[n]["InstanceStatus"]["Status"] == "DeepHealthCheckInProgress" for n in ("cpu-1", "cpu-2", "cpu-3")
            )
            else None
        )

    during = wait_until(isolated, 60, step=0.2)
    assert during["other-1"]["InstanceStatus"]["Status"] == "Running"
    assert all(
        "drain" in during[n]["SlurmState"] and during[n]["SlurmReason"].startswith("hp:health:")
        for n in ("cpu-1", "cpu-2", "cpu-3")
    ), during
    req = wait_until(lambda: ended(hp.json("health-check", "status", name).get("Request")), 300)
    assert req["State"] == "Completed"
    assert req["Verdicts"] == {"cpu-1": "Passed", "cpu-2": "Passed", "cpu-3": "Passed"}, req
    assert all(n["InstanceStatus"]["Status"] == "Running" for n in slurm_nodes(hp, name).values())
    res = results(req)
    for n in ("cpu-1", "cpu-2", "cpu-3"):
        states = {c["Check"]: c for c in res[n]}
        assert states["InstanceStress"]["State"] == "Passed"
        assert (
            states["InstanceStress"]["Figures"]["cpu.bogo_ops_per_s_cpu"]
            >= states["InstanceStress"]["Figures"]["cpu.min_bogo_ops_per_s_cpu"]
        )
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
    # the job ran on other-1, in the shared home; the controller (no login node here) has no /home volume
    out = hp("exec", name, "--node", "other-1", "--", "cat", f"slurm-{job}.out").stdout
    assert "done-other" in out
    # a second request while one is active is refused
    rid = hp(
        "health-check", "start", name, "--group", "cpu", "--check", "InstanceStress", *STRESS, check=True
    ).stdout.strip()
    r2 = hp("health-check", "start", name, "--group", "cpu")
    assert r2.returncode in (1, 2) and "already has an active health check" in r2.stderr
    hp("health-check", "cancel", name)
    assert rid


def first_attempt(req: dict) -> dict[str, dict[str, dict]]:
    return {n: {c["Check"]: c for c in checks if c["Attempt"] == "initial"} for n, checks in results(req).items()}


def assert_kept_drained(hp, name, req, failed: dict[str, str]) -> None:
    nodes = slurm_nodes(hp, name)
    for n, check_name in failed.items():
        assert req["Verdicts"][n].startswith("Failed"), req["Verdicts"]
        assert "drain" in nodes[n]["SlurmState"], nodes[n]
        assert nodes[n]["SlurmReason"].startswith(f"hp:health:{req['Id']}:{check_name} failed:"), nodes[n]
        assert nodes[n]["InstanceStatus"]["Status"] == "Failure", nodes[n]


def assert_replaced_and_healthy(hp, name, req, nodes_: list[str], rebooted: bool) -> None:
    """A reboot does not cure the fault, the replacement (a fresh container at the type's
    limits, on the cluster network) passes and takes jobs again. `rebooted`: the node came
    back from the reboot (and failed its re-check); else the reboot itself failed."""
    nodes = slurm_nodes(hp, name)
    for n in nodes_:
        assert req["Verdicts"][n] == "Passed after replace", req["Verdicts"]
        assert nodes[n]["SlurmState"] == "idle", nodes[n]
    attempts = {(n, c["Attempt"], c["State"]) for n, checks in results(req).items() for c in checks}
    for n in nodes_:
        assert (n, "after-replace", "Passed") in attempts, attempts
        assert ((n, "after-reboot", "Failed") in attempts) == rebooted, attempts


@pytest.mark.parametrize("recovery", ["None", "Automatic"])
def test_cgroup_faults_are_caught(hp, tmp_path, recovery):
    name = create(hp, tmp_path, [("cpu", "cpu.nano", 2)], NodeRecovery=recovery)
    docker("update", "--memory", "40m", "--memory-swap", "40m", f"hp-{name}-cpu-1")
    docker("update", "--cpus", "0.01", f"hp-{name}-cpu-2")  # docker's least: a fifth of cpu.nano's 0.05
    req = check(hp, name, "--group", "cpu", "--check", "InstanceStress", "--recovery-wait", "30")
    first = first_attempt(req)
    mem = first["cpu-1"]["InstanceStress"]
    assert mem["State"] == "Failed" and any("memory limit is 40 MiB" in r for r in mem["Reasons"]), mem
    assert any("vm did no work" in r or "stress-ng" in r for r in mem["Reasons"]), mem
    cpu = first["cpu-2"]["InstanceStress"]
    assert cpu["State"] == "Failed" and any("throttled by the node's own cgroup quota" in r for r in cpu["Reasons"]), (
        cpu
    )
    if recovery == "None":
        assert_kept_drained(hp, name, req, {"cpu-1": "InstanceStress", "cpu-2": "InstanceStress"})
    else:
        # docker update'd limits survive a restart: the rebooted nodes fail again
        assert_replaced_and_healthy(hp, name, req, ["cpu-1", "cpu-2"], rebooted=True)


# The network fault has a cluster of its own: a node starved to 0.01 CPU also fails
# iperf3 (below IperfGbps), and with every ring pair failing nothing tells nodes apart.
# NodeRecovery None (kept drained) is covered by test_cgroup_faults_are_caught[None].
def test_network_fault_is_caught_blames_one_node_and_is_replaced(hp, tmp_path):
    name = create(hp, tmp_path, [("cpu", "cpu.nano", 3)], NodeRecovery="Automatic")
    docker("network", "disconnect", "-f", f"hp-{name}", f"hp-{name}-cpu-3")
    req = check(hp, name, "--group", "cpu", "--check", "InstanceConnectivity", "--recovery-wait", "12")
    first = first_attempt(req)
    net = first["cpu-3"]["InstanceConnectivity"]
    assert net["State"] == "Failed" and any("iperf3" in r for r in net["Reasons"]), net
    for n in ("cpu-1", "cpu-2"):  # the ring names the disconnected node only; MPI ran between the others
        assert first[n]["InstanceConnectivity"]["State"] == "Passed", first[n]
        assert first[n]["InstanceConnectivity"]["Figures"]["mpi.ranks_reported"] == 2
        assert req["Verdicts"][n] == "Passed"
    # the disconnection survives a restart: slurmd can't reach the controller, the reboot
    # fails, the replacement (on the cluster network) passes with a passed node as its peer
    assert_replaced_and_healthy(hp, name, req, ["cpu-3"], rebooted=False)


def test_busy_node_waits_for_its_job_or_is_skipped(hp, tmp_path):
    name = create(hp, tmp_path, [("cpu", "cpu.nano", 1)])
    job_running(name, hp("exec", name, "--", "sbatch", "--parsable", "-w", "cpu-1", "--wrap", "sleep 6", check=True))
    t0 = time.time()  # the job runs until about t0 + 6
    req = check(hp, name, "--node", "cpu-1", "--check", "InstanceStress", "--wait-idle-timeout", "60")
    stress = results(req)["cpu-1"][0]
    assert stress["State"] == "Passed"
    assert req["Verdicts"]["cpu-1"] == "Passed"
    began = datetime.strptime(stress["StartTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    assert began - t0 >= 4, (began - t0, stress)  # the check waited for the job to end
    # the job must be running when the check starts: one still pending (the node just
    # handed back by the first check) would not make the node busy
    job_running(name, hp("exec", name, "--", "sbatch", "--parsable", "-w", "cpu-1", "--wrap", "sleep 30", check=True))
    req = check(hp, name, "--node", "cpu-1", "--check", "InstanceStress", "--wait-idle-timeout", "2")
    assert req["Verdicts"]["cpu-1"].startswith("Skipped: still running jobs"), req["Verdicts"]
    n = slurm_nodes(hp, name)["cpu-1"]
    assert "drain" not in n["SlurmState"], n  # hp gave it back


def job_running(name: str, submitted: subprocess.CompletedProcess, timeout: float = 60) -> str:
    """Wait until the job sbatch --parsable printed is RUNNING (Slurm's word, on the controller)."""
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = controller(name, f"squeue -h -j {int(job)} -o %T").strip()
        if state == "RUNNING":
            return job
        time.sleep(0.25)
    raise AssertionError(f"job {job} not running after {timeout:.0f} s (last state {state!r})")


def test_foreign_drain_is_left_alone_and_bad_input(hp, tmp_path):
    name = create(hp, tmp_path, [("cpu", "cpu.nano", 1)])
    hp(
        "exec",
        name,
        "--root",
        "--",
        "scontrol",
        "update",
        "nodename=cpu-1",
        "state=drain",
        "reason=admin work",
        check=True,
    )
    req = check(hp, name, "--node", "cpu-1", "--check", "InstanceStress")
    assert "admin work" in req["Verdicts"]["cpu-1"]
    assert slurm_nodes(hp, name)["cpu-1"]["SlurmReason"] == "admin work"
    r = hp("health-check", "start", name, "--group", "nope", "--node", "cpu-9", "--check", "Bogus")
    assert r.returncode == 2 and "3 problems" in r.stderr, r.stderr


def controller(name: str, cmd: str) -> str:
    """Run cmd on the controller as root (Slurm's view, without an hp process per poll)."""
    return subprocess.run(
        ["docker", "exec", f"hp-{name}-controller-1", "sh", "-c", cmd], capture_output=True, text=True, timeout=30
    ).stdout


def node_and_job(name: str, node: str, job: str) -> tuple[str, str, str, str]:
    """(node state, node reason, job state, job's nodes) in one exec. The job is read
    first: a node seen drained after it was drained when the job was read too (a node
    read first could be resumed, and the job started on it, before the job's read)."""
    out = controller(name, f"scontrol -o show job {job}; echo @@; scontrol -o show node {node}")
    j, _, n = out.partition("@@")
    field = lambda text, key: next((w.split("=", 1)[1] for w in text.split() if w.startswith(key + "=")), "")  # noqa: E731
    reason = n.split(" Reason=", 1)[1].split(" [")[0] if " Reason=" in n else ""
    return field(n, "State"), reason, field(j, "JobState"), field(j, "NodeList")


def ended(req: dict | None) -> dict | None:
    return req if req and req["State"] not in ("Pending", "Running") else None


def in_service(state: str) -> bool:
    return state.startswith("IDLE") and "DRAIN" not in state


def wait_until(what, timeout: float, step: float = 0.5):
    return conftest_wait_until(what, timeout, "the health check's state", poll=step)


def test_on_start_checks_keep_new_nodes_out_of_jobs_until_they_pass(hp, tmp_path):
    name, path = spec(hp, tmp_path, [("cpu", "cpu.nano", 1)])
    doc = json.loads(path.read_text())
    doc["InstanceGroups"][-1]["OnStartDeepHealthChecks"] = ["InstanceStress"]
    write_spec(path, doc)
    hp("create", "-f", str(path), "--timeout", "120", check=True)
    # cpu-1 registered drained and was checked by the agent at create
    first = wait_until(lambda: ended(hp.json("health-check", "status", name)["Request"]), 90)
    assert first["OnStart"] and first["Verdicts"] == {"cpu-1": "Passed"}, first
    assert in_service(node_and_job(name, "cpu-1", "0")[0])
    # an on-demand check is running when the next node joins: the on-start one waits for it
    ondemand = hp(
        "health-check",
        "start",
        name,
        "--node",
        "cpu-1",
        "--check",
        "InstanceStress",
        "--stress-seconds",
        "3",
        check=True,
    ).stdout.strip()
    hp("add-nodes", name, "cpu", "1", check=True)
    wait_until(lambda: "cpu-2" in controller(name, "sinfo -h -N -o %N"), 90)
    job = hp(
        "exec", name, "--", "sbatch", "--parsable", "-p", "cpu", "-N", "2", "--wrap", "hostname", check=True
    ).stdout.strip()
    seen = []

    def done() -> bool:
        seen.append(node_and_job(name, "cpu-2", job))
        return seen[-1][2] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")

    wait_until(done, 180)
    # while cpu-2 was drained (on-start pending, then the check's own drain) the job did not run
    drained = [s for s in seen if "DRAIN" in s[0]]
    assert drained and all(s[1].startswith("hp:health:") for s in drained), seen
    assert all(s[2] == "PENDING" for s in drained), ([s for s in drained if s[2] != "PENDING"], seen[-5:])
    assert seen[-1][2] == "COMPLETED" and seen[-1][3] in ("cpu-[1-2]", "cpu-1,cpu-2"), seen
    st = wait_until(lambda: ended(hp.json("health-check", "status", name)["Request"]), 30)
    assert st["OnStart"] and st["Nodes"] == ["cpu-2"] and st["Verdicts"] == {"cpu-2": "Passed"}, st
    assert [c["State"] for c in results(st)["cpu-2"]] == ["Passed"], st
    od = hp.json("health-check", "status", name, "--request", ondemand)["Request"]
    assert od["Verdicts"] == {"cpu-1": "Passed"} and od["EndTime"] <= st["CreationTime"], (od, st)
    assert in_service(node_and_job(name, "cpu-2", job)[0]), seen[-1]


def test_stress_check_on_a_cgroup_holding_page_cache_passes_a_healthy_node(hp, tmp_path, monkeypatch):
    """Issue 24: healthy nodes failed InstanceStress elsewhere with `stress-ng exited 137:
    terminated by signal 9`: the memory stressor against the check container's limit,
    with what else its cgroup holds. The check container here first holds 200 MiB of page
    cache in its 256 MiB cgroup; the memory stressor is sized from what the cgroup really
    has (the largest size hp takes on such a node, 192M, is cut), and the node passes.
    A run the kernel still kills is no verdict (unit tests, on a real run's output). The
    cache is reclaimed before the timed run (stress.room_command), not during it."""
    from orchestrator import assembly
    from orchestrator.core.context import Cluster
    from orchestrator.health.requests import sidecar
    from orchestrator.health.requests.runner import Engine, Options
    from orchestrator.health.tools.stress import MEMORY_COMMAND, StressOptions, parse_cgroup_memory

    name = create(hp, tmp_path, [("cpu", "cpu.nano", 1)], Accounting={"Enabled": False})
    monkeypatch.setenv("HP_HOME", str(hp.home))
    c = Cluster(assembly.env(), name)
    node = c.node_containers()["cpu-1"]
    itype = c.env.catalogue[node.itype]
    results = {}
    for size in ("64M", "192M"):
        eng = Engine(c, f"pc-{size}", Options(checks=["InstanceStress"], stress=StressOptions(2, size)))
        sc = sidecar.start(c, node, eng.image, f"pc-{size}")
        try:
            fill = c.p.exec(sc.cid, ["dd", "if=/dev/zero", "of=/tmp/fill", "bs=1M", "count=200"])
            assert fill.exit_code == 0, fill.output
            mem = parse_cgroup_memory(c.p.exec(sc.cid, MEMORY_COMMAND).output)
            assert mem is not None and mem.limit == 256 * 2**20 and mem.file >= 190 * 2**20, mem
            t0 = time.monotonic()
            v, out, _, notes, _ = eng.run_stress(itype, sc)
            results[size] = (v, notes, time.monotonic() - t0, mem)
        finally:
            sidecar.remove_all(c, f"pc-{size}")
    for size, (v, notes, took, mem) in results.items():
        print(f"{size}: passed={v.passed} in {took:.1f} s, cache {mem.file / 2**20:.0f} MiB; {notes} {v.reasons}")
        assert v.passed and not v.not_run, (size, v.reasons)
    # 64M fits beside reclaimable cache: as asked; the cache is reclaimed before the timed
    # run (without that, the memory stressor did 0 bogo-ops in ~1 run in 20 under load)
    assert [n.partition(" (")[0] for n in results["64M"][1]] == [
        "note: page cache reclaimed before the run, not during it"
    ]
    assert any("memory stressor cut to" in n for n in results["192M"][1]), results["192M"][1]
