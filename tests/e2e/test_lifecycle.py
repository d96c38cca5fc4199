"""Issue 21, item 2: lifecycle scripts (LifeCycleConfig.OnCreate) on real containers and
real Slurm: run on every node before its Slurm daemon, with the node's facts, again
after a replace and not after a reboot; a failing script is the node's launch failure
(all-or-nothing rolls back, continuous retries); bad input is refused with exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.docker.engine import DockerEngine as DockerProvider
from tests.conftest import small_spec, wait_until, write_spec

# writes a marker (when it ran, to the nanosecond) and what it read of its node's facts;
# fails with exit 3 on the node named in FAIL_ON (a file of the folder); sleeps 1 s so
# that a daemon started after it starts at least a second later
SCRIPT = """#!/bin/bash
set -eu
. /etc/hp/node.env
date +%s.%N > /var/tmp/hp-oncreate-marker
echo "$HP_NODE $HP_GROUP $HP_NODE_TYPE $HP_CLUSTER $HP_CONTROLLER" > /var/tmp/hp-oncreate-facts
grep -c '"InstanceName"' /opt/ml/config/resource_config.json >> /var/tmp/hp-oncreate-facts
awk '{print $3}' /etc/hp/nodes | tr '\\n' ' ' >> /var/tmp/hp-oncreate-facts
echo "lifecycle script ran on $HP_NODE (cwd $(pwd), helper: $(cat data/helper.txt))"
if grep -qx "$HP_NODE" fail-on 2>/dev/null; then echo "no such package: hp-missing"; exit 3; fi
sleep 1
"""


def lc_folder(tmp_path: Path, fail_on: str = "") -> Path:
    d = tmp_path / "lifecycle"
    (d / "data").mkdir(parents=True)
    (d / "on_create.sh").write_text(SCRIPT)
    (d / "data" / "helper.txt").write_text("from the folder\n")
    if fail_on:
        (d / "fail-on").write_text(fail_on + "\n")
    return d


def lc_spec(name: str, groups: list[tuple[str, str, int]], **top) -> dict:
    doc = small_spec(name, groups, Accounting={"Enabled": False}, **top)
    for g in doc["InstanceGroups"]:
        if g["SlurmConfig"]["NodeType"] != "Controller":
            g["LifeCycleConfig"] = {"SourceS3Uri": "lifecycle", "OnCreate": "on_create.sh", "OnCreateTimeout": 60}
    return doc


def sh(name: str, node: str, cmd: str) -> str:
    r = DockerProvider().exec(f"hp-{name}-{node}", ["sh", "-c", cmd])
    assert r.exit_code == 0, (node, cmd, r.output)
    return r.output.strip()


def slurmd_start(name: str, node: str) -> float:
    out = sh(name, "controller-1", "scontrol show nodes --json")
    n = next(n for n in json.loads(out)["nodes"] if n["name"] == node)
    t = n["slurmd_start_time"]
    return float(t["number"] if isinstance(t, dict) else t)


def sackd_start(name: str, node: str) -> float:
    """When sackd started: it made its socket then (sackd is the entry's PID 1, exec'd,
    so the process's own start time is the container's)."""
    return float(sh(name, node, "date +%s.%N -r /run/slurm/sack.socket"))


def events(hp, name: str) -> list[str]:
    return [e["Description"] for e in hp.json("events", name)["Events"]]


@pytest.mark.releases
def test_script_runs_on_every_node_before_slurm_with_its_facts_and_again_after_replace(hp, tmp_path):
    name = hp.name("lc")
    lc_folder(tmp_path)
    spec = write_spec(tmp_path / "spec.json", lc_spec(name, [("cpu", "cpu.nano", 2)]))
    hp("create", "-f", str(spec), check=True, timeout=300)
    marks = {}
    for node, group, ntype in (("login-1", "login", "Login"), ("cpu-1", "cpu", "Compute"), ("cpu-2", "cpu", "Compute")):
        marks[node] = float(sh(name, node, "cat /var/tmp/hp-oncreate-marker"))
        facts = sh(name, node, "cat /var/tmp/hp-oncreate-facts").splitlines()
        assert facts[0] == f"{node} {group} {ntype} {name} controller-1"
        assert facts[1] == "4"  # resource_config.json: every group's nodes
        assert facts[2].split() == ["controller-1", "login-1", "cpu-1", "cpu-2"]
        started = sackd_start(name, node) if ntype == "Login" else slurmd_start(name, node)
        assert marks[node] < started, (node, marks[node], started)  # before the Slurm daemon started
    # the controller's group has no LifeCycleConfig
    assert DockerProvider().exec(f"hp-{name}-controller-1", ["test", "-e", "/var/tmp/hp-oncreate-marker"]).exit_code
    ev = events(hp, name)
    # with its run time as the node measured it (the entry's line: hundredths of a second)
    assert any(
        re.match(r"Lifecycle script on_create.sh on cpu-2 exited 0 after \d+\.\d\d s; ", e) and "from the folder" in e
        for e in ev
    ), ev
    # its output is in the node's log (hp logs)
    out = tmp_path / "logs"
    hp("logs", name, "--dir", str(out), check=True, timeout=120)
    logged = "\n".join(p.read_text(errors="replace") for p in (out).rglob("*") if p.is_file() and "cpu-1" in str(p))
    assert "lifecycle script ran on cpu-1 (cwd /opt/hp/oncreate/src, helper: from the folder)" in logged
    assert re.search(r"hp-entry: lifecycle script on_create.sh exited 0 after \d+\.\d\d s", logged)

    # a reboot restarts the same container: the script does not run again
    hp("reboot", name, "cpu-2", check=True, timeout=120)
    assert float(sh(name, "cpu-2", "cat /var/tmp/hp-oncreate-marker")) == marks["cpu-2"]
    # a replace makes a new node: it runs again, before its slurmd
    hp("replace", name, "cpu-1", check=True, timeout=120)
    again = float(sh(name, "cpu-1", "cat /var/tmp/hp-oncreate-marker"))
    assert again > marks["cpu-1"] and again < slurmd_start(name, "cpu-1")
    ran = [e for e in events(hp, name) if e.startswith("Lifecycle script on_create.sh on cpu-1 exited 0")]
    assert len(ran) == 2, ran
    r = hp("exec", name, "--", "srun", "-p", "cpu", "-N2", "hostname", check=True)
    assert sorted(r.stdout.split()) == ["cpu-1", "cpu-2"]


def test_failing_script_rolls_back_an_all_or_nothing_create(hp, tmp_path):
    name = hp.name("lf")
    lc_folder(tmp_path, fail_on="cpu-2")
    spec = write_spec(tmp_path / "spec.json", lc_spec(name, [("cpu", "cpu.nano", 2)]))
    r = hp("create", "-f", str(spec), timeout=300)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "cpu-2: LifecycleScriptFailed: exit 3: no such package: hp-missing (script on_create.sh)" in r.stderr
    p = DockerProvider()
    assert (p.containers(name), p.networks(name), p.volumes(name)) == ([], [], [])
    ev = events(hp, name)
    assert any("Lifecycle script on_create.sh on cpu-2 exited 3" in e and "hp-missing" in e for e in ev), ev
    assert any("rolled back" in e for e in ev)


def test_failing_script_in_continuous_mode_keeps_the_node_pending_and_the_others_join(hp, tmp_path):
    hp.env["HP_RETRY_MAX"] = "2"  # the backoff's longest wait, so two tries come quickly
    name = hp.name("lk")
    lc_folder(tmp_path, fail_on="cpu-2")
    spec = write_spec(
        tmp_path / "spec.json", lc_spec(name, [("cpu", "cpu.nano", 2)], NodeProvisioningMode="Continuous")
    )
    hp("create", "-f", str(spec), check=True, timeout=300)

    def state():
        return {n["SlurmNodeName"]: n["InstanceStatus"] for n in hp.json("nodes", name)["ClusterNodeSummaries"]}

    def retried():
        s = state().get("cpu-2", {})
        msg = s.get("Message", "")
        # the message names the try that failed last: a slow poll may see the third or later,
        # since a try's Pending window with that message lasts only its backoff (2 s here)
        tries = re.search(r"\(retry (\d+), next in", msg)
        return (
            s.get("Status") == "Pending"
            and "LifecycleScriptFailed: exit 3" in msg
            and tries
            and int(tries[1]) >= 2
            and msg
        )

    msg = wait_until(retried, 90, "cpu-2 pending after two or more failed tries")
    assert "no such package: hp-missing" in msg
    wait_until(lambda: state().get("cpu-1", {}).get("Status") == "Running", 60, "cpu-1 running")
    r = hp("exec", name, "--", "srun", "-p", "cpu", "-N1", "hostname", check=True)
    assert r.stdout.strip() == "cpu-1"


def test_bad_lifecycle_config_is_refused_with_every_problem_and_nothing_made(hp, tmp_path):
    name = hp.name("lb")
    lc_folder(tmp_path)
    doc = small_spec(name, [("a", "cpu.nano", 1), ("b", "cpu.nano", 1), ("c", "cpu.nano", 1)])
    igs = doc["InstanceGroups"]
    igs[1]["LifeCycleConfig"] = {"SourceS3Uri": "s3://bucket/LifecycleScripts/base-config/", "OnCreate": "on_create.sh"}
    igs[2]["LifeCycleConfig"] = {"SourceS3Uri": "no-such-folder", "OnCreate": "on_create.sh"}
    igs[3]["LifeCycleConfig"] = {"SourceS3Uri": "lifecycle", "OnCreate": "missing.sh", "OnCreateTimeout": 0}
    igs[4]["LifeCycleConfig"] = {
        "SourceS3Uri": "lifecycle",
        "OnCreate": "on_create.sh; rm -rf /",
        "OnCreateTimeout": 10**9,
    }
    r = hp("create", "-f", str(write_spec(tmp_path / "spec.json", doc)), timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    for part in (
        "InstanceGroups[1].LifeCycleConfig.SourceS3Uri: an s3:// URI cannot be read",
        "InstanceGroups[2].LifeCycleConfig.SourceS3Uri: no folder",
        "InstanceGroups[3].LifeCycleConfig.OnCreate: 'missing.sh' is not a file in",
        "InstanceGroups[3].LifeCycleConfig.OnCreateTimeout: must be between 1 and 3600 seconds, got 0",
        "InstanceGroups[4].LifeCycleConfig.OnCreate: 'on_create.sh; rm -rf /' is not a file in",
        "InstanceGroups[4].LifeCycleConfig.OnCreateTimeout: must be between 1 and 3600 seconds, got 1000000000",
    ):
        assert part in r.stderr, (part, r.stderr)
    p = DockerProvider()
    assert (p.containers(name), p.networks(name), p.volumes(name)) == ([], [], [])
    assert hp("describe", name).returncode != 0
