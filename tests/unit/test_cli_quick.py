"""The quick `hp exec` (orchestrator/cli/quick.py): it reads a command line exactly as
typer does or leaves it to typer; it runs a command only where the full way would run
the same one, sends the engine the same exec, and leaves every other case to the full
way. Against a stand-in engine (socket_engine.py) and a real store under HP_HOME."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from socket_engine import Answers, SocketEngine, frame

from orchestrator.cli import quick
from orchestrator.cli.main import app
from orchestrator.cluster.exec import run_exec
from orchestrator.core.agentlock import paths
from orchestrator.core.context import Env
from orchestrator.docker.engine import DockerEngine
from orchestrator.state.statuses import ClusterStatus
from orchestrator.state.store import Store

EXEC = typer.main.get_command(app).commands["exec"]  # type: ignore[attr-defined]


def typer_reads(argv: list[str]) -> tuple[str, str | None, bool, list[str]] | None:
    """What the full way's parser makes of `hp exec ARGV` (None: it refuses it, or shows help)."""
    try:
        ctx = EXEC.make_context("exec", list(argv))
    except Exception:  # click's usage errors, and its help's exit
        return None
    p = ctx.params
    cmd = list(p["cmd"])
    if cmd and cmd[0] == "--":  # as cli/cluster.py exec_ does
        cmd = cmd[1:]
    return p["name"], p["node"], p["root"], cmd


TOKENS = [
    "lab",
    "x",
    "--root",
    "--node",
    "-n",
    "--node=cpu-1",
    "cpu-1",
    "--",
    "-h",
    "--help",
    "srun",
    "-N4",
    "-",
    "--rooted",
    "-nX",
    "",
]
OPTIONS = [["--root"], ["--node", "cpu-1"], ["-n", "cpu-2"], ["--node=login-1"]]
ODD = [["--node="], ["-nX"], ["-h"], ["--x"], ["--node"], ["x"], ["--"], ["-"]]


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """The shape hp exec is used in (options around NAME, `--`, a command with dashes of
    its own), sometimes with an odd token put in or one taken out; and any tokens at all."""
    if draw(st.integers(0, 3)) == 0:
        return draw(st.lists(st.sampled_from(TOKENS), max_size=8))
    opts = draw(st.lists(st.sampled_from(OPTIONS), max_size=3))
    at = draw(st.integers(0, len(opts)))
    line = [t for o in opts[:at] for t in o] + [draw(st.sampled_from(["lab", "x"]))]
    line += [t for o in opts[at:] for t in o] + ["--"] + draw(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=4))
    odd = draw(st.integers(0, 3))
    if odd == 1:
        i = draw(st.integers(0, len(line)))
        line[i:i] = draw(st.sampled_from(ODD))
    elif odd == 2:
        line.pop(draw(st.integers(0, len(line) - 1)))
    return line


ACCEPTED: list[list[str]] = []


@settings(max_examples=600, deadline=None)
@given(command_lines())
def test_a_command_line_the_quick_way_reads_is_read_alike_by_typer(argv: list[str]) -> None:
    got = quick.parse(["exec", *argv])
    if got is not None:
        ACCEPTED.append(argv)
        assert typer_reads(argv) == got


def test_the_generated_command_lines_reach_the_quick_way_often() -> None:
    """The property above is not vacuous: a good share of its lines go the quick way."""
    ACCEPTED.clear()
    test_a_command_line_the_quick_way_reads_is_read_alike_by_typer()
    assert len(ACCEPTED) >= 150, len(ACCEPTED)  # of 600


