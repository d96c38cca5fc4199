"""The rules docs/architecture.md states about the code, checked on the code itself:
- the floors: a module imports only from its own floor or lower ones, and no import
  loop (imports inside functions and under TYPE_CHECKING count), between packages or
  between modules;
- imports inside functions only where laziness is the point (LAZY, each with its why);
- only orchestrator/docker imports docker-py;
- only orchestrator/slurm runs Slurm commands;
- importing any module does no work (no engine, no database);
- phases are written through the store's gate only."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "orchestrator"
DOC = PKG.parent / "docs" / "architecture.md"

# Lowest first: a module may import from its own floor or lower ones only. A package
# (or a module at the top of orchestrator/) is on one floor; docs/architecture.md names
# the same floors (test_the_floors_are_the_documented_ones).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "naming", "verdict"),
    ("docker", "spec"),
    ("slurm",),
    ("state",),
    ("gpu",),
    ("core",),
    ("services", "recovery", "hosts"),
    ("assembly",),
    ("health",),
    ("cluster",),
    ("agent", "ci"),
    ("cli",),
)
FLOOR = {room: i for i, rooms in enumerate(FLOORS) for room in rooms}

# Imports inside a function (or under TYPE_CHECKING) that stay there, and why: laziness is
# the point. (room or module path, imported package): why. Nothing else is imported late.
LAZY: dict[tuple[str, str], str] = {
    ("cli", "orchestrator"): "each command loads the library when it runs: `hp` starts with typer alone",
    ("cli", "rich"): "rich is loaded when something is printed, not to parse a command line",
    ("docker/engine.py", "docker"): "docker-py on first engine use: importing hp loads no engine client",
    ("docker/engine.py", "requests"): "docker-py's transport, with docker-py",
    ("docker/engine.py", "urllib3"): "docker-py's transport, with docker-py",
    ("services/endpoints.py", "prometheus_client"): "only the agent serves metrics, not the CLI's queries",
    ("services/metrics.py", "prometheus_client"): "only the agent serves metrics, not the CLI's queries",
}
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


def module_name(p: Path) -> str:
    return ".".join(("orchestrator", *p.relative_to(PKG).with_suffix("").parts)).removesuffix(".__init__")


def room(module: str) -> str:
    """orchestrator.cluster.create -> cluster; orchestrator.errors -> errors."""
    return module.split(".")[1] if module.count(".") else ""


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str  # the module importing
    target: str  # what it imports: a module of hp's, or a third-party one
    late: bool  # inside a function, or under TYPE_CHECKING


def imports() -> list[Import]:
    """Every import statement of hp's modules, relative ones resolved; `from X import y`
    names X.y when y is a module, else X."""
    known = {module_name(p) for p in modules()}
    out = []
    for p in modules():
        me = module_name(p)
        tree = ast.parse(p.read_text())
        late_nodes: set[int] = set()
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
            ):
                late_nodes |= {id(c) for c in ast.walk(n) if c is not n}
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = me.split(".") if p.name == "__init__.py" else me.split(".")[:-1]
                    parts = parts[: len(parts) - (n.level - 1)]
                    base = ".".join(parts + ([n.module] if n.module else []))
                subs = [f"{base}.{a.name}" for a in n.names if f"{base}.{a.name}" in known]
                targets = subs if subs else [base]
            else:
                continue
            out += [Import(p, n.lineno, me, t, id(n) in late_nodes) for t in targets]
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def ours(i: Import) -> bool:
    return i.target == "orchestrator" or i.target.startswith("orchestrator.")


def test_every_room_is_on_a_floor() -> None:
    rooms = {room(module_name(p)) for p in modules()} - {""}
    assert sorted(rooms - set(FLOOR)) == [], "put the new package (or top module) on a floor, in FLOORS and the docs"
    assert sorted(set(FLOOR) - rooms) == []


def test_imports_respect_the_floors() -> None:
    """A module imports from its own floor or lower ones only: counting imports inside
    functions and under TYPE_CHECKING."""
    offenders = [
        f"{rel(i.path)}:{i.line}: {room(i.module)} (floor {FLOOR[room(i.module)]}) imports {i.target} "
        f"(floor {FLOOR[room(i.target)]})"
        for i in imports()
        if ours(i) and room(i.target) and room(i.module) and FLOOR[room(i.target)] > FLOOR[room(i.module)]
    ]
    assert offenders == []


def test_no_import_loops() -> None:
    """Neither between packages nor between modules (imports inside functions and under
    TYPE_CHECKING count). Importing a.b.c imports the package a.b first: that edge counts
    too, unless the importer is inside a.b (a package's own modules may be imported by
    its __init__)."""
    rooms: dict[str, set[str]] = {}
    mods: dict[str, set[str]] = {}
    for i in imports():
        if not ours(i):
            continue
        if room(i.target) and room(i.target) != room(i.module):
            rooms.setdefault(room(i.module), set()).add(room(i.target))
        parts = i.target.split(".")
        for k in range(2, len(parts) + 1):
            t = ".".join(parts[:k])
            inside = i.module == t or i.module.startswith(t + ".")
            if t != i.module and (k == len(parts) or not inside):
                mods.setdefault(i.module, set()).add(t)
    assert cycles(rooms) == []
    assert cycles(mods) == []


def test_imports_inside_functions_are_the_lazy_ones() -> None:
    """An import inside a function (or under TYPE_CHECKING) would hide an edge of the
    graph; only the deliberately lazy ones of LAZY are left, each with its reason."""
    offenders = []
    for i in imports():
        if not i.late:
            continue
        top = i.target.split(".")[0]
        where = rel(i.path)
        if (room(i.module), top) in LAZY or (where, top) in LAZY:
            continue
        offenders.append(f"{where}:{i.line}: imports {i.target} inside a function")
    assert offenders == []


# Basenames found twice, where both name one subject seen from two rooms.
SAME_NAME = {
    "images.py": "docker/: image builds; cli/: the `hp images` commands over them",
    "lifecycle.py": "spec/: LifeCycleConfig's rules; core/: its scripts put on a node",
    "model.py": "slurm/: the model of Slurm's answers; spec/: the model of the cluster spec",
}


def test_a_basename_names_one_role() -> None:
    """No module name twice for two roles (onstart.py, multihost.py, watch.py were)."""
    seen: dict[str, list[str]] = {}
    for p in modules():
        if p.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(p.name, []).append(rel(p))
    assert {n: ps for n, ps in seen.items() if len(ps) > 1 and n not in SAME_NAME} == {}


def test_the_floors_are_the_documented_ones() -> None:
    """docs/architecture.md's floor table lists FLOORS, lowest first."""
    rows = [line for line in DOC.read_text().splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    documented = [tuple(re.findall(r"`([a-z]+)(?:/|\.py)`", row.split("|")[2])) for row in rows]
    assert documented == list(FLOORS)


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


def test_importing_any_module_touches_no_engine_and_no_database(tmp_path: Path) -> None:
    every = ", ".join(module_name(p) for p in modules() if p.name != "__main__.py")
    code = (
        "import os, sys; os.environ['DOCKER_HOST'] = 'tcp://127.0.0.1:9'; "
        f"import {every}; "
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
