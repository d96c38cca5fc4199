"""The rules the README states about the code, checked on the code itself:
- only orchestrator/docker imports docker-py;
- only orchestrator/slurm runs Slurm commands;
- importing the package does no work (no engine, no database);
- phases are written through the store's gate only;
- only orchestrator/state touches SQLite (imports sqlite3, holds SQL);
- cluster statuses and health-check request states are written by their one writer,
  given the enum (state/transitions.py);
- each rule written once: labels in naming.py, node phases in state/phases.py, Slurm's
  states in slurm/, hp's reasons in slurm/model.py, waiting in waits.py."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from orchestrator.slurm.model import REASON_PREFIX
from orchestrator.state.phases import InstanceStatus, Phase

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
    """hp's own code (the programs that run inside check containers are in healthchecks/)."""
    return sorted(PKG.rglob("*.py"))


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
        "orchestrator.agent.daemon, orchestrator.health.engine; "
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


def test_only_the_state_package_touches_sqlite() -> None:
    """No module outside state/ imports sqlite3 or holds an SQL statement of hp's."""
    sql = ("SELECT ", "INSERT INTO ", "DELETE FROM ", "CREATE TABLE ", "CREATE INDEX ", "ALTER TABLE ", "PRAGMA ")
    offenders = []
    for p in modules():
        if rel(p).startswith("state/"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
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
PHASE_WORDS_ELSEWHERE = {
    ("health/engine.py", "Running"): "a health-check request's or result's state",
}


def test_node_phases_and_statuses_are_spelled_only_in_phases() -> None:
    words = {p.value for p in Phase} | {s.value for s in InstanceStatus}
    assert _offenders(lambda s: s in words, "state/phases.py", PHASE_WORDS_ELSEWHERE) == []


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
    ("health/nccl.py", "FAILED"): "nccl-tests' own verdict word (avg_busbw_status)",
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
SLEEPS_ELSEWHERE = {
    "cluster/create.py": "its waits go with the launch path being rewritten onto the reconciler (issue 20 item 1)",
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
