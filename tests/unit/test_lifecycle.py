"""Lifecycle scripts (LifeCycleConfig.OnCreate): the spec's rules, the node's facts, the
outcome of a script, and launches against the fakes (the node's entry stood in for by an
on_start hook that writes the result the real entry writes). The real entry, Docker and
Slurm: tests/e2e/test_lifecycle.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fakes import FakeLines, spec_doc, world

from orchestrator.cluster.create import CreateOptions, create
from orchestrator.core import lifecycle
from orchestrator.core.context import Cluster
from orchestrator.core.launcher import Launcher
from orchestrator.errors import BadInput, EngineError, OperationFailed
from orchestrator.releases import DEFAULT
from orchestrator.spec.catalogue import load_catalogue
from orchestrator.spec.lifecycle import MAX_FILES, TIMEOUT_DEFAULT, TIMEOUT_MAX
from orchestrator.spec.model import validate, with_overrides
from orchestrator.state.transitions import ClusterStatus

CAT = load_catalogue()


def lc_dir(tmp_path: Path, name: str = "lc", script: str = "on_create.sh") -> Path:
    d = tmp_path / name
    (d / "utils").mkdir(parents=True)
    (d / script).write_text("#!/bin/bash\necho hello\n")
    (d / script).chmod(0o755)
    (d / "utils" / "helper.sh").write_text("echo helper\n")
    return d


def doc_with(lc: dict, groups=None, **top) -> dict:
    doc = spec_doc("lab", groups or [("cpu", "cpu.nano", 2)], **top)
    for g in doc["InstanceGroups"]:
        if g["SlurmConfig"]["NodeType"] != "Controller":
            g["LifeCycleConfig"] = lc
    return doc


def problems(doc: dict, base: Path) -> list[str]:
    with pytest.raises(BadInput) as e:
        validate(doc, CAT, base=base)
    return e.value.problems


# -- the spec ---------------------------------------------------------------------------
def test_a_relative_folder_is_read_from_the_spec_files_folder_and_recorded_absolute(tmp_path):
    lc_dir(tmp_path)
    s = validate(doc_with({"SourceS3Uri": "lc", "OnCreate": "on_create.sh"}), CAT, base=tmp_path)
    got = s.group("cpu").LifeCycleConfig
    assert got.SourceS3Uri == str(tmp_path / "lc") and got.OnCreate == "on_create.sh"
    assert got.timeout == TIMEOUT_DEFAULT == 600
    # the recorded spec reads back as it is (an existing cluster's)
    again = validate(s.model_dump(exclude_none=True), CAT, existing=True)
    assert again.group("cpu").LifeCycleConfig == got
    # with_overrides (the CLI's path) passes the folder on
    s2 = with_overrides(doc_with({"SourceS3Uri": "lc", "OnCreate": "utils/helper.sh"}), CAT, base=tmp_path)
    assert s2.group("login").LifeCycleConfig.SourceS3Uri == str(tmp_path / "lc")


def test_file_uri_and_timeout(tmp_path):
    d = lc_dir(tmp_path)
    s = validate(
        doc_with({"SourceS3Uri": d.as_uri(), "OnCreate": "on_create.sh", "OnCreateTimeout": 30}), CAT, base=Path("/")
    )
    assert s.group("cpu").LifeCycleConfig.SourceS3Uri == str(d)
    assert s.group("cpu").LifeCycleConfig.timeout == 30


def test_every_problem_is_named_at_once(tmp_path):
    lc_dir(tmp_path)
    doc = spec_doc("lab", [("a", "cpu.nano", 1), ("b", "cpu.nano", 1), ("c", "cpu.nano", 1), ("d", "cpu.nano", 1)])
    igs = doc["InstanceGroups"]
    igs[1]["LifeCycleConfig"] = {"SourceS3Uri": "s3://bucket/LifecycleScripts/", "OnCreate": "on_create.sh"}
    igs[2]["LifeCycleConfig"] = {"SourceS3Uri": "missing", "OnCreate": "on_create.sh"}
    igs[3]["LifeCycleConfig"] = {"SourceS3Uri": "lc", "OnCreate": "not_there.sh", "OnCreateTimeout": 0}
    igs[4]["LifeCycleConfig"] = {"SourceS3Uri": "lc", "OnCreate": "../lc/on_create.sh", "OnCreateTimeout": 86400}
    igs[5]["LifeCycleConfig"] = {"SourceS3Uri": "https://x/y", "OnCreate": "/etc/passwd", "OnCreateTimeout": -1}
    ps = problems(doc, tmp_path)
    text = "\n".join(ps)
    assert "InstanceGroups[1].LifeCycleConfig.SourceS3Uri: an s3:// URI cannot be read" in text
    assert f"InstanceGroups[2].LifeCycleConfig.SourceS3Uri: no folder '{tmp_path / 'missing'}'" in text
    assert "InstanceGroups[3].LifeCycleConfig.OnCreate: 'not_there.sh' is not a file in" in text
    assert f"InstanceGroups[3].LifeCycleConfig.OnCreateTimeout: must be between 1 and {TIMEOUT_MAX}" in text
    assert "InstanceGroups[4].LifeCycleConfig.OnCreate: '../lc/on_create.sh' must be a path inside" in text
    assert "InstanceGroups[4].LifeCycleConfig.OnCreateTimeout: must be between 1 and 3600 seconds, got 86400" in text
    assert "InstanceGroups[5].LifeCycleConfig.SourceS3Uri: only a local folder or a file:// URI" in text
    assert "InstanceGroups[5].LifeCycleConfig.OnCreate: '/etc/passwd' must be a path inside" in text
    assert "InstanceGroups[5].LifeCycleConfig.OnCreateTimeout: must be between 1 and 3600 seconds, got -1" in text
    assert len(ps) == 9, ps


def test_wrong_types_unknown_keys_and_control_characters(tmp_path):
    lc_dir(tmp_path)
    text = "\n".join(
        problems(doc_with({"SourceS3Uri": "lc", "OnCreate": "a\nb", "OnCreateTimeout": "60", "Extra": 1}), tmp_path)
    )
    assert "OnCreate: 'a\\nb' holds a control character" in text
    assert "LifeCycleConfig.OnCreateTimeout: Input should be a valid integer" in text
    assert "LifeCycleConfig.Extra: unknown key" in text
    text = "\n".join(problems(doc_with({"OnCreate": "x.sh"}), tmp_path))
    assert "LifeCycleConfig.SourceS3Uri: required" in text
    text = "\n".join(problems(doc_with({"SourceS3Uri": "file://otherhost/x", "OnCreate": ""}), tmp_path))
    assert "a file:// URI names a folder on this machine, not on 'otherhost'" in text
    assert "OnCreate: must name a script in the folder" in text


def test_a_script_that_leaves_the_folder_through_a_link_and_a_folder_over_the_bounds(tmp_path):
    d = lc_dir(tmp_path)
    (tmp_path / "outside.sh").write_text("echo out\n")
    (d / "link.sh").symlink_to(tmp_path / "outside.sh")
    ps = problems(doc_with({"SourceS3Uri": "lc", "OnCreate": "link.sh"}), tmp_path)
    assert any("'link.sh' is not a file in" in p for p in ps)
    big = tmp_path / "big"
    big.mkdir()
    (big / "on_create.sh").write_text("true\n")
    for i in range(MAX_FILES + 1):
        (big / f"f{i}").write_text("")
    ps = problems(doc_with({"SourceS3Uri": "big", "OnCreate": "on_create.sh"}), tmp_path)
    assert any(f"holds more than {MAX_FILES} files" in p for p in ps)
    (tmp_path / "plain").write_text("")
    ps = problems(doc_with({"SourceS3Uri": "plain", "OnCreate": "on_create.sh"}), tmp_path)
    assert any("no folder" in p for p in ps)


def test_a_stored_spec_from_before_keeps_its_ignored_s3_lifecycle_config_ignored():
    doc = doc_with({"SourceS3Uri": "s3://bucket/x", "OnCreate": "on_create.sh"})
    s = validate(doc, CAT, existing=True)
    assert all(g.LifeCycleConfig is None for g in s.InstanceGroups)


# -- the node's facts -------------------------------------------------------------------
def test_facts_are_hyperpods_resource_config_and_shell_files(tmp_path):
    d = lc_dir(tmp_path)
    s = validate(doc_with({"SourceS3Uri": str(d), "OnCreate": "on_create.sh", "OnCreateTimeout": 42}), CAT)
    rc = lifecycle.resource_config(s)
    assert rc["ClusterConfig"] == {"ClusterName": "lab"}
    assert [g["Name"] for g in rc["InstanceGroups"]] == ["controller", "login", "cpu"]
    cpu = rc["InstanceGroups"][2]
    assert cpu["InstanceType"] == "cpu.nano" and cpu["NodeType"] == "Compute"
    assert [i["InstanceName"] for i in cpu["Instances"]] == ["cpu-1", "cpu-2"]
    files = lifecycle.files(s, s.group("cpu"), 2, "controller-1")
    assert json.loads(files["opt/ml/config/resource_config.json"][0]) == rc
    env = files["etc/hp/node.env"][0].decode()
    assert env.splitlines() == [
        "HP_CLUSTER=lab",
        "HP_GROUP=cpu",
        "HP_NODE=cpu-2",
        "HP_NODE_TYPE=Compute",
        "HP_CONTROLLER=controller-1",
    ]
    assert files["etc/hp/nodes"][0].decode().splitlines() == [
        "controller Controller controller-1",
        "login Login login-1",
        "cpu Compute cpu-1",
        "cpu Compute cpu-2",
    ]
    assert files["opt/hp/oncreate/src/on_create.sh"] == (b"#!/bin/bash\necho hello\n", 0o755, 0)
    assert files["opt/hp/oncreate/src/utils/helper.sh"][0] == b"echo helper\n"
    assert files["opt/hp/oncreate/script"][0] == b"on_create.sh\n"
    assert files["opt/hp/oncreate/timeout"][0] == b"42\n"
    assert "opt/hp/oncreate/pending" in files
    assert lifecycle.node_env(s, s.group("cpu"), "cpu-1", "it's").splitlines()[-1] == "HP_CONTROLLER='it'\"'\"'s'"


def test_a_folder_gone_since_the_spec_was_checked_is_a_launch_error(tmp_path):
    d = lc_dir(tmp_path)
    s = validate(doc_with({"SourceS3Uri": str(d), "OnCreate": "on_create.sh"}), CAT)
    (d / "on_create.sh").unlink()
    with pytest.raises(Exception) as e:
        lifecycle.files(s, s.group("cpu"), 1, "controller-1")
    assert "LifecycleSourceUnreadable" in str(e.value) and e.value.retryable
    (d / "utils" / "helper.sh").unlink()
    (d / "utils").rmdir()
    d.rmdir()
    with pytest.raises(Exception) as e:
        lifecycle.files(s, s.group("cpu"), 1, "controller-1")
    assert "LifecycleSourceUnreadable" in str(e.value)


def test_outcome_of_a_script(tmp_path):
    d = lc_dir(tmp_path)
    lc = validate(doc_with({"SourceS3Uri": str(d), "OnCreate": "on_create.sh", "OnCreateTimeout": 9}), CAT)
    lc = lc.group("cpu").LifeCycleConfig
    log = "hp-entry: lifecycle script on_create.sh (at most 9 s)\na\nb\n"
    done = "hp-entry: lifecycle script on_create.sh exited 0 after 2.07 s\n"
    assert lifecycle.outcome(lc, b"0\n", log + done + "slurmd: started\n") == (0, ["a", "b"], None, 2.07)
    # an entry of before the run time was said: no figure
    old = "hp-entry: lifecycle script on_create.sh exited 0\n"
    assert lifecycle.outcome(lc, b"0\n", log + old) == (0, ["a", "b"], None, None)
    log = "earlier\nhp-entry: lifecycle script on_create.sh (at most 9 s)\n1\n2\n3\n4\n5\n\nno such package\n"
    rc, tail, err, took = lifecycle.outcome(
        lc, b"3\n", log + "hp-entry: lifecycle script on_create.sh exited 3 after 0.40 s\n"
    )
    assert rc == 3 and tail == ["2", "3", "4", "5", "no such package"] and took == 0.4
    assert str(err) == "LifecycleScriptFailed: exit 3: no such package (script on_create.sh)" and err.retryable
    err = lifecycle.outcome(lc, b"124\n", "waiting\n").error
    assert str(err) == "LifecycleScriptFailed: timed out after 9 s: waiting (script on_create.sh)"
    err = lifecycle.outcome(lc, b"junk\n", "").error
    assert str(err) == "LifecycleScriptFailed: exit -1: (no output) (script on_create.sh)"


# -- launches against the fakes ----------------------------------------------------------
def entry(w, rc_of: dict[str, int], polls_before: int = 0):
    """The node's entry, as the fakes see it: on its first start, a node with a pending
    script writes its result (after `polls_before` looks at it); one that fails exits."""

    def on_start(c):
        if c.files.pop("/opt/hp/oncreate/pending", None) is None:
            return
        rc = rc_of.get(c.spec.hostname, 0)
        looks = [0]
        real_get_dir = w.provider.get_dir

        def get_dir(cid, path):
            if cid == c.id and path == lifecycle.RESULT:
                looks[0] += 1
                if looks[0] <= polls_before:
                    return {}
            return real_get_dir(cid, path)

        w.provider.get_dir = get_dir
        c.logs += f"hp-entry: lifecycle script on_create.sh (at most 600 s)\nsetting up {c.spec.hostname}\n"
        c.logs += f"step {rc} done\nhp-entry: lifecycle script on_create.sh exited {rc} after 1.25 s\n"
        c.files[lifecycle.RESULT] = f"{rc}\n".encode()
        if rc:
            c.state, c.exit_code = "exited", rc

    w.provider.on_start.insert(0, on_start)


def lc_spec(w, tmp_path, **top):
    d = lc_dir(tmp_path)
    doc = doc_with({"SourceS3Uri": str(d), "OnCreate": "on_create.sh"}, groups=[("cpu", "cpu.nano", 2)], **top)
    return validate(doc, w.env.catalogue)


def made_node(tmp_path):
    """A world, the lifecycle spec, its launcher and node cpu-1's container, made (not started)."""
    w = world(tmp_path)
    s = lc_spec(w, tmp_path)
    c = Cluster(w.env, "lab", s)
    c.make_key()
    w.env.store.add_cluster("lab", s.model_dump(exclude_none=True), ClusterStatus.CREATING, "a test")
    launcher = Launcher(c, w.env.images(DEFAULT).refs())
    return w, s, launcher, launcher.create_many([(s.group("cpu"), 1)])["cpu-1"]