@pytest.mark.parametrize(
    "argv, want",
    [
        (["lab", "--", "srun", "-N4", "hostname"], ("lab", None, False, ["srun", "-N4", "hostname"])),
        (["--root", "lab", "--node", "cpu-1", "--", "id"], ("lab", "cpu-1", True, ["id"])),
        (["lab", "-n", "cpu-1", "--", "id", "--", "x"], ("lab", "cpu-1", False, ["id", "--", "x"])),
        (["lab", "--node=cpu-1", "--", "--help"], ("lab", "cpu-1", False, ["--help"])),
    ],
)
def test_the_usual_command_lines_go_the_quick_way(argv: list[str], want: tuple) -> None:
    assert quick.parse(["exec", *argv]) == want == typer_reads(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["exec", "lab", "true"],  # no `--`: typer's
        ["exec", "--help"],
        ["exec", "lab", "-h", "--", "true"],
        ["exec", "lab", "--"],
        ["exec", "lab", "--", "--", "x"],
        ["exec", "lab", "--node", "a", "--node", "b", "--", "true"],
        ["exec", "lab", "--node", "--", "true"],
        ["exec", "lab", "extra", "--", "true"],
        ["nodes", "lab", "--", "x"],
        ["exec", "--", "true"],
    ],
)
def test_every_other_command_line_is_left_to_typer(argv: list[str]) -> None:
    assert quick.parse(argv) is None


# -- running --------------------------------------------------------------------------
def listing(cluster: str = "lab") -> list[dict]:
    def c(node: str, role: str, state: str = "running") -> dict:
        return {
            "Id": f"{node}-0123456789",
            "Names": [f"/hp-{cluster}-{node}"],
            "State": state,
            "Labels": {"io.hp.cluster": cluster, "io.hp.node": node, "io.hp.role": role, "io.hp.managed": "1"},
        }

    return [
        c("controller-1", "controller"),
        c("login-2", "login"),
        c("login-1", "login"),
        c("cpu-1", "worker"),
        c("cpu-2", "worker", "exited"),
        {**c("cpu-1", "check"), "Names": ["/hp-lab-check-cpu-1"], "Id": "chk"},
    ]


class World:
    def __init__(self, home: Path, engine: SocketEngine, monkeypatch: pytest.MonkeyPatch):
        self.home, self.engine = home, engine
        self.store = Store(home)
        self.store.add_cluster("lab", {"ClusterName": "lab"}, ClusterStatus.CREATING)
        self.store.set_status("lab", ClusterStatus.IN_SERVICE)
        engine.answers = Answers(
            containers=listing(),
            frames=frame(1, b"out\n") + frame(2, b"err\n"),
            exec_inspect={"ExitCode": 3},
        )
        monkeypatch.setenv("HP_HOME", str(home))
        monkeypatch.setenv("DOCKER_HOST", engine.url)
        monkeypatch.setattr(quick.sys.stdin, "isatty", lambda: False, raising=False)
        self._lock: Any = None

    def agent(self, alive: bool = True) -> None:
        """An agent holding the cluster's lock (another open of the file: flock conflicts)."""
        if alive and self._lock is None:
            self._lock = open(paths(self.home, "lab")[0], "a+")  # noqa: SIM115 (held until released)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        elif not alive and self._lock is not None:
            self._lock.close()
            self._lock = None


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    eng = SocketEngine(tmp_path / "engine.sock")
    w = World(tmp_path / "home", eng, monkeypatch)
    w.agent()
    yield w
    w.agent(False)
    eng.close()


def test_a_command_runs_in_the_first_login_node_as_the_default_user(
    world: World, capfdbinary: pytest.CaptureFixture[bytes]
) -> None:
    assert quick.run(["exec", "lab", "--", "srun", "-N4", "hostname"]) == 3
    out = capfdbinary.readouterr()
    assert (out.out, out.err) == (b"out\n", b"err\n")
    (create,) = world.engine.called("POST", "/exec")
    assert create.path == "/containers/hp-lab-login-1/exec"
    assert (create.body["User"], create.body["WorkingDir"], create.body["Env"]) == (
        "hpuser",
        "/home/hpuser",
        ["HOME=/home/hpuser", "USER=hpuser"],
    )
    assert create.body["Cmd"] == ["srun", "-N4", "hostname"] and create.body["AttachStdin"] is False


