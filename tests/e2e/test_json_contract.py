"""The scripting contract with real output: every --json command's output on a real
cluster validates against schemas/<command>.schema.json; stdout holds nothing else."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jsonschema
from conftest import ROOT, Hp, small_spec, write_spec

from orchestrator.releases import DEFAULT


def validate(command: str, stdout: str) -> Any:
    doc = json.loads(stdout)  # the whole of stdout is one JSON document
    schema = json.loads((ROOT / "schemas" / f"{command}.schema.json").read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    return doc


def run(hp: Hp, schema: str, *args: str) -> Any:
    r = hp(*args, "--json", timeout=180)
    assert r.returncode == 0, f"hp {' '.join(args)}: {r.stderr}"
    assert "\x1b[" not in r.stdout + r.stderr, "no colour codes when NO_COLOR is set / not a TTY"
    return validate(schema, r.stdout)


def test_json_outputs_validate(hp: Hp, tmp_path: Path) -> None:
    name = hp.name("ci-json")
    spec = write_spec(tmp_path / "s.json", small_spec(name, groups=[("cpu", "cpu.nano", 2)]))
    doc = run(hp, "create", "create", "-f", str(spec), "--timeout", "120")
    assert doc["ClusterStatus"] == "InService"
    assert any(c["ClusterName"] == name for c in run(hp, "list", "list")["ClusterSummaries"])
    run(hp, "describe", "describe", name)
    assert len(run(hp, "nodes", "nodes", name)["ClusterNodeSummaries"]) == 4
    run(hp, "events", "events", name)
    assert set(run(hp, "version", "version")) == {"hp", "python"}  # no engine asked
    assert run(hp, "version", "version", "--images")["slurm"].startswith(DEFAULT.value)  # the default release's
    run(hp, "images-build", "images", "build")
    run(hp, "images-list", "images", "list")
    run(hp, "images-key", "images", "key")
    run(hp, "capacity-show", "capacity", "show")
    run(hp, "reboot", "reboot", name, "cpu-1", "--timeout", "60")
    run(hp, "replace", "replace", name, "cpu-2", "--timeout", "60")
    run(hp, "scale", "scale", name, "cpu", "3")
    run(hp, "add-nodes", "add-nodes", name, "cpu", "1")
    run(hp, "delete-nodes", "delete-nodes", name, "cpu-1")
    ops = run(hp, "operations", "operations", name)["Operations"]
    assert [o["OperationType"] for o in ops] == ["Reboot", "Replace", "Scale", "AddNodes", "DeleteNodes"]
    run(hp, "operations", "operations", "describe", name, str(ops[1]["OperationId"]))
    doc = run(
        hp,
        "health-check-start",
        "health-check",
        "start",
        name,
        "--node",
        "cpu-2",
        "--check",
        "InstanceStress",
        "--stress-seconds",
        "1",
    )
    deadline = time.monotonic() + 90
    while True:  # let the detached check end before the cluster goes
        st = run(hp, "health-check-status", "health-check", "status", name, "--request", doc["RequestId"])
        if st["Request"]["State"] not in ("Pending", "Running") or time.monotonic() > deadline:
            break
        time.sleep(2)
    check = run(hp, "operations", "operations", name)["Operations"][-1]
    assert check["OperationType"] == "HealthCheck" and check["Status"] != "InProgress", check
    run(hp, "operations", "operations", "describe", name, str(check["OperationId"]))
    run(hp, "delete", "delete", name)