def events(w, name):
    return [e.description for e in w.env.store.events(name)]


def test_create_runs_the_script_on_every_node_but_the_controller_and_records_it(tmp_path, monkeypatch):
    monkeypatch.setattr(lifecycle, "PAUSE_S", 0.001)
    w = world(tmp_path)
    entry(w, {}, polls_before=3)
    create(w.env, lc_spec(w, tmp_path), CreateOptions(timeout=5))
    assert w.env.store.cluster("lab").status == "InService"
    for n in ("login-1", "cpu-1", "cpu-2"):
        f = w.provider.node("lab", n).files
        assert lifecycle.RESULT in f and "/etc/hp/node.env" in f
    assert "/opt/hp/oncreate/script" not in w.provider.node("lab", "controller-1").files
    ev = events(w, "lab")
    # the run time is the node's own figure (the entry's line), not hp's wait
    ok = [e for e in ev if e.startswith("Lifecycle script on_create.sh on cpu-2 exited 0 after 1.25 s;")]
    assert ok and ok[0].endswith("last lines: setting up cpu-2 | step 0 done")


def test_a_failing_script_rolls_an_all_or_nothing_create_back(tmp_path):
    w = world(tmp_path)
    entry(w, {"cpu-2": 3})
    with pytest.raises(OperationFailed) as e:
        create(w.env, lc_spec(w, tmp_path), CreateOptions(timeout=5))
    assert "cpu-2: LifecycleScriptFailed: exit 3: step 3 done (script on_create.sh)" in str(e.value)
    assert w.provider.containers("lab") == []
    assert w.env.store.cluster("lab").status == "Failed"
    assert any("Lifecycle script on_create.sh on cpu-2 exited 3" in d for d in events(w, "lab"))


