"""The rules the README states about the code, checked on the code itself:
- only orchestrator/docker imports docker-py;
- only orchestrator/slurm runs Slurm commands;
- importing the package does no work (no engine, no database);
- phases are written through the store's gate only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "orchestrator"
SLURM_COMMANDS = {
    "scontrol",
    "sinfo",
    "squeue",
    "sbatch",
    "scancel",
    "sacct",
    "sacctmgr",
    "srun",
    "salloc",
    "sdiag",
    "sreport",
    "sshare",
    "sprio",
    "sstat",
    "strigger",
}


def modules() -> list[Path]:
    """hp's own code (not the programs under data/ that run inside check containers)."""
    return sorted(p for p in PKG.rglob("*.py") if "data" not in p.relative_to(PKG).parts)


def rel(p: Path) -> str:
    return str(p.relative_to(PKG))


def test_only_the_docker_package_imports_docker_py() -> None:
    offenders = []
    for p in modules():
        if rel(p).startswith("docker/"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [
                f"{rel(p)}:{node.lineno} imports {n}"
                for n in names
                if n.split(".")[0] in ("docker", "requests", "urllib3")
            ]
    assert offenders == []


def test_only_the_slurm_package_runs_slurm_commands() -> None:
    offenders = []
    for p in modules():
        if rel(p).startswith("slurm/"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                first = node.value.strip().split(" ", 1)[0]
                if node.value in SLURM_COMMANDS or (first in SLURM_COMMANDS and " " in node.value.strip()):
                    offenders.append(f"{rel(p)}:{node.lineno}: {node.value[:40]!r}")
    assert offenders == []


def test_phases_are_written_only_through_the_gate() -> None:
    """Only state/store.py inserts into node_status; everyone else calls set_phase."""
    offenders = [rel(p) for p in modules() if "INTO node_status" in p.read_text() and rel(p) != "state/store.py"]
    assert offenders == []


def test_importing_the_cli_touches_no_engine_and_no_database(tmp_path: Path) -> None:
    code = (
        "import os, sys; os.environ['DOCKER_HOST'] = 'tcp://127.0.0.1:9'; import orchestrator.cli, "
        "orchestrator.agent.daemon, orchestrator.health.requests.runner; "
        "assert 'docker' not in sys.modules, 'docker-py imported at import time'; "
        "import pathlib; assert not any(pathlib.Path(os.environ['HP_HOME']).iterdir())"
    )
    home = tmp_path / "home"
    home.mkdir()
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={"HP_HOME": str(home), "PATH": "/usr/bin:/bin"},
        cwd=PKG.parent,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_broad_excepts_are_few_and_report_bugs() -> None:
    """`except Exception` only where a bug is reported (report_bug) or re-raised; never
    where it would turn a bug into a verdict."""
    sites = []
    for p in modules():
        src = p.read_text().splitlines()
        for i, line in enumerate(src):
            if "except Exception" in line or "except BaseException" in line:
                body = "\n".join(src[i : i + 8])
                ok = any(
                    w in body
                    for w in ("report_bug", "_internal_error", "raise", "on_error", "USAGE_ERRORS", "print_exc")
                )
                sites.append((rel(p), i + 1, ok))
    assert [s for s in sites if not s[2]] == []
    assert len(sites) <= 12, sites
