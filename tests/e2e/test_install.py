"""hp installs anywhere: a wheel built from the repo, installed into a fresh venv outside
the repo, gives a working `hp` from any working directory (the image build contexts, the
slurm.conf template and the instance types ship as package data)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from conftest import ROOT


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


def test_wheel_installed_elsewhere_builds_creates_runs_and_deletes(docker_ok, tmp_path: Path) -> None:
    dist, venv, work, home = tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere", tmp_path / "home"
    work.mkdir()
    run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(dist)])
    wheel = next(dist.glob("hp-*.whl"))
    run([sys.executable, "-m", "venv", str(venv)])
    run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)])
    hp = str(venv / "bin" / "hp")
    env = {**os.environ, "HP_HOME": str(home), "NO_COLOR": "1"}
    env.pop("PYTHONPATH", None)
    # the package is the installed one, not this checkout
    where = run(
        [str(venv / "bin" / "python"), "-c", "import orchestrator; print(orchestrator.__file__)"], cwd=work, env=env
    )
    assert str(ROOT) not in where.stdout and "site-packages" in where.stdout
    built = run([hp, "images", "build"], cwd=work, env=env)
    assert "hp-worker:" in built.stdout
    name = f"whl-{uuid.uuid4().hex[:6]}"
    try:
        run([hp, "create", "--name", name, "--timeout", "120"], cwd=work, env=env)
        out = run([hp, "exec", name, "--", "srun", "-N2", "hostname"], cwd=work, env=env).stdout.split()
        assert len(out) == 2 and len(set(out)) == 2
    finally:
        subprocess.run([hp, "delete", name], cwd=work, env=env, capture_output=True, timeout=120)
    assert run(["docker", "ps", "-aq", "--filter", f"label=io.hp.cluster={name}"]).stdout.strip() == ""