def test_a_failing_script_in_continuous_mode_leaves_the_node_pending_and_the_others_join(tmp_path):
    w = world(tmp_path)
    entry(w, {"cpu-1": 3})
    create(w.env, lc_spec(w, tmp_path, NodeProvisioningMode="Continuous"), CreateOptions(timeout=5))
    ph = w.env.store.latest_phases("lab")
    assert ph["cpu-1"].phase == "LaunchFailed" and "LifecycleScriptFailed: exit 3" in ph["cpu-1"].message
    assert [c.name for c in w.provider.containers("lab") if c.name == "hp-lab-cpu-1"] == []  # made anew next time
    assert w.provider.node("lab", "cpu-2").state == "running"


def test_a_create_that_fails_while_scripts_run_rolls_back_without_waiting_for_them(tmp_path, monkeypatch):
    monkeypatch.setattr(lifecycle, "PAUSE_S", 0.01)
    w = world(tmp_path)
    entry(w, {}, polls_before=10**9)  # the scripts never finish
    # the controller's start fails on its thread: create hears of it once the nodes were
    # made (and theirs started)
    w.provider.fail_start = lambda c: EngineError("port conflict", 500) if "controller" in c.spec.name else None
    t0 = time.monotonic()
    with pytest.raises(OperationFailed, match="port conflict"):
        create(w.env, lc_spec(w, tmp_path, Accounting={"Enabled": False}), CreateOptions(timeout=5))
    assert time.monotonic() - t0 < 3 and w.provider.containers("lab") == []
    time.sleep(0.2)  # the early starts end once their containers are gone, and record nothing
    ph = w.env.store.latest_phases("lab")
    assert {ph[n].phase for n in ("login-1", "cpu-1", "cpu-2")} == {"Queued"}
    assert w.env.store.cluster("lab").status == "Failed"


