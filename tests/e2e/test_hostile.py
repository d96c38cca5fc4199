"""What a fault campaign found, each reproduced here against real Docker and Slurm: no
upper bounds, shell injection through a health-check option, events of a deleted cluster
reappearing, logs of every name ever recorded, a controller-only cluster stuck Creating,
negative counts taken for options, a missing cluster exiting 1, `hp list` silent with the
engine down."""

from __future__ import annotations

import json
import subprocess
import time

from conftest import Hp, small_spec, write_spec


def containers(name: str) -> list[str]:
    r = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=io.hp.cluster={name}"], capture_output=True, text=True
    )
    return r.stdout.split()


def test_no_unbounded_scale_and_no_impossible_spec(hp, tmp_path):
    name = hp.name("hb")
    doc = small_spec(name, [("cpu", "cpu.nano", 1)], login=False)
    hp("create", "-f", str(write_spec(tmp_path / "s.json", doc)), "--timeout", "120", check=True)
    before = sorted(containers(name))
    t0 = time.monotonic()
    r = hp("scale", name, "cpu", "100000")
    assert r.returncode == 2 and "MaxNodeCount" in r.stderr and "host can ever run" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 10
    r = hp("scale", name, "cpu", "-5")
    assert r.returncode == 2 and "must be >= 0" in r.stderr and "No such option" not in r.stderr, r.stderr
    assert sorted(containers(name)) == before
    assert (
        next(g for g in hp.json("describe", name)["InstanceGroups"] if g["InstanceGroupName"] == "cpu")["TargetCount"]
        == 1
    )
    big = hp.name("hb-big")
    doc = small_spec(big, [("cpu", "cpu.nano", 100000)], login=False)
    r = hp("create", "-f", str(write_spec(tmp_path / "big.json", doc)))
    assert r.returncode == 2 and "65536" in r.stderr, r.stderr
    doc = small_spec(big, [("cpu", "cpu.large", 5000)], login=False)
    r = hp("create", "-f", str(write_spec(tmp_path / "big2.json", doc)))
    assert r.returncode == 2 and "more than this host can ever run" in r.stderr, r.stderr
    assert containers(big) == [] and hp("describe", big).returncode == 2


def test_health_check_options_never_reach_a_shell(hp, tmp_path):
    name = hp.name("hi")
    doc = small_spec(name, [("cpu", "cpu.nano", 1)], login=False)
    hp("create", "-f", str(write_spec(tmp_path / "s.json", doc)), "--timeout", "120", check=True)
    started = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.StartedAt}}", f"hp-{name}-cpu-1"], capture_output=True, text=True
    ).stdout
    r = hp(
        "health-check",
        "start",
        name,
        "--node",
        "cpu-1",
        "--check",
        "InstanceStress",
        "--vm-bytes",
        "16M; echo INJECTED $(id -u) #",
    )
    assert r.returncode == 2 and "--vm-bytes must be a size" in r.stderr, r.stderr
    assert hp.json("health-check", "status", name)["Request"] is None  # no request, nothing drained
    node = next(n for n in hp.json("nodes", name)["ClusterNodeSummaries"] if n["SlurmNodeName"] == "cpu-1")
    assert node["SlurmState"] == "idle" and node["InstanceStatus"]["Status"] == "Running"
    assert (
        subprocess.run(
            ["docker", "inspect", "-f", "{{.State.StartedAt}}", f"hp-{name}-cpu-1"], capture_output=True, text=True
        ).stdout
        == started
    )  # never rebooted


