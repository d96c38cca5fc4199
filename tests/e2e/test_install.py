"""hp installs anywhere: `pip install REPO` (a regular install, not editable: the build
backend's wheel) into a fresh venv, used from a folder outside the repo, gives a working `hp`.
The image build contexts (images/, healthchecks/) and the Slurm templates (slurm-conf/) travel
inside the wheel (pyproject.toml's force-include), where orchestrator/resources.py finds them:
the installed hp hashes every build context as this checkout does (the same image tags),
Docker builds from the installed contexts, and a cluster the installed hp creates runs a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import docker
from conftest import ROOT

from orchestrator import resources
from orchestrator.docker.images import ALL_IMAGES, GPU_IMAGES, MULTIHOST_IMAGES, Images, context_hash
from orchestrator.releases import DEFAULT

# what the hp that runs it sees: where its resources are, each image's build context hash
SEEN = """
import json
from orchestrator import resources
from orchestrator.docker.images import ALL_IMAGES, GPU_IMAGES, MULTIHOST_IMAGES, Images, context_hash
from orchestrator.releases import DEFAULT
i = Images(None, DEFAULT)
print(json.dumps({"root": str(resources.root()), "contexts": {
    d.name: context_hash(i.context(d)) for d in ALL_IMAGES + GPU_IMAGES + MULTIHOST_IMAGES}}))
"""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def test_pip_install_elsewhere_builds_creates_runs_and_deletes(docker_ok, tmp_path: Path) -> None:
    venv, work, home = tmp_path / "venv", tmp_path / "elsewhere", tmp_path / "home"
    work.mkdir()
    env = {**os.environ, "HP_HOME": str(home), "NO_COLOR": "1"}
    env.pop("PYTHONPATH", None)
    run([sys.executable, "-m", "venv", str(venv)], cwd=work)
    run([str(venv / "bin" / "pip"), "install", "-q", str(ROOT)], cwd=work, env=env)  # `pip install .`
    py, hp = str(venv / "bin" / "python"), str(venv / "bin" / "hp")

    # the package and its resources are the installed ones, not this checkout's folders
    seen = json.loads(run([py, "-c", SEEN], cwd=work, env=env).stdout)
    installed = Path(seen["root"])
    assert installed.parts[-3:] == ("site-packages", "orchestrator", resources.SHIPPED), installed
    assert not installed.is_relative_to(ROOT)
    assert {f: (installed / f).is_dir() for f in resources.FOLDERS} == dict.fromkeys(resources.FOLDERS, True)
    here = Images(None, DEFAULT)  # type: ignore[arg-type]  # contexts only
    assert resources.root() == ROOT
    assert seen["contexts"] == {
        d.name: context_hash(here.context(d)) for d in ALL_IMAGES + GPU_IMAGES + MULTIHOST_IMAGES
    }  # the same files with the same executable bits: the same images

    built = json.loads(run([hp, "images", "build", "--json"], cwd=work, env=env).stdout)["Images"]
    listed = json.loads(run([hp, "images", "list", "--json"], cwd=work, env=env).stdout)["Images"]
    assert sorted(built) == sorted(d.name for d in ALL_IMAGES)
    assert {r["Tag"] for r in listed if r["Present"]} >= set(built.values())
    # Docker builds from the installed context (the node image's worker target, under a
    # tag of this test's own, removed after: hp's images are left as they are)
    client, tag = docker.from_env(), f"hp-install-test-{uuid.uuid4().hex[:6]}:ctx"
    base = next(r["Base"] for r in listed)
    try:
        image, _ = client.images.build(
            path=str(installed / next(d.context for d in ALL_IMAGES if d.name == "worker")),
            target="worker",
            buildargs={"BASE": base},
            tag=tag,
            rm=True,
            forcerm=True,
        )
        assert tag in image.tags
    finally:
        try:
            client.images.remove(tag)  # the tag only when it is an image hp has too
        except docker.errors.ImageNotFound:
            pass

    name = f"whl-{uuid.uuid4().hex[:6]}"
    try:
        run([hp, "create", "--name", name, "--timeout", "120"], cwd=work, env=env)
        out = run([hp, "exec", name, "--", "srun", "-N2", "hostname"], cwd=work, env=env).stdout.split()
        assert len(out) == 2 and len(set(out)) == 2
    finally:
        subprocess.run([hp, "delete", name], cwd=work, env=env, capture_output=True, timeout=120)
    assert run(["docker", "ps", "-aq", "--filter", f"label=io.hp.cluster={name}"]).stdout.strip() == ""