def test_the_quick_way_sends_the_engine_the_exec_the_full_way_sends(world: World, tmp_path: Path) -> None:
    """The same command, node and user through quick.run and through cluster/exec.py's
    run_exec over DockerEngine: the same exec document."""
    for argv, target, root in (
        (["lab", "--", "id"], "hp-lab-login-1", False),
        (["lab", "--root", "--node", "cpu-1", "--", "id"], "hp-lab-cpu-1", True),
    ):
        world.engine.asked.clear()
        assert quick.run(["exec", *argv]) == 3
        quick_body = world.engine.called("POST", "/exec")[0].body
        world.engine.asked.clear()
        env = Env(provider=DockerEngine(world.engine.url), store=world.store, slurm_factory=None, agents=None)  # type: ignore[arg-type]
        assert run_exec(env, target, ["id"], root, lambda d, e: None, controller=False) == 3
        assert world.engine.called("POST", "/exec")[0].body == quick_body
        assert world.engine.called("POST", "/exec")[0].path == f"/containers/{target}/exec"


@pytest.mark.parametrize(
    "why, argv, change",
    [
        ("no agent holds the lock", ["lab", "--", "true"], lambda w: w.agent(False)),
        (
            "the cluster is not InService",
            ["lab", "--", "true"],
            lambda w: w.store.set_status("lab", ClusterStatus.DEGRADED),
        ),
        ("no such cluster", ["nope", "--", "true"], lambda w: None),
        ("hosts are registered", ["lab", "--", "true"], lambda w: w.store.add_host("h1", "tcp://10.0.0.9:2375", {})),
        ("the controller is named", ["lab", "--node", "controller-1", "--", "true"], lambda w: None),
        ("the node is not running", ["lab", "--node", "cpu-2", "--", "true"], lambda w: None),
        ("no such node", ["lab", "--node", "cpu-9", "--", "true"], lambda w: None),
        ("no login node runs", ["lab", "--", "true"], lambda w: setattr(w.engine.answers, "containers", listing()[:1])),
        (
            "the engine refuses the exec",
            ["lab", "--", "true"],
            lambda w: setattr(w.engine.answers, "exec_create", (409, {"message": "paused"})),
        ),
        (
            "a terminal",
            ["lab", "--", "true"],
            lambda w: (
                setattr(quick.sys.stdin, "isatty", lambda: True),
                setattr(quick.sys.stdout, "isatty", lambda: True),
            ),
        ),
    ],
)
def test_every_case_it_is_not_sure_of_is_left_to_the_full_way(
    world: World, monkeypatch: pytest.MonkeyPatch, why: str, argv: list[str], change: Any
) -> None:
    monkeypatch.setattr(quick.sys.stdout, "isatty", lambda: False, raising=False)
    change(world)
    assert quick.run(["exec", *argv]) is None, why
    assert world.engine.called("POST", "/start") == []  # nothing ran


def test_no_engine_at_docker_host_is_left_to_the_full_way(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/hp-ut.sock")
    assert quick.run(["exec", "lab", "--", "true"]) is None
    monkeypatch.setenv("DOCKER_HOST", "not a url")
    assert quick.run(["exec", "lab", "--", "true"]) is None


def test_a_stream_that_breaks_once_started_is_an_error_and_nothing_runs_twice(
    world: World, capfdbinary: pytest.CaptureFixture[bytes]
) -> None:
    world.engine.answers.start_status = (500, {"message": "exec died"})
    assert quick.run(["exec", "lab", "--", "true"]) == 1
    assert b"error: run true in hp-lab-login-1: exec died" in capfdbinary.readouterr().err
    assert len(world.engine.called("POST", "/exec")) == 1


def test_the_quick_way_loads_no_parser_no_docker_py_no_typing_and_no_socket_module() -> None:
    code = (
        "import sys; import orchestrator.cli; "
        "heavy = [m for m in ('typer', 'click', 'docker', 'requests', 'pydantic', 'rich', 'tenacity', 'typing', "
        "'socket', 'selectors', 'dataclasses', 'orchestrator.cli.main', 'orchestrator.core.context', 'orchestrator.state.store') "
        "if m in sys.modules]; assert not heavy, heavy"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
