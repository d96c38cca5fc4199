"""The rules docs/architecture.md states about the code, checked on the code itself:
- the floors: a module imports only from its own floor or lower ones, and no import
  loop (imports inside functions and under TYPE_CHECKING count), between packages or
  between modules;
- imports inside functions only where laziness is the point (LAZY, each with its why);
- only orchestrator/docker imports docker-py;
- only orchestrator/slurm runs Slurm commands;
- importing any module does no work (no engine, no database);
- phases are written through the store's gate only;
- only orchestrator/state touches SQLite (imports sqlite3, holds SQL);
- cluster statuses and health-check request states are written by their one writer,
  given the enum (state/transitions.py);
- each rule written once: labels in naming.py, node phases in state/phases.py, Slurm's
  states in slurm/, hp's reasons in slurm/model.py, waiting in waits.py;
- no code asks whether it runs on one engine or several hosts (`.multihost`) but the
  allowed readers (MULTIHOST_READERS): it asks the provider what differs."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.slurm.model import REASON_PREFIX
from orchestrator.state.phases import InstanceStatus, Phase

PKG = Path(__file__).resolve().parents[2] / "orchestrator"
DOC = PKG.parent / "docs" / "architecture.md"

# Lowest first: a module may import from its own floor or lower ones only. A package
# (or a module at the top of orchestrator/) is on one floor; docs/architecture.md names
# the same floors (test_the_floors_are_the_documented_ones).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors", "naming", "verdict", "resources", "waits", "releases", "runtime"),
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
    ("core/context.py", "orchestrator"): "Env and Cluster are held by every command; what only some use (the spec's "
    "pydantic model, the instance types, GPU discovery, image builds) loads on first use: `hp exec` loads none of it",
    ("state/status.py", "orchestrator"): "the spec's model is a type here only: a healthy cluster's nodes are "
    "judged from their containers' labels, and `hp nodes` loads no pydantic",
    ("docker/engine.py", "docker"): "docker-py on first engine use: importing hp loads no engine client",
    ("docker/engine.py", "requests"): "docker-py's transport, with docker-py",
    ("docker/engine.py", "urllib3"): "docker-py's transport, with docker-py",
    ("services/endpoints.py", "prometheus_client"): "only the agent serves metrics, not the CLI's queries",
    ("docker/wire.py", "ssl"): "TLS only to an engine that speaks it: `hp exec` on the local socket loads no ssl",
    ("docker/wire.py", "socket"): "socket.py for tcp:// only: the local socket is reached through _socket (3.6 ms of "
    "the quick `hp exec`'s import)",
    ("docker/wire.py", "subprocess"): "ssh only to an engine reached through it (the quick `hp exec` loads none)",
    ("state/home.py", "pathlib"): "a Path only for the callers that hold one: the quick `hp exec` loads no pathlib",
    ("core/agentlock.py", "pathlib"): "types only: the quick `hp exec` loads no pathlib",
    ("agent/__main__.py", "orchestrator"): "the lock first, then the agent's 0.3-0.5 s of imports: an `hp exec` "
    "just after `hp create` finds the agent alive",
    ("core/agentlock.py", "typing"): "types only",
    ("cluster/target.py", "typing"): "types only: the quick `hp exec` (cli/quick.py) loads no typing (5 ms)",
    ("cluster/target.py", "orchestrator"): "types only: the quick `hp exec` loads neither views.py nor dataclasses",
    ("services/metrics.py", "prometheus_client"): "only the agent serves metrics, not the CLI's queries",
    ("waits.py", "tenacity"): "tenacity when a wait runs: `hp nodes`, `hp events`, `hp describe` wait for nothing",
    ("state/phases.py", "tenacity"): "a backoff computed when asked: the commands that read phases compute none",
    ("slurm/client.py", "http"): "http.client (with ssl and email, ~15 ms) for slurmctld's /readyz ping only",
    ("gpu/thresholds.py", "pydantic"): "the thresholds file's model, made when a file is read: `hp health-check "
    "status` loads no pydantic",
    **{
        (m, "yaml"): "YAML (~20 ms) when a file is read: `hp health-check status` reads none"
        for m in ("spec/catalogue.py", "gpu/thresholds.py", "gpu/inventory.py")
    },
    **{
        (m, "orchestrator"): "the spec's model is a type here only: `hp health-check status` loads no pydantic"
        for m in ("core/across_hosts.py", "core/launcher.py", "core/lifecycle.py", "core/placement.py", "slurm/conf.py")
    },
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
    """hp's own code (the programs that run inside check containers are in healthchecks/)."""
    return sorted(PKG.rglob("*.py"))


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
    TYPE_CHECKING count). Importing a module of a sub-package imports that package first: that
    edge counts too, unless the importer is inside it (a package's own modules may be imported by
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
    """No module name twice for two roles (onstart, multihost, watch were)."""
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


def absolute_imports(node: ast.AST) -> list[str]:
    """The modules an import statement names absolutely (none for another node)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def test_only_the_docker_package_imports_docker_py() -> None:
    offenders = []
    for p in modules():
        if rel(p).startswith("docker/"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            names = absolute_imports(node)
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


def test_the_quick_commands_load_only_what_they_use() -> None:
    """What `hp exec`, `hp nodes` and `hp version` import (issue 23: hp's own cost per
    command) loads neither the spec's model (pydantic) nor the instance types (YAML), GPU
    discovery, the services or image builds; docker-py only on first engine use."""
    code = (
        "import sys; import orchestrator.assembly, orchestrator.cluster.exec, orchestrator.cluster.query, "
        "orchestrator.ci.version; "
        "heavy = ('pydantic', 'yaml', 'docker', 'orchestrator.spec.model', 'orchestrator.spec.catalogue', "
        "'orchestrator.gpu.inventory', 'orchestrator.services.accounting', 'orchestrator.docker.images', "
        "'orchestrator.hosts.registry'); "
        "loaded = [m for m in heavy if m in sys.modules]; assert not loaded, loaded"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=PKG.parent, capture_output=True, text=True)
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


def test_only_the_state_package_touches_sqlite() -> None:
    """No module outside state/ imports sqlite3 or holds an SQL statement of hp's."""
    sql = ("SELECT ", "INSERT INTO ", "DELETE FROM ", "CREATE TABLE ", "CREATE INDEX ", "ALTER TABLE ", "PRAGMA ")
    offenders = []
    for p in modules():
        if rel(p).startswith("state/"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            names = absolute_imports(node)
            offenders += [f"{rel(p)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "sqlite3"]
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value.lstrip()  # hp writes its SQL in capitals (Accounting's MariaDB probe does not)
                if text.startswith(sql) or (text.startswith("UPDATE ") and " SET " in text):
                    offenders.append(f"{rel(p)}:{node.lineno}: {node.value[:40]!r}")
    assert offenders == []


# writer -> (the argument that is the new status, counting from 0, and its enum)
STATUS_WRITERS = {
    "set_status": (1, "ClusterStatus"),
    "add_cluster": (2, "ClusterStatus"),
    "set_state": (1, "RequestState"),
}


def test_statuses_are_given_to_their_writer_as_the_enum() -> None:
    """Every call of a status writer names a member (ClusterStatus.X, RequestState.X),
    never a loose string; and only the writers' modules update those columns."""
    offenders, calls = [], 0
    for p in modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in STATUS_WRITERS or rel(p).startswith("state/"):
                continue
            i, enum = STATUS_WRITERS[node.func.attr]
            arg = node.args[i] if len(node.args) > i else None
            calls += 1
            if not (isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == enum):
                offenders.append(f"{rel(p)}:{node.lineno}: {node.func.attr}({ast.unparse(arg) if arg else ''})")
    assert offenders == [] and calls >= 12
    writers = {
        "state/store.py": "UPDATE clusters SET status",
        "state/health_requests.py": "UPDATE health_requests SET state",
    }
    for p in modules():
        for module, stmt in writers.items():
            assert stmt not in p.read_text() or rel(p) == module, f"{rel(p)} writes {stmt!r}"


# -- each rule written once (issue 20): labels, phases, Slurm states, hp's reasons, waits --
def _literals(p: Path) -> list[ast.Constant]:
    """The string literals of a module (f-strings' literal parts too) that are used as
    values: not a docstring, not a dict's keys, not a subscript (doc["Running"]), not
    .get()'s key, not an enum member's definition (another status's own enum)."""
    tree = ast.parse(p.read_text())
    keys: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr):
            keys.add(id(node.value))
        elif isinstance(node, ast.ClassDef) and any(getattr(b, "id", "").endswith("Enum") for b in node.bases):
            keys |= {id(s.value) for s in node.body if isinstance(s, ast.Assign)}
        elif isinstance(node, ast.Dict):
            keys |= {id(k) for k in node.keys if k is not None}
        elif isinstance(node, ast.Subscript):
            keys.add(id(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            keys |= {id(a) for a in node.args[:1]}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in keys]


def _offenders(match, home: str, allowed: dict[tuple[str, str], str]) -> list[str]:
    """Literals `match` finds outside `home` (a module or a package folder), less the
    allowed (module, literal) pairs; an allowed pair no longer found is stale."""
    found = [(rel(p), n) for p in modules() if not rel(p).startswith(home) for n in _literals(p) if match(n.value)]
    stale = set(allowed) - {(m, n.value) for m, n in found}
    return [f"{m}:{n.lineno}: {n.value[:50]!r}" for m, n in found if (m, n.value) not in allowed] + [
        f"stale allow-list entry {s}" for s in sorted(stale)
    ]


def test_labels_are_spelled_only_in_naming() -> None:
    """Every io.hp.* label through orchestrator/naming.py's constants."""
    assert _offenders(lambda s: re.search(r"\bio\.hp\b", s), "naming.py", {}) == []


# The words a node phase shares with other statuses, each with its reason.
PHASE_WORDS_ELSEWHERE: dict[tuple[str, str], str] = {}


def test_node_phases_and_statuses_are_spelled_only_in_phases() -> None:
    words = {p.value for p in Phase} | {s.value for s in InstanceStatus}
    assert _offenders(lambda s: s in words, "state/phases.py", PHASE_WORDS_ELSEWHERE) == []


def test_health_check_results_are_the_enums_not_strings() -> None:
    """A check's state and attempt (state/statuses.py's CheckState, Attempt) are spelled
    only there: the health checks write and read the enums."""
    from orchestrator.state.statuses import Attempt, CheckState

    words = {s.value for s in CheckState} | {a.value for a in Attempt}
    level = {("health/requests/runner.py", "Error")}  # an event's level, not a check's state
    found = [
        f"{rel(p)}:{n.lineno}: {n.value!r}"
        for p in modules()
        if rel(p).startswith("health/") or rel(p) == "state/health_requests.py"
        for n in _literals(p)
        if n.value in words and (rel(p), n.value) not in level
    ]
    assert found == []


def test_phases_are_read_as_the_enum_not_as_strings() -> None:
    """The store hands phases back typed (state/phases.py's NodePhase, Phases): no caller
    turns one into its string to compare it, or reads a record by position."""
    as_string = re.compile(r"\bPhase\.[A-Z_]+\.value\b|\.get\([^()]*, \(\"\"[^()]*\)\)\[[0-2]\]")
    found = [
        f"{rel(p)}:{i}: {line.strip()[:80]}"
        for p in modules()
        if rel(p) != "state/phases.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if as_string.search(line) and ("phase" in line.lower() or "Phase." in line)
    ]
    assert found == []


SLURM_STATES = {
    *("IDLE", "ALLOCATED", "ALLOC", "MIXED", "DOWN", "FUTURE", "UNKNOWN", "ERROR"),  # node base states
    *("DRAIN", "DRAINED", "DRAINING", "FAIL", "NOT_RESPONDING", "MAINTENANCE", "REBOOT_REQUESTED", "DYNAMIC_NORM"),
    *("POWERED_DOWN", "POWERING_UP", "RESERVED", "CLOUD", "COMPLETING", "PLANNED", "INVALID_REG"),
    *("PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL"),  # jobs
    *("PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REQUEUED", "RESIZING", "REVOKED", "STOPPED"),
}
SLURM_WORDS_ELSEWHERE = {
    ("cli/scale.py", "RUNNING"): "a column header of `hp quotas` (instances running per type)",
    ("cli/recovery.py", "FAILED"): "the outcome column of `hp reboot`/`hp replace`",
    ("gpu/nccl.py", "FAILED"): "nccl-tests' own verdict word (avg_busbw_status)",
}


def test_slurm_states_are_read_only_in_the_slurm_package() -> None:
    assert _offenders(lambda s: s in SLURM_STATES, "slurm/", SLURM_WORDS_ELSEWHERE) == []


OLD_REASON_PREFIXES = ("hp-health:", "hp-gpu:")
REASON_WORDS_ELSEWHERE = {("ci/submit.py", "hp: job "): "a line of the CI job's output, not a node's reason"}


def test_hps_reasons_are_built_only_in_slurm_model() -> None:
    """One prefix (REASON_PREFIX) and is_ours, in slurm/model.py; reasons elsewhere are
    built from its constants and functions."""

    def reason_like(s: str) -> bool:
        return s.startswith((REASON_PREFIX, *OLD_REASON_PREFIXES)) or s == "hp delete"

    assert _offenders(reason_like, "slurm/model.py", REASON_WORDS_ELSEWHERE) == []


# time.sleep outside the wait primitive, each with its reason.
SLEEPS_ELSEWHERE: dict[str, str] = {
    "core/agentlock.py": "a 1 ms pause while a look at the lock ends; the quick `hp exec` loads it, not tenacity",
}


def test_waiting_goes_through_the_one_primitive() -> None:
    """No time.sleep (nor a `from time import sleep`) outside orchestrator/waits.py."""
    offenders = []
    for p in modules():
        if rel(p) in ("waits.py", *SLEEPS_ELSEWHERE):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "sleep" and getattr(node.value, "id", "") == "time":
                offenders.append(f"{rel(p)}:{node.lineno}: time.sleep")
            elif (
                isinstance(node, ast.ImportFrom)
                and node.module == "time"
                and any(a.name == "sleep" for a in node.names)
            ):
                offenders.append(f"{rel(p)}:{node.lineno}: from time import sleep")
    stale = [m for m in SLEEPS_ELSEWHERE if "time.sleep" not in (PKG / m).read_text()]
    assert offenders == [] and stale == []


def test_the_wait_primitive_imports_nothing_of_hps_but_errors() -> None:
    tree = ast.parse((PKG / "waits.py").read_text())
    ours = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert ours == ["errors"]


# The agent's wing: its threads are the runtime's (a controller's `workers`), not its own.
AGENT_WING = ("agent", "recovery", "hosts/hostwatch.py", "services/servicewatch.py", "health/requests")
# (module, function) -> why it may start a thread: it blocks on a stream as long as that runs.
STREAM_READERS: dict[tuple[str, str], str] = {
    ("agent/gpuwatch.py", "_follow"): "a GPU monitor's Docker log stream, read as it comes (no poll)",
}


def test_the_agent_wing_starts_no_threads_but_its_stream_readers() -> None:
    files = sorted(f for w in AGENT_WING for f in ((PKG / w).rglob("*.py") if (PKG / w).is_dir() else [PKG / w]))
    assert files
    found = set()
    for f in files:
        rel = f.relative_to(PKG).as_posix()

        def visit(node: ast.AST, where: str, rel: str = rel) -> None:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                where = node.name
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("threading.Thread", "Thread"):
                found.add((rel, where))
            for child in ast.iter_child_nodes(node):
                visit(child, where)

        visit(ast.parse(f.read_text()), "<module>")
    assert found == set(STREAM_READERS), "the agent's work runs on the runtime's workers (Controller.workers)"


# Nothing asks which runtime it runs on (`.multihost`): it asks the provider what differs
# (docker/provider.py: places_nodes, reaches_addresses, cluster_images, node_image,
# prepare_cluster, place), as kind's create flow asks its provider interface.
MULTIHOST_READERS: dict[str, str] = {}


def test_no_code_branches_on_multihost_but_the_allowed() -> None:
    found = {
        rel(p)
        for p in modules()
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, ast.Attribute) and n.attr == "multihost"
    }
    assert found <= set(MULTIHOST_READERS), "ask the provider what differs (docker/provider.py), not which it is"
    env = next(
        n
        for n in ast.parse((PKG / "core/context.py").read_text()).body
        if isinstance(n, ast.ClassDef) and n.name == "Env"
    )
    assert "multihost" not in {n.name for n in env.body if isinstance(n, ast.FunctionDef)}, "Env has no multihost"