def test_events_belong_to_one_life_of_a_name_and_logs_stay_bounded(hp, tmp_path):
    name = hp.name("hl")
    doc = small_spec(name, [("cpu", "cpu.nano", 3)], login=False)
    spec = write_spec(tmp_path / "s.json", doc)
    hp("create", "-f", str(spec), "--timeout", "120", check=True)
    hp("scale", name, "cpu", "1", "--wait", "--timeout", "120", check=True)
    out = tmp_path / "logs"
    doc = hp.json("logs", name, "--dir", str(out))
    assert doc["Nodes"] == ["controller-1", "cpu-1", "cpu-2", "cpu-3"]  # removed a moment ago: still there
    hp("delete", name, check=True)
    old = [e["Description"] for e in hp.json("events", name)["Events"]]
    assert any("deleted" in d for d in old)
    hp("create", "-f", str(spec), "--timeout", "120", check=True)
    new = [e["Description"] for e in hp.json("events", name)["Events"]]
    assert not any("deleted" in d or "Scaling" in d for d in new), new
    r = hp("events", name, "--limit", "2", "--json", check=True)
    assert len(json.loads(r.stdout)["Events"]) == 2


def test_controller_only_cluster_with_no_wait_becomes_in_service(hp, tmp_path):
    name = hp.name("hc")
    doc = small_spec(name, [], login=False)
    doc["InstanceGroups"] = doc["InstanceGroups"][:1]
    hp("create", "-f", str(write_spec(tmp_path / "s.json", doc)), "--no-wait", check=True)
    deadline = time.monotonic() + 30
    while hp.json("describe", name)["ClusterStatus"] != "InService":
        assert time.monotonic() < deadline, "stayed Creating"
        time.sleep(0.5)


def test_delete_from_another_state_folder_leaves_the_cluster_to_its_maker(hp, tmp_path):
    # two HP_HOMEs on one engine (two users of a lab machine): the second's `hp delete` of the
    # first's cluster is refused, naming the folder and the command; nothing is removed
    name = hp.name("ho")
    doc = small_spec(name, [], login=False)
    doc["InstanceGroups"] = doc["InstanceGroups"][:1]
    hp("create", "-f", str(write_spec(tmp_path / "s.json", doc)), check=True)
    other = Hp(tmp_path / "other-home")
    r = other("delete", name)
    assert r.returncode == 2, r.stderr
    assert f"made from another hp state folder, {hp.home.resolve()}" in r.stderr and "HP_HOME=" in r.stderr
    r = other("create", "--name", name)  # nor may it take the name
    assert r.returncode == 2 and f"it was made from another hp state folder, {hp.home.resolve()}" in r.stderr
    d = hp.json("describe", name)
    assert d["ClusterStatus"] == "InService" and d["ControllerReachable"] is True
    assert "deleted cluster" in hp("delete", name, check=True).stderr


def test_a_cluster_that_does_not_exist_is_bad_input_everywhere(hp, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    for args in (
        ["describe", "nope"],
        ["nodes", "nope"],
        ["exec", "nope", "--", "true"],
        ["delete", "nope"],
        ["scale", "nope", "cpu", "2"],
        ["delete-nodes", "nope", "cpu-1"],
        ["events", "nope"],
        ["reboot", "nope", "cpu-1"],
        ["replace", "nope", "cpu-1"],
        ["health-check", "status", "nope"],
        ["health-check", "start", "nope"],
        ["logs", "nope", "--dir", str(tmp_path / "l")],
        ["submit", "nope", str(script)],
    ):
        r = hp(*args)
        assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_list_says_so_when_the_engine_does_not_answer(hp, tmp_path):
    name = hp.name("he")
    doc = small_spec(name, [("cpu", "cpu.nano", 1)], login=False)
    hp("create", "-f", str(write_spec(tmp_path / "s.json", doc)), "--no-wait", "--timeout", "120", check=True)
    env = dict(hp.env, DOCKER_HOST="unix:///nonexistent.sock")
    r = subprocess.run(hp.argv("list", "--json"), env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["EngineReachable"] is False and "last recorded" in doc["ClusterSummaries"][0]["StatusNote"]
    r = subprocess.run(hp.argv("list"), env=env, capture_output=True, text=True, timeout=60)
    assert "does not answer" in r.stderr
