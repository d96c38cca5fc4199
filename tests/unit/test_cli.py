"""The real `hp` CLI (orchestrator.cli.main), in-process, on the fakes: every command gets
the fake world's Env, nothing reaches Docker (DOCKER_HOST points at no socket; the
one place that makes its own engine, `create --dry-run`, gets the fake provider).

What a user relies on: exit codes (0 success, 1 operation failed, 2 bad input, 3 timeout),
messages naming each problem, no traceback on bad input, progress on stderr and data
on stdout, and `--json` documents valid against schemas/<command>.schema.json."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
import typer
from fakes import World, force_status, spec_doc, world

import orchestrator.cli.main as cli
from orchestrator import waits
from orchestrator.cli import ci as cli_ci
from orchestrator.cli import cluster as cli_cluster
from orchestrator.cli import common, output
from orchestrator.cli import health as cli_health
from orchestrator.cli import images as cli_images
from orchestrator.cli import recovery as cli_recovery
from orchestrator.cli import scale as cli_scale
from orchestrator.cluster import waiting
from orchestrator.cluster.create import CreateOptions, create
from orchestrator.core import capacity
from orchestrator.docker import engine as engine_mod
from orchestrator.docker.views import ExecResult
from orchestrator.health.requests import service
from orchestrator.recovery import actions
from orchestrator.releases import DEFAULT, SlurmRelease
from orchestrator.slurm.model import JobInfo
from orchestrator.spec.model import validate as validate_spec
from orchestrator.state.health_requests import Records, Result
from orchestrator.state.operations import OperationStatus
from orchestrator.state.transitions import RequestState

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Hp:
    def __init__(self, w: World, capsys: pytest.CaptureFixture[str]):
        self.w = w
        self.capsys = capsys

    def __call__(self, *args: str) -> Run:
        self.capsys.readouterr()
        old = sys.argv
        sys.argv = ["hp", *args]
        try:
            cli.main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            sys.argv = old
        o = self.capsys.readouterr()
        assert "Traceback" not in o.err, o.err
        return Run(code, o.out, o.err)

    def json(self, schema: str, *args: str, code: int = 0) -> Any:
        r = self(*args, "--json")
        assert r.code == code, r.err
        doc = r.json()
        validate(schema, doc)
        return doc


def validate(schema: str, doc: Any) -> None:
    s = json.loads((SCHEMAS / f"{schema}.schema.json").read_text())
    jsonschema.Draft202012Validator(s, format_checker=jsonschema.FormatChecker()).validate(doc)


_build_command = typer.main.get_command
_COMMAND = _build_command(cli.app)


def _get_command(app: Any) -> Any:
    """typer rebuilds hp's whole command tree (every signature) on each call, ~15 ms: built
    once here, it is the same tree (a pure function of the app), and the tests stay fast."""
    return _COMMAND if app is cli.app else _build_command(app)


@pytest.fixture
def hp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Hp:
    w = world(tmp_path)
    monkeypatch.setattr(typer.main, "get_command", _get_command)
    monkeypatch.setenv("HP_HOME", str(tmp_path / "unused-home"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/hp-ut-cli.sock")
    monkeypatch.delenv("NO_COLOR", raising=False)
    for m in (common, cli_cluster, cli_scale, cli_health, cli_recovery, cli_ci, cli_images):
        monkeypatch.setattr(m, "env", lambda: w.env)
    monkeypatch.setattr(engine_mod, "DockerEngine", lambda *a, **k: w.provider)
    monkeypatch.setattr(waiting, "POLL_S", 0.001)
    return Hp(w, capsys)


def make(hp: Hp, name: str = "lab", groups: list | None = None, **top: Any) -> None:
    """A cluster made through the library (what `hp create -f` does, tested above, without
    the command line's parsing: the tests that need a cluster stay fast)."""
    spec = validate_spec(spec_doc(name, groups, **top), hp.w.env.catalogue)
    create(hp.w.env, spec, CreateOptions(timeout=5))


# -- create ------------------------------------------------------------------------------
def test_create_the_built_in_cluster(hp: Hp) -> None:
    r = hp("create")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == "hp: InService"
    assert lines[1].split() == ["GROUP", "TYPE", "NODE", "TYPE", "CURRENT/TARGET", "STATUS", "PARTITIONS"]
    assert [ln.split()[0] for ln in lines[2:]] == ["controller", "login", "cpu-a", "cpu-b"]
    assert "2/2" in lines[4] and "InService" in lines[4]
    assert "controller: controller-1" in r.err and r.err.rstrip().endswith("cluster hp is InService")
    assert "nodes: cpu-a 2/2  cpu-b 2/2" in r.err  # per-group progress
    assert not any(c in r.out for c in "┏━│")  # no box drawing when not a terminal
    assert hp.w.env.store.cluster("hp").status == "InService" and hp.w.agents.ensured == ["hp"]


def test_create_from_a_file_with_overrides_as_json(hp: Hp, tmp_path: Path) -> None:
    f = tmp_path / "lab.yaml"
    f.write_text(
        "ClusterName: lab\nInstanceGroups:\n"
        "  - {InstanceGroupName: controller, InstanceType: cpu.small, InstanceCount: 1, SlurmConfig: {NodeType: Controller}}\n"
        "  - {InstanceGroupName: gpu-less, InstanceType: cpu.nano, InstanceCount: 2, SlurmConfig: {NodeType: Compute, PartitionNames: [p1]}}\n"
    )
    doc = hp.json("create", "create", "-f", str(f), "--name", "other", "--mode", "continuous")
    assert doc["ClusterName"] == "other" and doc["NodeProvisioningMode"] == "Continuous"
    assert [g["InstanceGroupName"] for g in doc["InstanceGroups"]] == ["controller", "gpu-less"]
    assert hp.w.env.store.cluster("lab") is None and hp.w.env.store.cluster("other") is not None
    doc = hp.json("create", "create", "-f", str(f), "--mode", "all-or-nothing", "--no-wait")
    assert doc["ClusterName"] == "lab" and doc["NodeProvisioningMode"] == "AllOrNothing"


def test_create_dry_run_creates_nothing(hp: Hp) -> None:
    r = hp("create", "--dry-run", "--name", "dry")
    assert r.code == 0 and r.out == ""
    assert r.err.strip() == "spec of cluster dry is valid; nothing was created"
    assert hp.w.provider.containers_ == {} and hp.w.env.store.cluster("dry") is None
    doc = json.loads(hp("create", "--dry-run", "--json").out)
    validate("cluster-spec", doc)  # the spec hp would create, in the input's shape
    assert doc["ClusterName"] == "hp" and len(doc["InstanceGroups"]) == 4
    assert hp.w.provider.containers_ == {}


def test_create_dry_run_json_matches_the_create_schema(hp: Hp) -> None:
    validate("create", json.loads(hp("create", "--dry-run", "--json").out))


def test_create_dry_run_checks_the_hosts_capacity_when_an_engine_answers(hp: Hp, tmp_path: Path) -> None:
    f = tmp_path / "big.json"
    f.write_text(json.dumps(spec_doc("big", [("cpu", "cpu.large", 40)])))
    r = hp("create", "-f", str(f), "--dry-run")
    assert r.code == 2
    assert (
        r.err.startswith("error: cannot create: ")
        and "40 node(s) of cpu.large are more than this host can ever run: 8" in r.err
    )
    hp.w.provider.up = False
    r = hp("create", "-f", str(f), "--dry-run")
    assert r.code == 0 and "note: no Docker engine answers: the host's capacity was not checked" in r.err


def test_a_bad_spec_is_refused_with_every_problem_and_nothing_is_made(hp: Hp, tmp_path: Path) -> None:
    doc = spec_doc("bad_name", [("cpu", "x.huge", 1)])
    doc["InstanceGroups"][0]["InstanceCount"] = 0
    doc["InstanceGroups"][2]["InstanceCount"] = "many"
    doc["Foo"] = 1
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    r = hp("create", "-f", str(f), "--timeout", "0", "--mode", "sometimes")
    assert r.code == 2 and r.out == ""
    first, *items = r.err.splitlines()
    assert first.startswith("error: invalid cluster spec: ") and first.endswith(" problems")
    assert int(first.split()[-2]) == len(items) >= 6
    text = "\n".join(items)
    for want in (
        "--timeout must be positive, got 0",
        "--mode must be continuous or all-or-nothing, got 'sometimes'",
        "Foo",
        "bad_name",
        "InstanceGroups[0].InstanceCount",
        "InstanceGroups[2].InstanceCount",
    ):
        assert want in text, want
    assert all(i.startswith("  - ") for i in items)
    assert hp.w.provider.containers_ == {} and hp.w.env.store.clusters() == []


def test_create_bad_files_and_options(hp: Hp, tmp_path: Path) -> None:
    r = hp("create", "-f", str(tmp_path / "missing.yaml"))
    assert r.code == 2 and "cannot read spec file" in r.err and "missing.yaml" in r.err
    (tmp_path / "broken.yaml").write_text("ClusterName: [unclosed\n")
    r = hp("create", "-f", str(tmp_path / "broken.yaml"))
    assert r.code == 2 and r.err.startswith("error: invalid cluster spec:")
    r = hp("create", "--timeout", "0")
    assert r.code == 2 and r.err.strip() == "error: invalid cluster spec: --timeout must be positive, got 0"
    r = hp("create", "--timeout", "soon")
    assert r.code == 2 and "Invalid value for '--timeout'" in r.err


def test_create_that_cannot_be_provisioned_fails_and_a_name_in_use_is_bad_input(hp: Hp) -> None:
    capacity.set_limit(hp.w.env.store, "cpu.small", 3)
    r = hp("create")
    assert r.code == 1 and "all-or-nothing provisioning failed" in r.err
    assert hp.w.provider.containers("hp") == []  # rolled back
    capacity.set_limit(hp.w.env.store, "cpu.small", None)
    assert hp("create").code == 0
    r = hp("create")
    assert r.code == 2 and "already exists" in r.err


# -- list, describe, nodes -----------------------------------------------------------------
def test_list_table_and_json_and_the_agents_are_kept_alive(hp: Hp) -> None:
    assert hp("list").out.splitlines() == ["NAME  STATUS  CREATED"]
    make(hp, "lab")
    make(hp, "lab2")
    hp.w.agents.ensured.clear()
    r = hp("list")
    assert [ln.split()[:2] for ln in r.out.splitlines()] == [
        ["NAME", "STATUS"],
        ["lab", "InService"],
        ["lab2", "InService"],
    ]
    assert hp.w.agents.ensured == ["lab", "lab2"]
    doc = hp.json("list", "list")
    assert doc["EngineReachable"] is True and [c["ClusterName"] for c in doc["ClusterSummaries"]] == ["lab", "lab2"]


def test_list_without_an_engine_shows_the_last_recorded_statuses(hp: Hp) -> None:
    make(hp)
    hp.w.provider.up = False
    hp.w.agents.ensured.clear()
    r = hp("list")
    assert r.code == 0
    assert "warning: the Docker engine does not answer: statuses are the last recorded ones" in r.err
    assert "lab" in r.out and "InService" in r.out
    doc = hp.json("list", "list")
    assert doc["EngineReachable"] is False
    assert doc["ClusterSummaries"][0]["StatusNote"] == "last recorded: the Docker engine does not answer"
    assert hp.w.agents.ensured == []  # no agent is started against an engine that is not there


def test_describe(hp: Hp) -> None:
    make(hp)
    r = hp("describe", "lab")
    assert r.code == 0 and r.out.splitlines()[0] == "lab: InService"
    assert r.out.rstrip().endswith("agent: alive (pid 1)")
    doc = hp.json("describe", "describe", "lab")
    assert doc["Agent"] == {"Alive": True, "Pid": 1, "Restarted": False}
    assert doc["SlurmControllerHost"] == "controller-1" and doc["ControllerReachable"] is True
    hp.w.agents.ensure = lambda n: {"Alive": True, "Pid": 4242, "Restarted": True}  # type: ignore[method-assign]
    assert "agent: restarted (pid 4242)" in hp("describe", "lab").out
    r = hp("describe", "nope")
    assert (r.code, r.err.strip()) == (2, "error: cluster 'nope' does not exist (see 'hp list')")


def test_describe_shows_the_failure_of_a_failed_cluster(hp: Hp) -> None:
    make(hp)
    force_status(hp.w.env.store, "lab", "Failed", "controller controller-1 could not be started")
    assert hp("describe", "lab").out.splitlines()[0] == "lab: Failed (controller controller-1 could not be started)"


def test_nodes(hp: Hp) -> None:
    make(hp)
    hp.w.slurm.set("cpu-2", "IDLE", "DRAIN", reason="maintenance by admin")
    r = hp("nodes", "lab")
    rows = {ln.split()[0]: ln for ln in r.out.splitlines()[1:]}
    assert r.out.split()[:7] == ["NODE", "GROUP", "TYPE", "STATUS", "SLURM", "NODE", "ID"]
    assert set(rows) == {"controller-1", "login-1", "cpu-1", "cpu-2"}
    assert (
        " idle " in rows["cpu-1"] and "idle+drain" in rows["cpu-2"] and rows["cpu-2"].endswith("maintenance by admin")
    )
    assert " n/a " in rows["controller-1"]
    r = hp("nodes", "lab", "--group", "cpu")
    assert [ln.split()[0] for ln in r.out.splitlines()[1:]] == ["cpu-1", "cpu-2"]
    doc = hp.json("nodes", "nodes", "lab", "-g", "cpu")
    assert [n["SlurmNodeName"] for n in doc["ClusterNodeSummaries"]] == ["cpu-1", "cpu-2"]
    r = hp("nodes", "lab", "--group", "gpu")
    assert r.code == 2 and "has no instance group 'gpu'" in r.err and "controller, login, cpu" in r.err
    r = hp("nodes", "nope")
    assert r.code == 2 and "cluster 'nope' does not exist" in r.err


# -- exec ----------------------------------------------------------------------------------
@pytest.fixture
def execs(hp: Hp) -> list[dict[str, Any]]:
    make(hp)
    seen: list[dict[str, Any]] = []
    p = hp.w.provider
    real = p.exec_stream

    def stream(container: str, cmd: list[str], **kw: Any) -> Any:
        seen.append({"container": container, "cmd": cmd, **kw})
        return real(container, cmd, **kw)

    p.exec_stream = stream  # type: ignore[method-assign]
    p.exec_handler = lambda c, cmd: ExecResult(7 if cmd[0] == "false" else 0, f"{c.spec.name}: {' '.join(cmd)}\n")
    return seen


def test_exec_runs_on_the_login_node_as_the_default_user_and_exits_with_its_code(hp: Hp, execs: list) -> None:
    r = hp("exec", "lab", "--", "srun", "-N2", "hostname")
    assert (r.code, r.out) == (0, "hp-lab-login-1: srun -N2 hostname\n")
    assert execs == [
        {
            "container": "hp-lab-login-1",
            "cmd": ["srun", "-N2", "hostname"],
            "user": "hpuser",
            "workdir": "/home/hpuser",
            "environment": {"HOME": "/home/hpuser", "USER": "hpuser"},
        }
    ]
    # one call: the login node made the shared home when it booted (images/node/hp-entry)
    assert not [c for c in hp.w.provider.calls if c[1].startswith("install")]
    assert hp("exec", "lab", "--", "false").code == 7
    # the controller has no shared /home: the default user's home is made there first
    assert hp("exec", "lab", "--node", "controller-1", "--", "true").code == 0
    assert ("exec", "install -d -o hpuser -g hpuser /home/hpuser") in hp.w.provider.calls


def test_exec_on_a_chosen_node_as_root(hp: Hp, execs: list) -> None:
    before = len([c for c in hp.w.provider.calls if c[1].startswith("install")])
    r = hp("exec", "lab", "--node", "cpu-2", "--root", "--", "id", "-u")
    assert (r.code, r.out) == (0, "hp-lab-cpu-2: id -u\n")
    assert execs[-1]["user"] == "root" and execs[-1]["workdir"] == "/root" and execs[-1]["environment"] is None
    assert len([c for c in hp.w.provider.calls if c[1].startswith("install")]) == before  # root needs no home
    assert hp("exec", "lab", "-n", "hp-lab-cpu-1", "--", "true").out.startswith("hp-lab-cpu-1:")  # by container name


def test_exec_bad_input(hp: Hp, execs: list) -> None:
    r = hp("exec", "lab")
    assert r.code == 2 and "Missing argument" in r.err
    r = hp("exec", "lab", "--", "--")
    assert (r.code, r.err.strip()) == (2, "error: invalid input: no command given: hp exec NAME -- CMD...")
    r = hp("exec", "lab", "--node", "cpu-9", "--", "true")
    assert r.code == 2 and "cluster 'lab' has no node 'cpu-9' (nodes: controller-1, cpu-1, cpu-2, login-1)" in r.err
    r = hp("exec", "nope", "--", "true")
    assert r.code == 2 and "cluster 'nope' does not exist" in r.err
    hp.w.provider.die("lab", "cpu-1")
    r = hp("exec", "lab", "--node", "cpu-1", "--", "true")
    assert r.code == 1 and "node cpu-1 of cluster 'lab' is not running (container exited, exit code 137)" in r.err
    assert execs == []  # nothing ran


def test_exec_falls_back_to_the_controller_without_a_login_node(hp: Hp) -> None:
    make(hp, "nologin", login=False)
    hp.w.provider.exec_handler = lambda c, cmd: ExecResult(0, c.spec.name + "\n")
    assert hp("exec", "nologin", "--", "hostname").out == "hp-nologin-controller-1\n"


# -- delete, version -------------------------------------------------------------------------
def test_delete(hp: Hp) -> None:
    make(hp)
    make(hp, "lab2")
    r = hp("delete", "lab")
    # with accounting (the default, in the controller's container): the database's volume
    assert r.code == 0 and r.err.strip() == "deleted cluster lab: 4 containers, 1 networks, 3 volumes"
    assert hp.w.provider.containers("lab") == [] and hp.w.env.store.cluster("lab") is None
    doc = hp.json("delete", "delete", "lab2")
    assert doc == {"ClusterName": "lab2", "Removed": {"containers": 4, "networks": 1, "volumes": 3}}
    r = hp("delete", "lab")
    assert (r.code, r.err.strip()) == (2, "error: cluster 'lab' does not exist (see 'hp list')")
    # --missing-ok (make demo's first step, a CI cleanup): no error, exit 0, nothing changed
    r = hp("delete", "lab", "--missing-ok")
    assert (r.code, r.out, r.err) == (0, "", "no cluster lab: nothing to delete\n")
    doc = hp.json("delete", "delete", "lab", "--missing-ok")
    assert doc == {"ClusterName": "lab", "Removed": {"containers": 0, "networks": 0, "volumes": 0}}
    make(hp, "lab3")
    r = hp("delete", "lab3", "--missing-ok")  # one that exists is deleted as without it
    assert r.code == 0 and r.err.strip() == "deleted cluster lab3: 4 containers, 1 networks, 3 volumes"
    assert hp.w.provider.containers("lab3") == [] and hp.w.env.store.cluster("lab3") is None


def test_version(hp: Hp, monkeypatch: pytest.MonkeyPatch) -> None:
    r = hp("version", "--images")
    lines = r.out.splitlines()
    assert r.code == 0 and lines[0].startswith("hp ") and "(Python " in lines[0]
    other = next(rel for rel in SlurmRelease if rel is not DEFAULT)  # the fakes have the default's base only
    assert f"Slurm {DEFAULT} (the default): 24.11.5-4" in lines  # the fake image's dpkg database says 24.11.5-4
    assert f"Slurm {other}: unknown (images not built)" in lines
    assert sorted(ln.split(":")[0] for ln in lines if ln.startswith("  image ")) == [
        "  image controller",
        "  image login",
        "  image worker",
    ]
    doc = hp.json("version", "version", "--images")
    assert doc["slurm"] == "24.11.5-4" and doc["releases"][DEFAULT]["slurm"] == "24.11.5-4"
    assert doc["releases"][other]["images"] is None and "no base image" in doc["releases"][other]["note"]
    hp.w.provider.up = False
    r = hp("version", "--images")
    assert (
        r.code == 0
        and f"Slurm {DEFAULT} (the default): unknown (images not built)" in r.out
        and "note: cannot reach a Docker engine" in r.out
    )
    hp.json("version", "version", "--images")

    def no_env() -> None:
        raise AssertionError("plain `hp version` asks no engine and opens no state")

    monkeypatch.setattr(cli_cluster, "env", no_env)
    r = hp("version")
    assert r.code == 0 and len(r.out.splitlines()) == 1 and r.out.startswith("hp ") and "(Python " in r.out
    assert set(hp.json("version", "version")) == {"hp", "python"}


# -- scale, add-nodes, delete-nodes ----------------------------------------------------------
def test_scale_and_add_nodes_return_at_once(hp: Hp) -> None:
    make(hp)
    r = hp("scale", "lab", "cpu", "3")
    assert (r.code, r.err.strip()) == (0, "lab/cpu: target 2 -> 3")
    assert "lab" in hp.w.agents.poked  # the agent does the work
    doc = hp.json("add-nodes", "add-nodes", "lab", "cpu", "2")
    assert (doc["PreviousCount"], doc["TargetCount"]) == (3, 5)
    doc = hp.json("scale", "scale", "lab", "cpu", "1")
    assert doc["TargetCount"] == 1
    assert [c.node for c in hp.w.provider.containers("lab") if c.group == "cpu"]  # nothing removed by the CLI


def test_a_negative_count_is_refused_as_a_count_not_an_option(hp: Hp) -> None:
    make(hp)
    r = hp("scale", "lab", "cpu", "-5")
    assert (r.code, r.err.strip()) == (2, "error: cannot scale: the count must be >= 0, got -5")
    r = hp("add-nodes", "lab", "cpu", "-5")
    assert r.code == 2 and "must be positive, got -5" in r.err and "No such option" not in r.err
    r = hp("add-nodes", "lab", "cpu", "0")
    assert r.code == 2 and "must be positive, got 0" in r.err


def test_scale_bad_input(hp: Hp) -> None:
    make(hp)
    r = hp("scale", "lab", "gpu", "3")
    assert r.code == 2 and "has no instance group 'gpu'" in r.err
    r = hp("scale", "nope", "cpu", "3")
    assert r.code == 2 and "'nope' does not exist" in r.err
    r = hp("scale", "lab", "cpu", "many")
    assert r.code == 2 and "Invalid value" in r.err
    r = hp("scale", "lab", "cpu", "3", "--wait", "--timeout", "0")
    assert (r.code, r.err.strip()) == (2, "error: invalid input: --timeout must be positive, got 0")
    assert hp.w.env.store.cluster("lab").spec["InstanceGroups"][2]["InstanceCount"] == 2  # unchanged


def test_scale_wait_shows_progress_and_times_out_with_exit_3(hp: Hp) -> None:
    make(hp)
    store = hp.w.env.store

    def agent_pass(name: str) -> None:  # what the cluster's agent does with a scale that changes nothing
        for op in store.operations(name):
            store.end_operation(op.id, OperationStatus.DONE)

    hp.w.agents.poke = agent_pass  # type: ignore[method-assign]
    r = hp("scale", "lab", "cpu", "2", "--wait", "--timeout", "5")
    assert r.code == 0 and r.err.splitlines() == ["cpu 2/2", "lab/cpu: target 2 -> 2"]
    hp.w.agents.poke = lambda name: None  # type: ignore[method-assign]
    r = hp("scale", "lab", "cpu", "4", "--wait", "--timeout", "0.05")  # the fake agent never acts
    assert r.code == 3 and "error: timed out after 0.05 s: cpu 2/4" in r.err


def test_delete_nodes(hp: Hp) -> None:
    make(hp, groups=[("cpu", "cpu.nano", 3)])
    r = hp("delete-nodes", "lab", "cpu-1")
    assert (r.code, r.err.strip()) == (0, "removing cpu-1")
    doc = hp.json("delete-nodes", "delete-nodes", "lab", "cpu-2")
    assert doc["NodesToDelete"] == ["cpu-2"]
    r = hp("delete-nodes", "lab", "cpu-9", "cpu-3")
    assert r.code == 2 and "cpu-9" in r.err
    r = hp("delete-nodes", "lab")
    assert r.code == 2 and "Missing argument" in r.err


# -- events ----------------------------------------------------------------------------------
def test_events(hp: Hp) -> None:
    make(hp)
    hp("scale", "lab", "cpu", "3")
    r = hp("events", "lab")
    lines = r.out.splitlines()
    assert r.code == 0 and len(lines) >= 2
    assert "Cluster" in lines[0] and "creation started" in lines[0]
    assert lines[-1].split()[1:4] == ["Info", "InstanceGroup", "cpu"] and lines[-1].endswith("from 2 to 3")
    assert hp("events", "lab", "--limit", "1").out.splitlines() == [lines[-1]]
    doc = hp.json("events", "events", "lab", "-n", "2")
    assert doc["ClusterName"] == "lab" and len(doc["Events"]) == 2
    for bad in ("0", "10001"):
        r = hp("events", "lab", "--limit", bad)
        assert (r.code, r.err.strip()) == (2, f"error: invalid input: --limit must be between 1 and 10000, got {bad}")
    r = hp("events", "nope")
    assert (r.code, r.err.strip()) == (2, "error: cluster 'nope' does not exist (see 'hp list')")


def test_operations_list_describe_supersede_and_bad_input(hp: Hp) -> None:
    make(hp, groups=[("cpu", "cpu.nano", 2)])
    first = hp.json("scale", "scale", "lab", "cpu", "3")["OperationId"]
    second = hp.json("add-nodes", "add-nodes", "lab", "cpu", "2")["OperationId"]
    third = hp.json("delete-nodes", "delete-nodes", "lab", "cpu-1")["OperationIds"]
    ops = hp.json("operations", "operations", "lab")["Operations"]
    assert [(o["OperationId"], o["OperationType"], o["Status"]) for o in ops] == [
        (first, "Scale", "Superseded"),
        (second, "AddNodes", "Superseded"),
        (third[0], "DeleteNodes", "InProgress"),
    ]
    assert ops[0]["Message"] == f"superseded by operation {second}" and ops[0]["EndTime"] and not ops[2]["EndTime"]
    doc = hp.json("operations", "operations", "describe", "lab", str(third[0]))["Operation"]
    assert doc["Nodes"] == ["cpu-1"]
    assert doc["InstanceGroups"] == [
        {"InstanceGroupName": "cpu", "CurrentCount": 1, "MinCount": None, "TargetCount": 4, "PreviousCount": 5}
    ]  # cpu-1 is being removed: cpu-2 alone is Running
    assert [e["SlurmNodeName"] for e in doc["Events"]] == ["cpu-1"]
    desc = hp.json("operations", "operations", "describe", "lab", str(first))["Operation"]
    assert [e["Description"] for e in desc["Events"]] == [
        "Scaling instance group cpu in cluster lab from 2 to 3",
        f"Operation {first} (Scale of instance group cpu) superseded by operation {second}",
    ]
    # hp events says which operation each event was written under
    evs = hp.json("events", "events", "lab")["Events"]
    assert [e["OperationId"] for e in evs[-2:]] == [second, third[0]]  # superseded, then cpu-1's removal
    assert hp("events", "lab").out.splitlines()[-1].split()[4:6] == ["op", str(third[0])]
    r = hp("operations", "lab")
    assert r.code == 0 and [line.split()[:3] for line in r.out.splitlines()] == [
        [str(first), "Superseded", "Scale"],
        [str(second), "Superseded", "AddNodes"],
        [str(third[0]), "InProgress", "DeleteNodes"],
    ]
    r = hp("operations", "describe", "lab", str(third[0]))
    assert r.code == 0 and r.out.splitlines()[2].split() == ["cpu", "1", "-", "4", "5"]
    for args, problems in [
        (("describe", "lab"), ["takes NAME and ID, got 1 argument(s)"]),
        (("describe", "lab", "x", "y"), ["takes NAME and ID, got 3 argument(s)"]),
        (("describe", "lab", "0"), ["ID must be an operation's number (see 'hp operations lab'), got '0'"]),
        (("lab", "more"), ["'hp operations' takes NAME (or: describe NAME ID), got 'lab more'"]),
    ]:
        r = hp("operations", *args)
        assert r.code == 2 and all(p in r.err for p in problems), (args, r.err)
    r = hp("operations", "describe", "lab", "99")
    assert (r.code, r.err.strip()) == (2, "error: cluster 'lab' has no operation 99 (see 'hp operations lab')")
    r = hp("operations", "nope")
    assert (r.code, r.err.strip()) == (2, "error: cluster 'nope' does not exist (see 'hp list')")


def test_events_of_a_deleted_cluster_are_still_there(hp: Hp) -> None:
    make(hp)
    hp("delete", "lab")
    r = hp("events", "lab")
    assert r.code == 0 and "creation started" in r.out


def test_events_follow_prints_one_line_per_event(hp: Hp) -> None:
    make(hp)
    store = hp.w.env.store
    later = [ev for ev in store.events("lab", limit=1)]  # stands in for what follow_events would wait for
    store.follow_events = lambda name, after_id, poll: iter(later)  # type: ignore[method-assign]
    hp.w.agents.ensured.clear()
    r = hp("events", "lab", "--follow", "--limit", "2")
    assert r.code == 0 and len(r.out.splitlines()) == 3 and hp.w.agents.ensured == ["lab"]
    r = hp("events", "lab", "-f", "-n", "1", "--json")
    docs = [json.loads(ln) for ln in r.out.splitlines()]
    assert len(docs) == 2 and all(set(d) >= {"EventTime", "EventLevel", "Description"} for d in docs)
    validate("events", {"ClusterName": "lab", "Events": docs})  # each line is one of the documented events


# -- capacity --------------------------------------------------------------------------------
def test_capacity_set_show_and_clear(hp: Hp) -> None:
    make(hp)
    make(hp, "lab2")
    hp.w.agents.poked.clear()
    r = hp("capacity", "set", "cpu.nano", "4")
    assert (r.code, r.err.strip()) == (0, "cpu.nano: at most 4 node(s)")
    assert hp.w.agents.poked == ["lab", "lab2"]  # waiting clusters retry now
    r = hp("capacity", "show")
    first, second, *table = r.out.splitlines()
    assert first.startswith("pool: 32 CPU, 16384 MiB, GPUs none; used: ") and first.endswith("GPUs none")
    assert second.startswith("GPU discovery: ")
    rows = {ln.split()[0]: ln.split()[1:] for ln in table[1:]}
    assert rows["cpu.nano"] == ["6", "4"] and rows["cpu.small"] == ["2", "-"]
    doc = hp.json("capacity-show", "capacity", "show")
    assert {t["InstanceType"]: t["Limit"] for t in doc["Types"]}["cpu.nano"] == 4
    r = hp("capacity", "set", "cpu.nano", "--clear")
    assert (r.code, r.err.strip()) == (0, "cpu.nano: no limit")
    assert "cpu.nano    6        -" in hp("capacity", "show").out


def test_capacity_bad_input(hp: Hp) -> None:
    r = hp("capacity", "set", "cpu.huge", "4")
    assert r.code == 2 and "cpu.huge" in r.err
    r = hp("capacity", "set", "cpu.nano")
    assert r.code == 2 and r.err.startswith("error: ")
    r = hp("capacity", "set", "cpu.nano", "-1")
    assert r.code == 2


def test_capacity_release_gpu(hp: Hp) -> None:
    r = hp("capacity", "release-gpu")
    assert (r.code, r.err.strip()) == (2, "error: cannot release GPUs: give GPU ids or --all")
    r = hp("capacity", "release-gpu", "GPU-1", "--all")
    assert r.code == 2
    capacity.quarantine(hp.w.env.store, ["GPU-aaaa", "GPU-bbbb"], "uncorrectable ECC")
    assert "quarantined GPU GPU-aaaa: uncorrectable ECC" in hp("capacity", "show").out
    r = hp("capacity", "release-gpu", "GPU-zzzz")
    assert r.code == 2 and "not quarantined: GPU-zzzz (quarantined: GPU-aaaa, GPU-bbbb)" in r.err
    r = hp("capacity", "release-gpu", "GPU-aaaa")
    assert (r.code, r.err.strip()) == (0, "back in the pool: GPU-aaaa")
    r = hp("capacity", "release-gpu", "--all")
    assert r.err.strip() == "back in the pool: GPU-bbbb" and capacity.quarantined(hp.w.env.store) == {}


# -- reboot, replace -------------------------------------------------------------------------
def test_reboot_and_replace(hp: Hp) -> None:
    make(hp)
    old = hp.w.provider.node("lab", "cpu-2").id
    r = hp("reboot", "lab", "cpu-1", "--timeout", "5")
    assert r.code == 0, r.err
    header, row = r.out.splitlines()
    assert header.split() == ["NODE", "ACTION", "RESULT", "NODE", "ID"]
    assert row.split()[:5] == ["cpu-1", "reboot", "back", "in", "service"]
    doc = hp.json("replace", "replace", "lab", "cpu-2", "--timeout", "5", "--reason", "bad DIMM")
    [row] = doc["Nodes"]
    assert row["Succeeded"] and row["Action"] == "replace" and row["NodeId"] != f"i-{old[:17]}"
    doc = hp.json("reboot", "reboot", "lab", "controller-1", "--timeout", "5")
    assert doc["Nodes"][0]["SlurmNodeName"] == "controller-1"
    # each request by hand is an operation, ended with how it went
    ops = hp.json("operations", "operations", "lab")["Operations"]
    assert [(o["OperationType"], o["Status"], o["InstanceGroupName"]) for o in ops] == [
        ("Reboot", "Done", "cpu"),
        ("Replace", "Done", "cpu"),
        ("Reboot", "Done", "controller"),
    ]
    replace = hp.json("operations", "operations", "describe", "lab", str(ops[1]["OperationId"]))["Operation"]
    assert replace["Nodes"] == ["cpu-2"] and replace["EndTime"] is not None
    assert replace["Events"] and {e["OperationId"] for e in replace["Events"]} == {ops[1]["OperationId"]}


def test_reboot_and_replace_bad_input(hp: Hp) -> None:
    make(hp)
    r = hp("reboot", "lab", "cpu-9", "bad", "--timeout", "0")
    assert r.code == 2 and r.err.startswith("error: cannot reboot: 3 problems")
    assert "--timeout must be positive, got 0" in r.err and "no node 'cpu-9'" in r.err and "no node 'bad'" in r.err
    r = hp("replace", "lab", "controller-1")
    assert (r.code, r.err.strip()) == (
        2,
        "error: cannot replace: controller-1 is the controller: it can be rebooted "
        "('hp reboot lab controller-1'), not replaced (its state lives on its volume)",
    )
    r = hp("replace", "nope", "cpu-1")
    assert r.code == 2 and "'nope' does not exist" in r.err
    r = hp("reboot", "lab")
    assert r.code == 2 and "Missing argument" in r.err


def test_a_node_that_does_not_come_back_fails_the_command(hp: Hp, monkeypatch: pytest.MonkeyPatch) -> None:
    make(hp)
    hp.w.slurm.auto_register = False  # the rebooted slurmd never registers again
    hp.w.slurm.nodes_.pop("cpu-1")
    monkeypatch.setattr(actions, "POLL_S", 0.005)
    r = hp("reboot", "lab", "cpu-1", "--timeout", "0.05")
    assert r.code == 1
    assert "FAILED" in r.out and "1 node(s) not back in service after reboot: cpu-1" in r.err


# -- health checks ---------------------------------------------------------------------------
@pytest.fixture
def worker(hp: Hp, monkeypatch: pytest.MonkeyPatch):
    """`health-check start` starts its worker detached: a `sleep` in its own session
    stands in for it (cancel must stop it), and `finish` decides how the check ends."""
    started: list[subprocess.Popen] = []
    finish: dict[str, Any] = {}

    def popen(argv: list[str], **kw: Any) -> subprocess.Popen:
        assert argv[1:3] == ["-m", "orchestrator.health.requests.worker"]
        name, rid = argv[3], argv[4]
        if finish:
            rec = Records(hp.w.env.store)
            for node, state in finish["results"].items():
                rec.result(
                    rid,
                    name,
                    Result(
                        node,
                        "cpu",
                        "InstanceStress",
                        "initial",
                        state,
                        1e9,
                        1e9 + 5,
                        finish.get("reasons", {}).get(node, []),
                        {"bogo_ops_per_s": 1234.5678},
                        "out.log",
                    ),
                )
            rec.set_verdicts(rid, {n: f"{s.lower()}" for n, s in finish["results"].items()}, finish["results"])
            rec.set_state(rid, RequestState.RUNNING)
            rec.set_state(rid, RequestState.COMPLETED, "")
        p = subprocess.Popen(["sleep", "30"], start_new_session=True, stdin=subprocess.DEVNULL)
        started.append(p)
        return p

    monkeypatch.setattr(
        service, "subprocess", SimpleNamespace(Popen=popen, DEVNULL=subprocess.DEVNULL, STDOUT=subprocess.STDOUT)
    )
    make(hp)
    yield SimpleNamespace(started=started, finish=finish)
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(5)


def test_health_check_status_before_any(hp: Hp, worker: Any) -> None:
    r = hp("health-check", "status", "lab")
    assert (r.code, r.out) == (0, "lab: no health check yet\n")
    r = hp("health-check", "status", "nope")
    assert r.code == 2 and "'nope' does not exist" in r.err


def test_health_check_status_json_before_any_matches_its_schema(hp: Hp, worker: Any) -> None:
    r = hp("health-check", "status", "lab", "--json")
    assert r.code == 0 and r.json() == {"ClusterName": "lab", "Request": None}
    validate("health-check-status", r.json())


def test_health_check_start_status_cancel(hp: Hp, worker: Any) -> None:
    r = hp("health-check", "start", "lab", "--group", "cpu", "--check", "InstanceStress", "--stress-seconds", "2")
    assert r.code == 0
    rid = r.out.strip()
    assert rid.startswith("hc-") and len(worker.started) == 1
    doc = hp.json("health-check-status", "health-check", "status", "lab")
    req = doc["Request"]
    assert req["Id"] == rid and req["State"] == "Pending" and req["Nodes"] == ["cpu-1", "cpu-2"]
    r = hp("health-check", "status", "lab", "--request", rid)
    assert r.out.startswith(f"{rid}: Pending  checks InstanceStress  started ")
    r = hp("health-check", "status", "lab", "--request", "hc-nope")
    assert r.code == 2 and "has no health check 'hc-nope'" in r.err
    r = hp("health-check", "start", "lab", "--group", "cpu", "--check", "InstanceStress")
    assert r.code == 1 and f"already has an active health check {rid}" in r.err
    [op] = hp.json("operations", "operations", "lab")["Operations"]
    assert (op["OperationType"], op["Status"], op["InstanceGroupName"]) == ("HealthCheck", "InProgress", "cpu")
    r = hp("health-check", "cancel", "lab")
    assert (r.code, r.out) == (0, f"cancelled {rid}\n")
    [op] = hp.json("operations", "operations", "lab")["Operations"]
    assert op["Status"] == "Failed" and op["EndTime"] is not None
    events = hp.json("operations", "operations", "describe", "lab", str(op["OperationId"]))["Operation"]["Events"]
    assert [rid in e["Description"] for e in events] == [True, True]  # requested, cancelled
    assert worker.started[0].wait(5) == -signal.SIGTERM  # its worker was stopped
    assert hp.json("health-check-status", "health-check", "status", "lab")["Request"]["State"] == "Cancelled"
    r = hp("health-check", "cancel", "lab")
    assert (r.code, r.err.strip()) == (2, "error: cluster 'lab' has no active health check")


def test_health_check_start_json_and_bad_requests(hp: Hp, worker: Any) -> None:
    r = hp("health-check", "start", "lab", "--stress-seconds", "0", "--dcgm-level", "9")
    assert r.code == 2 and r.err.startswith("error: invalid health-check request: 2 problems")
    assert "--stress-seconds" in r.err and "--dcgm-level" in r.err
    r = hp("health-check", "start", "lab", "--group", "gpu", "--node", "cpu-9", "--check", "Bogus")
    assert r.code == 2 and "'gpu' is not a compute instance group" in r.err and "'cpu-9' is not a worker node" in r.err
    assert "Bogus" in r.err
    r = hp("health-check", "start", "nope")
    assert r.code == 2 and "'nope' does not exist" in r.err
    assert worker.started == []  # nothing started for a bad request
    doc = hp.json("health-check-start", "health-check", "start", "lab", "--node", "cpu-1", "--check", "InstanceStress")
    assert doc["ClusterName"] == "lab" and doc["RequestId"].startswith("hc-")


def test_health_check_wait_shows_the_results_and_the_exit_code_says_if_all_passed(hp: Hp, worker: Any) -> None:
    worker.finish.update(results={"cpu-1": "Passed", "cpu-2": "Passed"})
    r = hp("health-check", "start", "lab", "--check", "InstanceStress", "--wait", "--timeout", "5")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert ": Completed  checks InstanceStress" in lines[0] and "ended" in lines[0]
    assert lines[1].split() == [
        "GROUP",
        "NODE",
        "CHECK",
        "ATTEMPT",
        "STATE",
        "START",
        "END",
        "WHY",
        "/",
        "FIGURES",
        "OUTPUT",
    ]
    assert "bogo_ops_per_s=1235" in lines[2] and "Passed" in lines[2] and lines[2].rstrip().endswith("out.log")
    assert "cpu-1: passed" in lines and "cpu-2: passed" in lines
    hp("health-check", "cancel", "lab")  # nothing active: refused, harmless
    worker.finish.update(
        results={"cpu-1": "Passed", "cpu-2": "Failed"}, reasons={"cpu-2": ["bogo ops 10% of expected"]}
    )
    r = hp("health-check", "start", "lab", "--check", "InstanceStress", "--wait", "--json")
    assert r.code == 1
    validate("health-check-status", r.json())
    assert r.json()["Request"]["Results"] == {"cpu-1": "Passed", "cpu-2": "Failed"}


def test_health_check_wait_times_out_with_exit_3(hp: Hp, worker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waits.time, "sleep", lambda s: None)
    r = hp("health-check", "start", "lab", "--check", "InstanceStress", "--wait", "--timeout", "0.02")
    assert r.code == 3 and "still Pending after 0.02 s" in r.err


# -- submit, logs ----------------------------------------------------------------------------
@pytest.fixture
def job(hp: Hp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from orchestrator.ci import submit

    monkeypatch.setattr(submit, "POLL", 0.001)
    make(hp)
    hp.w.provider.exec_handler = lambda c, cmd: ExecResult(0, "job says hi\n" if cmd[0] == "sh" else "")
    s = tmp_path / "job.sh"
    s.write_text("#!/bin/sh\necho job says hi\n")
    return s


def test_submit_streams_the_output_and_exits_with_the_jobs_code(hp: Hp, job: Path) -> None:
    args: list[list[str]] = []
    real = hp.w.slurm.submit
    hp.w.slurm.submit = lambda c, s, o, a, *rest: (args.append(a), real(c, s, o, a, *rest))[1]  # type: ignore[method-assign]
    r = hp("submit", "lab", str(job), "-N", "2", "-p", "cpu", "--", "--time=5")
    assert r.code == 0 and r.out == "job says hi\n"
    assert args == [["--partition", "cpu", "--nodes", "2", "--time=5"]]
    hp("submit", "lab", str(job), "--", "--", "--exclusive")  # a "--" that reaches the command is dropped too
    assert args[-1] == ["--exclusive"]
    hp.w.slurm.submit = real  # type: ignore[method-assign]
    assert "job 1 on lab exited with code 0 (output: /home/hpuser/hp-submit/" in r.err
    doc = hp.json("submit", "submit", "lab", str(job))
    assert doc["JobId"] == 3 and doc["ExitCode"] == 0 and doc["Output"] == "job says hi\n"

    def failing(*a: Any) -> tuple[int, str]:
        hp.w.slurm.jobs[4] = JobInfo(4, "FAILED", "cpu-1", 3)
        return 4, "4\n"

    hp.w.slurm.submit = failing  # type: ignore[method-assign]
    r = hp("submit", "lab", str(job))
    assert r.code == 3 and r.out == "job says hi\nhp: job 4 ended FAILED\n"


def test_submit_bad_input(hp: Hp, job: Path, tmp_path: Path) -> None:
    r = hp("submit", "lab", str(tmp_path / "nope.sh"), "--nodes", "0", "--timeout", "-1")
    assert r.code == 2 and r.err.startswith("error: cannot submit: 3 problems")
    r = hp("submit", "nope", str(job))
    assert r.code == 2
    r = hp("submit", "lab")
    assert r.code == 2 and "Missing argument" in r.err


def test_logs(hp: Hp, tmp_path: Path) -> None:
    make(hp)
    r = hp("logs", "lab", "--dir", str(tmp_path / "l"))
    assert (
        r.code == 0
        and r.err.splitlines()[-1].startswith("wrote ")
        and r.err.rstrip().endswith(f"for 4 nodes to {tmp_path / 'l'}")
    )
    assert "collecting cpu-1" in r.err
    doc = hp.json("logs", "logs", "lab", "-d", str(tmp_path / "m"))
    assert doc["Nodes"] == ["controller-1", "cpu-1", "cpu-2", "login-1"]
    r = hp("logs", "lab")
    assert r.code == 2 and "Missing option '--dir'" in r.err
    r = hp("logs", "nope", "--dir", str(tmp_path / "n"))
    assert r.code == 2 and "'nope' does not exist" in r.err


# -- images ----------------------------------------------------------------------------------
def test_images_build_list_key(hp: Hp) -> None:
    r = hp("images", "build")
    rows = [ln.split() for ln in r.out.splitlines()]
    assert r.code == 0 and rows[0] == ["IMAGE", "REFERENCE"]
    assert [x[0] for x in rows[1:]] == ["check-cpu", "controller", "login", "rest", "worker"]
    assert "is up to date" in r.err
    doc = hp.json("images-build", "images", "build", "--gpu")
    assert set(doc["Images"]) == {
        "controller",
        "login",
        "worker",
        "rest",
        "check-cpu",
        "check-gpu",
    }
    r = hp("images", "list")
    names = ["hp-controller", "hp-login", "hp-worker", "hp-rest", "hp-check-cpu", "hp-check-gpu"]
    assert [ln.split()[:2] for ln in r.out.splitlines()] == [
        ["IMAGE", "SLURM"],
        *([n, "24.11"] for n in names),
        *([n, "26.05"] for n in names),
    ]
    doc = hp.json("images-list", "images", "list")
    assert all(i["Present"] == (i["Slurm"] == DEFAULT) for i in doc["Images"])  # the fakes: the default's base only
    r = hp("images", "key")
    assert r.code == 0 and r.out.startswith(f"{DEFAULT}-") and len(r.out.strip()) == 30
    assert hp.json("images-key", "images", "key") == {"Key": r.out.strip()}
    other = next(rel for rel in SlurmRelease if rel is not DEFAULT)
    key = hp("images", "key", "--slurm", other).out.strip()
    assert key.startswith(f"{other}-") and key[6:] != r.out.strip()[6:]


def test_a_release_hp_does_not_have_is_refused_naming_the_ones_it_has(hp: Hp, tmp_path: Path) -> None:
    for args in (("images", "build"), ("images", "key"), ("images", "save", str(tmp_path / "s"))):
        r = hp(*args, "--slurm", "25.11")
        assert (r.code, r.err.strip()) == (
            2,
            "error: invalid option: --slurm: Slurm release '25.11' is not one hp has (24.11, 26.05)",
        )
    spec = tmp_path / "s.yaml"
    spec.write_text("ClusterName: x\nSlurmVersion: 26.05\nNodePackages: ['Bad Name']\nInstanceGroups: []\n")
    r = hp("images", "key", "-f", str(spec))
    assert (
        r.code == 2
        and "SlurmVersion: Slurm release 26.05 is not one hp has (24.11, 26.05) (a YAML number: quote it" in r.err
    )
    assert "NodePackages[0]" in r.err  # every problem at once
    r = hp("create", "--name", "lab", "--slurm", "23.02", "--mode", "sideways")
    assert r.code == 2 and "--slurm: Slurm release '23.02' is not one hp has (24.11, 26.05)" in r.err
    assert "--mode must be" in r.err and hp.w.env.store.cluster("lab") is None and not hp.w.provider.containers("lab")


def test_images_need_an_engine(hp: Hp) -> None:
    hp.w.provider.up = False
    for args in (("images", "build"), ("images", "list")):
        r = hp(*args)
        assert r.code == 1 and r.err.startswith("error: cannot reach a Docker engine"), args
    assert hp("images", "key").code == 0  # a cache key needs no engine


def test_images_save_and_load(hp: Hp, tmp_path: Path) -> None:
    import hashlib

    for ref, iid in list(hp.w.provider.images.items()):  # ids in the engine's shape
        hp.w.provider.images[ref] = "sha256:" + hashlib.sha256(iid.encode()).hexdigest()
    d = tmp_path / "cache"
    r = hp("images", "save", str(d))
    assert r.code == 0 and "saved 5 images (0 MB), key " in r.err and r.err.rstrip().endswith(f"to {d}")
    doc = hp.json("images-save", "images", "save", str(d))
    r = hp("images", "load", str(d))
    assert (r.code, r.err.splitlines()[-1]) == (0, "already present: " + ", ".join(i["Ref"] for i in doc["Images"]))
    loaded = hp.json("images-load", "images", "load", str(d), "--force")
    assert loaded["Loaded"] is True
    r = hp("images", "load", str(tmp_path / "nowhere"))
    assert r.code == 2 and "is not a directory" in r.err


# -- the command line itself ---------------------------------------------------------------
def test_usage_errors_exit_2(hp: Hp) -> None:
    for args in (("--bogus",), ("list", "--bogus"), ("frobnicate",), ("capacity", "set"), ("scale", "lab")):
        r = hp(*args)
        assert r.code == 2, args
        assert r.err.startswith("Usage: ") and "\nError: " in r.err, args


@pytest.mark.parametrize("args", [(), ("capacity",), ("images",), ("health-check",)])
def test_no_command_shows_the_help_without_a_traceback(hp: Hp, args: tuple[str, ...]) -> None:
    r = hp(*args)
    assert r.code in (0, 2) and "Usage:" in r.out + r.err


def test_help_documents_the_exit_codes(hp: Hp) -> None:
    r = hp("--help")
    assert r.code == 0 and "0 success, 1 operation failed, 2 bad input, 3 timeout" in r.out.replace("\n", " ")
    r = hp("capacity", "--help")
    assert r.code == 0 and "release-gpu" in r.out


def test_interrupts_and_bugs(hp: Hp, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted() -> list:
        raise KeyboardInterrupt

    monkeypatch.setattr(hp.w.env.store, "clusters", interrupted)
    r = hp("list")
    assert r.code == 130  # (click turns ^C into Abort: "error: interrupted" is never printed)

    def aborted() -> list:
        raise typer.Abort()

    monkeypatch.setattr(hp.w.env.store, "clusters", aborted)
    assert hp("list").code == 130

    def bug() -> list:
        raise ZeroDivisionError("a bug in hp")

    monkeypatch.setattr(hp.w.env.store, "clusters", bug)
    sys.argv, old = ["hp", "list"], sys.argv
    try:
        with pytest.raises(ZeroDivisionError):  # a bug is not hidden: its traceback is shown
            cli.main()
    finally:
        sys.argv = old


@pytest.mark.parametrize(
    "raised, code, said",
    [
        (KeyboardInterrupt(), 130, "error: interrupted\n"),
        (typer.Exit(4), 4, ""),
        (typer.Abort(), 130, ""),
    ],
)
def test_main_turns_what_escapes_the_parser_into_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raised: BaseException, code: int, said: str
) -> None:
    def app(**kw: Any) -> None:
        raise raised

    monkeypatch.setattr(cli, "command", lambda name=None: app)
    with pytest.raises(SystemExit) as ei:
        cli.main()
    assert ei.value.code == code and capsys.readouterr().err == said


def test_the_real_env_is_made_from_hp_home_without_reaching_docker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HP_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/hp-ut-cli.sock")
    e = common.env()
    assert e.store.home == tmp_path / "h" and (tmp_path / "h" / "hp.db").exists()
    assert type(e.provider).__name__ == "DockerEngine" and e.provider._api is None  # lazily: nothing reached


# -- output ----------------------------------------------------------------------------------
class Tty:
    def __init__(self) -> None:
        self.data = ""

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.data += s
        return len(s)

    def flush(self) -> None:
        pass


def test_output_for_a_terminal_uses_rich_and_for_a_pipe_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    out, err = Tty(), Tty()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    o = output.Out()
    assert o.tty
    o.table("T", ["A", "B"], [[1, None]])
    assert "A" in out.data and any(c in out.data for c in "┏━│┃")  # a drawn table
    o.info("progress")
    o.error("it broke")
    assert "progress" in err.data and "error:" in err.data and "it broke" in err.data
    monkeypatch.setenv("NO_COLOR", "1")
    err.data = ""
    o2 = output.Out()
    assert not o2.tty
    o2.error("plain")
    assert err.data == "error: plain\n"
    out.data = ""
    o2.table(None, ["NAME", "N"], [["a", 1], ["bb", None]])
    assert out.data == "NAME  N\na     1\nbb\n"


def test_progress_lines_are_not_repeated(capsys: pytest.CaptureFixture[str]) -> None:
    p = common.CliProgress(output.Out())
    p.stage("nodes", "starting")
    p.stage("nodes", "starting")
    p.groups({"cpu": (1, 2, 0)})
    p.groups({"cpu": (1, 2, 0)})
    p.groups({"cpu": (1, 2, 1), "gpu": (0, 1, 0)})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert lines[0].endswith("nodes: starting") and lines[1].endswith("nodes: cpu 1/2")
    assert lines[2].endswith("nodes: cpu 1/2 (1 failed)  gpu 0/1")