def test_a_node_that_stops_without_a_result_or_never_answers_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(lifecycle, "PAUSE_S", 0.0)
    w, s, launcher, cid = made_node(tmp_path)
    w.provider.containers_[cid].logs = "hp-entry: lifecycle script on_create.sh\nKilled\n"
    w.provider.on_start.insert(0, lambda ct: setattr(ct, "state", "exited"))
    err = launcher.start(cid)
    assert str(err).startswith("LifecycleScriptFailed: the node stopped before its script on_create.sh finished")
    assert [c.name for c in w.provider.containers("lab") if c.name == "hp-lab-cpu-1"] == []
    # the bound: a node that never writes its result
    now = [0.0]
    lc = s.group("cpu").LifeCycleConfig
    cid = launcher.create_many([(s.group("cpu"), 2)])["cpu-2"]
    w.provider.on_start.pop(0)
    w.provider.start(cid)

    def broken_stream(cid, since=None):  # a log stream that ends (e.g. the engine's read timeout)
        f = FakeLines(["a line of the script's own: hp-entry: lifecycle script x exited 0"])
        f.close()
        return f

    w.provider.follow_logs = broken_stream

    def tick(_):
        now[0] += 100

    rc, _, err, _ = lifecycle.wait_result(w.provider, cid, lc, clock=lambda: now[0], sleep=tick)
    assert rc == -1 and str(err) == "LifecycleScriptFailed: no result within 615 s (script on_create.sh)"


def test_the_result_is_read_the_moment_the_entrys_line_comes_without_a_pause(tmp_path):
    # the entry writes DIR/rc, then says so: hp reads it at once (no PAUSE_S sleep between)
    w, s, launcher, cid = made_node(tmp_path)
    w.provider.start(cid)
    ct = w.provider.containers_[cid]

    def follow(cid, since=None):  # the script ends while hp follows the log
        ct.files["/opt/hp/oncreate/rc"] = b"0\n"
        ct.logs += "hp-entry: lifecycle script on_create.sh exited 0\n"
        return FakeLines(["hp-entry: lifecycle script on_create.sh (at most 600 s)", ct.logs.splitlines()[-1]])

    w.provider.follow_logs = follow
    pauses = []
    rc, _, err, _ = lifecycle.wait_result(w.provider, cid, s.group("cpu").LifeCycleConfig, sleep=pauses.append)
    assert (rc, err, pauses) == (0, None, [])
