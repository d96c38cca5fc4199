"""hp in CI: the GitHub Action run as a runner runs it, `hp submit`, `hp logs` and
`hp images save/load`, with real containers and real Slurm."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import ROOT, TEST_SLURM, Hp, small_spec, write_spec

RELEASE = ("--slurm", TEST_SLURM) if TEST_SLURM else ()  # hp images key/save of the release under test

SCHEMAS = ROOT / "schemas"
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV") or ROOT / ".venv") / "bin"


def check_schema(command: str, doc: Any) -> None:
    schema = json.loads((SCHEMAS / f"{command}.schema.json").read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)


def files_with(root: Path, secret: bytes) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


# -- a small GitHub Actions runner: enough of it to run action.yml and the example workflow --
class Runner:
    """Runs `run:` steps with bash as the runner does (expressions substituted, GITHUB_OUTPUT,
    GITHUB_ENV and GITHUB_PATH files); `uses:` steps are skipped, or emulated for the cache."""

    def __init__(self, tmp: Path, hp_home: Path, cache_store: Path):
        self.tmp = tmp
        self.cache_store = cache_store
        (tmp / "runner").mkdir()
        self.env = {
            **os.environ,
            "HP_HOME": str(hp_home),
            "NO_COLOR": "1",
            "RUNNER_TEMP": str(tmp / "runner"),
            "RUNNER_OS": "Linux",
            "RUNNER_ARCH": "X64",
            "GITHUB_ACTION_PATH": str(ROOT),
            "GITHUB_WORKSPACE": str(tmp),
            "CI": "true",
        }
        self.env["PATH"] = f"{VENV_BIN}:{self.env['PATH']}"
        self.github = {"action_repository": "example/hp", "run_id": "42", "run_attempt": "1"}
        self.failed = False
        self.log: list[str] = []

    # expressions: a || b, a == 'lit', always(), failure(), success(), contexts, 'literals'
    def ev(self, expr: str, ctx: dict[str, Any]) -> Any:
        expr = expr.strip()
        if "||" in expr:
            for part in expr.split("||"):
                if v := self.ev(part, ctx):
                    return v
            return ""
        if "==" in expr:
            a, b = expr.split("==", 1)
            return str(self.ev(a, ctx)) == str(self.ev(b, ctx))
        if expr in ("always()", "failure()", "success()"):
            return {"always()": True, "failure()": self.failed, "success()": not self.failed}[expr]
        if expr.startswith("'") and expr.endswith("'"):
            return expr[1:-1]
        cur: Any = ctx
        for part in expr.split("."):
            cur = cur.get(part, "") if isinstance(cur, dict) else ""
        return cur

    def sub(self, text: str, ctx: dict[str, Any]) -> str:
        return re.sub(r"\$\{\{(.*?)\}\}", lambda m: str(self.ev(m.group(1), ctx)), text)

    def run_steps(self, steps: list[dict[str, Any]], ctx: dict[str, Any], action_dir: Path | None = None) -> None:
        ctx.setdefault("steps", {})
        for i, step in enumerate(steps):
            ctx["env"] = {k: v for k, v in self.env.items()}
            cond = step.get("if")
            if cond is None:
                run_it = not self.failed
            else:
                run_it = bool(self.ev(cond.replace("${{", "").replace("}}", ""), ctx))
                if "always()" not in cond and "failure()" not in cond:
                    run_it = run_it and not self.failed
            if not run_it:
                continue
            sid = step.get("id", f"_{i}")
            outputs: dict[str, str] = {}
            ctx["steps"][sid] = {"outputs": outputs}
            if "uses" in step:
                self.uses(step, ctx, outputs)
            else:
                self.run(step, ctx, outputs)

    def uses(self, step: dict[str, Any], ctx: dict[str, Any], outputs: dict[str, str]) -> None:
        uses = step["uses"]
        with_ = {k: self.sub(str(v), ctx) for k, v in (step.get("with") or {}).items()}
        self.log.append(f"uses {uses}")
        if uses == "./":  # the action under test
            action = yaml.safe_load((ROOT / "action.yml").read_text())
            inputs = {k: with_.get(k, str(v.get("default", ""))) for k, v in action["inputs"].items()}
            inner: dict[str, Any] = {
                "inputs": inputs,
                "github": self.github,
                "runner": {"temp": self.env["RUNNER_TEMP"]},
            }
            self.run_steps(action["runs"]["steps"], inner)
            for k, v in action["outputs"].items():
                outputs[k] = self.sub(v["value"], inner)
        elif uses.startswith("actions/cache/restore"):
            src = self.cache_store / with_["key"]
            if src.is_dir():
                dst = Path(with_["path"])
                dst.mkdir(parents=True, exist_ok=True)
                for f in src.iterdir():
                    os.link(f, dst / f.name)  # a hard link: the emulated cache copies nothing
                outputs["cache-hit"] = "true"
        elif uses.startswith("actions/cache/save"):
            dst = self.cache_store / with_["key"]
            dst.mkdir(parents=True)
            for f in Path(with_["path"]).iterdir():
                os.link(f, dst / f.name)
        # actions/checkout, actions/upload-artifact: nothing to do here

    def run(self, step: dict[str, Any], ctx: dict[str, Any], outputs: dict[str, str]) -> None:
        files = {k: self.tmp / f"{k.lower()}-{len(self.log)}" for k in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH")}
        for f in files.values():
            f.write_text("")
        script = self.tmp / f"step-{len(self.log)}.sh"
        script.write_text(self.sub(step["run"], ctx))
        env = {
            **self.env,
            **{k: self.sub(str(v), ctx) for k, v in (step.get("env") or {}).items()},
            **{k: str(v) for k, v in files.items()},
        }
        r = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            env=env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.log.append(f"--- {step.get('name')}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
        if r.returncode != 0:
            self.failed = True
        for line in files["GITHUB_OUTPUT"].read_text().splitlines():
            k, _, v = line.partition("=")
            outputs[k] = v
        for line in files["GITHUB_ENV"].read_text().splitlines():
            k, _, v = line.partition("=")
            self.env[k] = v
        for line in files["GITHUB_PATH"].read_text().splitlines():
            self.env["PATH"] = f"{line}:{self.env['PATH']}"


@pytest.fixture(scope="module")
def saved_images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """`hp images save` once for the module (about 1 GB; written in ~20 s here)."""
    from conftest import docker_available

    if not docker_available():
        pytest.skip("no Docker engine")
    d = tmp_path_factory.mktemp("hp-images")
    h = Hp(tmp_path_factory.mktemp("hphome"))
    r = h("images", "save", str(d), *RELEASE, "--json", check=True, timeout=300)
    yield d, json.loads(r.stdout)
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.releases
@pytest.mark.xdist_group("saved-images")  # one module-scoped save, one worker
def test_action_and_example_workflow(hp: Hp, tmp_path: Path, saved_images: tuple[Path, dict[str, Any]]) -> None:
    """action.yml's steps and the example workflow, run as a runner runs them: the image
    cache hits (key from `hp images key`), the cluster comes up, the outputs are written,
    a two-node job passes, and the always() step deletes the cluster."""
    saved_dir, _ = saved_images
    key = hp("images", "key", *RELEASE, check=True).stdout.strip()
    store = tmp_path / "cache-store"
    (store / f"hp-images-{key}-Linux-X64").mkdir(parents=True)
    for f in saved_dir.iterdir():
        os.link(f, store / f"hp-images-{key}-Linux-X64" / f.name)
    name = hp.name("ci-act")
    spec = write_spec(tmp_path / "spec.json", small_spec("ignored", groups=[("cpu", "cpu.nano", 2)]))
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "slurm-cluster.yml").read_text())
    steps = wf["jobs"]["slurm-job"]["steps"]
    action_step = next(s for s in steps if s.get("uses") == "./")
    action_step["with"] = {**action_step["with"], "spec": str(spec), "name": name, "install": "false", "wait": "120"}
    if TEST_SLURM:  # the release under test (make e2e runs this test on each): the Action's input
        action_step["with"]["slurm-version"] = TEST_SLURM
    runner = Runner(tmp_path, hp.home, store)
    runner.run_steps(steps, {"github": runner.github, "runner": {"temp": runner.env["RUNNER_TEMP"]}})
    log = "\n".join(runner.log)
    assert not runner.failed, log
    assert "every image is already present" in log or "loaded" in log, log  # the cache-hit path ran
    act = [entry for entry in runner.log if entry.startswith("--- Create the cluster")]
    assert act and "exit 0" in act[0], log
    # the Create step wrote both outputs, and the job step used cluster-name
    out_files = sorted(tmp_path.glob("github_output-*"))
    written = "\n".join(f.read_text() for f in out_files)
    assert f"cluster-name={name}" in written and f"login-node=hp-{name}-login-1" in written, written
    assert re.search(r"cpu-1\s+cpu-2", log), log  # srun hostname on both nodes, from hp submit's output
    assert hp("describe", name).returncode != 0, "the always() step should have deleted the cluster"
    assert not [c for c in _containers(name)]


def _containers(name: str) -> list[Any]:
    from orchestrator.docker.engine import DockerEngine as DockerProvider

    return DockerProvider().containers(name)


@pytest.mark.releases
def test_submit_exit_codes_and_logs(hp: Hp, tmp_path: Path) -> None:
    name = hp.name("ci-sub")
    hp("create", "-f", str(write_spec(tmp_path / "s.json", small_spec(name))), "--timeout", "120", check=True)
    ok = tmp_path / "ok.sh"
    ok.write_text("#!/bin/bash\nsrun hostname | sort\necho all-good\n")
    r = hp("submit", name, str(ok), "--nodes", "2", "--timeout", "120")
    assert r.returncode == 0, r.stderr
    assert "all-good" in r.stdout and "cpu-1" in r.stdout and "cpu-2" in r.stdout, r.stdout
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\necho about-to-fail\nexit 3\n")
    r = hp("submit", name, str(bad), "--json", "--timeout", "120")
    assert r.returncode == 3, r.stderr
    doc = json.loads(r.stdout)
    check_schema("submit", doc)
    assert doc["ExitCode"] == 3 and "about-to-fail" in doc["Output"]
    slow = tmp_path / "slow.sh"
    slow.write_text("#!/bin/sh\necho started\nsleep 300\n")
    r = hp("submit", name, str(slow), "--timeout", "4")
    assert r.returncode == 3 and "did not finish within 4 s (cancelled)" in r.stderr, r.stderr
    # bad input: nothing submitted, exit 2
    r = hp("submit", name, str(tmp_path / "missing.sh"), "--nodes", "0")
    assert r.returncode == 2 and "missing.sh" in r.stderr and "--nodes" in r.stderr, r.stderr

    out = tmp_path / "logs"
    r = hp("logs", name, "--dir", str(out), "--json", check=True)
    doc = json.loads(r.stdout)
    check_schema("logs", doc)
    for f in (
        "cluster.json",
        "events.json",
        "slurm.conf",
        "controller-1/slurmctld.log",
        "controller-1/container.log",
        "cpu-1/slurmd.log",
        "cpu-1/scontrol-show-node.txt",
        "cpu-2/container.log",
        "login-1/container.log",
    ):
        assert (out / f).is_file(), f
    assert "NodeName=cpu-1" in (out / "cpu-1" / "scontrol-show-node.txt").read_text()
    assert "SlurmctldHost=controller-1" in (out / "slurm.conf").read_text()
    assert any("InService" in e["Description"] for e in json.loads((out / "events.json").read_text()))
    key = (hp.home / "clusters" / name / "slurm.key").read_bytes()
    assert len(key) >= 32 and files_with(out, key) == []


def test_logs_of_failed_create_kept_with_retain(hp: Hp, tmp_path: Path) -> None:
    name = hp.name("ci-bad")
    doc = small_spec(name, groups=[("cpu", "cpu.nano", 2)])
    doc["InstanceGroups"][2]["Image"] = "hp-worker:doesnotexist"
    r = hp("create", "-f", str(write_spec(tmp_path / "s.json", doc)), "--retain", "--timeout", "60")
    assert r.returncode == 1, r.stderr
    key = (hp.home / "clusters" / name / "slurm.key").read_bytes()
    from orchestrator.docker.engine import DockerEngine as DockerProvider

    p = DockerProvider()
    p.kill(f"hp-{name}-controller-1")  # a stopped container too: read with get_archive, not exec
    out = tmp_path / "logs"
    r = hp("logs", name, "--dir", str(out), "--json", check=True)
    check_schema("logs", json.loads(r.stdout))
    assert json.loads((out / "cluster.json").read_text())["ClusterStatus"] == "Failed"
    assert (out / "controller-1" / "slurmctld.log").stat().st_size > 0
    assert (out / "controller-1" / "container.log").is_file()
    assert json.loads((out / "controller-1" / "status.json").read_text())["State"]["Running"] is False
    for n in ("cpu-1", "cpu-2"):  # never got a container: their recorded status says why
        st = json.loads((out / n / "status.json").read_text())
        assert st["Container"] is None and "ImageNotFound" in st["Message"], st
    assert any("ImageNotFound" in e["Description"] for e in json.loads((out / "events.json").read_text()))
    assert (out / "slurm.conf").is_file()
    assert files_with(out, key) == []


@pytest.mark.xdist_group("saved-images")  # one module-scoped save, one worker
def test_images_save_and_load(hp: Hp, tmp_path: Path, saved_images: tuple[Path, dict[str, Any]]) -> None:
    d, saved = saved_images
    check_schema("images-save", saved)
    assert saved["Key"] == hp("images", "key", check=True).stdout.strip()
    assert {i["Name"] for i in saved["Images"]} >= {"base", "controller", "login", "worker"}
    assert json.loads((d / "manifest.json").read_text())["Sha256"] == saved["Sha256"]

    before = hp.json("images", "list")
    r = hp("images", "load", str(d), "--json", check=True)
    doc = json.loads(r.stdout)
    check_schema("images-load", doc)
    assert doc["KeyMatches"] is True
    from orchestrator.docker.engine import DockerEngine as DockerProvider

    p = DockerProvider()
    assert all(p.image_id(i["Ref"]) == i["Id"] for i in doc["Images"])  # present, same ids
    assert hp.json("images", "list") == before
    r = hp("images", "build", "--json", check=True)  # nothing to build after a load
    assert "building" not in r.stderr, r.stderr

    # corrupt: same size, other bytes (a sparse file: costs no disk)
    bad = tmp_path / "corrupt"
    bad.mkdir()
    shutil.copy(d / "manifest.json", bad / "manifest.json")
    with open(bad / saved["File"], "wb") as f:
        f.truncate(saved["Size"])
    r = hp("images", "load", str(bad))
    assert r.returncode == 1 and "corrupt" in r.stderr and "sha256" in r.stderr, r.stderr
    with open(bad / saved["File"], "wb") as f:
        f.truncate(1000)  # a cut-short download
    r = hp("images", "load", str(bad))
    assert r.returncode == 1 and "corrupt" in r.stderr and "bytes" in r.stderr, r.stderr
    (bad / "manifest.json").write_text("{not json")
    r = hp("images", "load", str(bad))
    assert r.returncode == 2 and "corrupt" in r.stderr, r.stderr
    r = hp("images", "load", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "not a directory" in r.stderr, r.stderr
    (tmp_path / "empty").mkdir()
    r = hp("images", "load", str(tmp_path / "empty"))
    assert r.returncode == 2 and "manifest.json is missing" in r.stderr, r.stderr
