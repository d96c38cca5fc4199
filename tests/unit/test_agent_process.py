"""Process control of the per-cluster agents (orchestrator/core/agents.py): alive means
holding the cluster's lock file. The only processes started here are tiny stand-ins
that hold the lock the way `python -m orchestrator.agent` does (core/agentlock.take) and talk to
nothing; the agent itself is started once, for a cluster the store does not know (it ends
at its first look), and never by ensure() (subprocess.Popen is replaced there)."""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import force_status

from orchestrator.core import agents
from orchestrator.core.agentlock import holder, paths, take
from orchestrator.core.agents import AgentProcesses
from orchestrator.state.store import Store
from orchestrator.state.transitions import ENDING, ClusterStatus

# Holds the lock and writes its pid as agentlock.take does; reports SIGUSR1 (poke) on stdout.
HOLDER = r"""
import fcntl, os, signal, sys, time
lock, pidf, ignore_term = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR1, lambda *_: print("poked", flush=True))
f = open(lock, "a+")
fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
open(pidf, "w").write(str(os.getpid()))
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "hphome")
    s.add_cluster("lab", {"ClusterName": "lab"}, ClusterStatus.CREATING)
    s.set_status("lab", ClusterStatus.IN_SERVICE)
    return s


@pytest.fixture
def holders(store: Store) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(5)


def hold(store: Store, holders: list[subprocess.Popen[str]], name: str = "lab", ignore_term: bool = False):
    lock, pidf, _ = paths(store.home, name)
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(pidf), "1" if ignore_term else "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    holders.append(p)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture
def no_popen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, Any]]]:
    """ensure() may start an agent: record what it would have run instead."""
    started: list[tuple[list[str], dict[str, Any]]] = []

    class Popen:
        def __init__(self, argv: list[str], **kw: Any):
            started.append((argv, kw))
            self.pid = 424242

    monkeypatch.setattr(agents, "subprocess", SimpleNamespace(Popen=Popen, DEVNULL=subprocess.DEVNULL))
    return started


def test_paths_are_per_cluster_in_a_private_folder(tmp_path: Path) -> None:
    lock, pidf, log = paths(tmp_path, "lab")
    d = tmp_path / "clusters" / "lab"
    assert (lock, pidf, log) == (d / "agent.lock", d / "agent.pid", d / "agent.log")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_pid_is_none_without_a_holder_and_the_lock_is_left_free(store: Store) -> None:
    a = AgentProcesses(store)
    assert a.pid("lab") is None
    lock, _, _ = paths(store.home, "lab")
    with open(lock, "a+") as f:  # pid() let go of it
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_pid_of_a_lock_held_by_another_open_file_description(store: Store) -> None:
    """flock locks belong to open file descriptions: one held through another open() of
    the same file, even in this very process, is someone else's."""
    a = AgentProcesses(store)
    lock, pidf, _ = paths(store.home, "lab")
    with open(lock, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        assert a.pid("lab") == -1  # alive, pid not written yet
        pidf.write_text("not a pid\n")
        assert a.pid("lab") == -1
        pidf.write_text(f"{os.getpid()}\n")
        assert a.pid("lab") == os.getpid()
        pidf.write_text(f"{dead_pid()}\n")  # the last agent's: the one holding the lock has not written yet
        assert a.pid("lab") == -1
    assert a.pid("lab") is None  # released: no agent


def test_pid_of_a_real_holder_process(store: Store, holders: list) -> None:
    p = hold(store, holders)
    assert AgentProcesses(store).pid("lab") == p.pid
    assert AgentProcesses(store).pid("other") is None  # per cluster


def test_creation_lock_makes_the_agent_look_alive_and_is_released(store: Store) -> None:
    a = AgentProcesses(store)
    with a.creation_lock("lab"):
        assert a.pid("lab") == -1  # an agent started now would see the lock and not start
    assert a.pid("lab") is None
    with pytest.raises(RuntimeError):
        with a.creation_lock("lab"):
            raise RuntimeError("create failed")
    assert a.pid("lab") is None  # released on failure too


def test_home_defaults_to_hp_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_popen: list) -> None:
    monkeypatch.setenv("HP_HOME", str(tmp_path / "envhome"))
    a = AgentProcesses()
    assert a.pid("lab") is None
    assert (tmp_path / "envhome" / "clusters" / "lab").is_dir()
    assert a.ensure("lab") == {"Alive": False, "Pid": None, "Restarted": False}  # no such cluster there
    assert no_popen == []


@pytest.mark.parametrize("status", ENDING)
def test_ensure_starts_nothing_for_a_cluster_going_away(store: Store, no_popen: list, status: str) -> None:
    force_status(store, "lab", status, "x")
    assert AgentProcesses(store).ensure("lab") == {"Alive": False, "Pid": None, "Restarted": False}
    assert no_popen == []


def test_ensure_starts_nothing_for_an_unknown_cluster(store: Store, no_popen: list) -> None:
    assert AgentProcesses(store).ensure("nope") == {"Alive": False, "Pid": None, "Restarted": False}
    assert no_popen == []


def test_ensure_leaves_a_live_agent_alone(store: Store, holders: list, no_popen: list) -> None:
    p = hold(store, holders)
    assert AgentProcesses(store).ensure("lab") == {"Alive": True, "Pid": p.pid, "Restarted": False}
    assert no_popen == []


def test_ensure_starts_a_detached_agent_with_its_home_and_log(store: Store, no_popen: list) -> None:
    assert AgentProcesses(store).ensure("lab") == {"Alive": True, "Pid": 424242, "Restarted": True}
    [(argv, kw)] = no_popen
    assert argv == [sys.executable, "-m", "orchestrator.agent", "lab"]
    assert kw["start_new_session"] and kw["close_fds"] and kw["stdin"] == subprocess.DEVNULL
    assert kw["env"]["HP_HOME"] == str(store.home)
    _, _, log = paths(store.home, "lab")
    assert kw["stdout"].name == str(log) and kw["stderr"] is kw["stdout"] and log.exists()


def test_poke_sends_sigusr1_to_the_live_agent(store: Store, holders: list) -> None:
    p = hold(store, holders)
    AgentProcesses(store).poke("lab")
    assert p.stdout.readline().strip() == "poked"
    assert p.poll() is None  # woken, not stopped


def test_poke_and_stop_of_an_absent_or_dead_agent_do_nothing(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    a = AgentProcesses(store)
    sent: list[tuple[int, int]] = []
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        if sig:  # 0 asks whether it lives: no signal
            sent.append((pid, sig))
        real_kill(pid, sig)

    monkeypatch.setattr(agents.os, "kill", kill)
    a.poke("lab")
    a.stop("lab")
    assert sent == []  # nothing holds the lock: nobody to signal
    lock, pidf, _ = paths(store.home, "lab")
    gone = dead_pid()
    with open(lock, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        a.poke("lab")
        a.stop("lab")  # -1: alive, pid unknown: never signal a guess
        assert sent == []
        pidf.write_text(str(gone))
        a.poke("lab")  # a pid that has exited: unknown, never signalled (it may be another process's by now)
        a.stop("lab")
    assert sent == []


def test_stop_terminates_the_agent_and_waits_for_the_lock(store: Store, holders: list) -> None:
    p = hold(store, holders)
    a = AgentProcesses(store)
    a.stop("lab", timeout=5)
    assert a.pid("lab") is None
    assert p.wait(5) == -signal.SIGTERM


def test_stop_kills_an_agent_that_ignores_sigterm(store: Store, holders: list) -> None:
    p = hold(store, holders, ignore_term=True)
    a = AgentProcesses(store)
    a.stop("lab", timeout=0.2)
    assert p.wait(5) == -signal.SIGKILL
    assert a.pid("lab") is None


def test_stop_when_the_agent_is_gone_before_the_kill(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Still holding the lock at the deadline, gone when SIGKILL is sent: no error."""
    a = AgentProcesses(store)
    lock, pidf, _ = paths(store.home, "lab")
    gone = dead_pid()
    sigs: list[int] = []

    def kill(pid: int, sig: int) -> None:
        if sig == 0:  # alive while it holds the lock
            return
        sigs.append(sig)
        if sig == signal.SIGKILL:
            raise ProcessLookupError

    monkeypatch.setattr(agents.os, "kill", kill)
    with open(lock, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        pidf.write_text(str(gone))
        a.stop("lab", timeout=0.05)
    assert sigs == [signal.SIGTERM, signal.SIGKILL]


def test_the_agent_takes_its_lock_before_it_loads_itself(tmp_path: Path) -> None:
    """agent/__main__.py takes the cluster's lock first: a second agent of the same cluster
    leaves at once, having loaded none of the agent's modules; the first's pid is recorded."""
    held = take(tmp_path, "lab")
    assert held is not None and holder(tmp_path, "lab") == os.getpid()
    assert take(tmp_path, "lab") is None  # another open of the lock: it is held
    code = (
        "import runpy, sys; sys.argv = ['x', 'lab']\n"
        "try:\n    runpy.run_module('orchestrator.agent', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "assert 'orchestrator.agent.daemon' not in sys.modules and 'orchestrator.assembly' not in sys.modules"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "HP_HOME": str(tmp_path)}, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    held.close()
    assert holder(tmp_path, "lab") is None


def test_looks_at_the_lock_neither_turn_an_agent_away_nor_make_one_up(tmp_path: Path) -> None:
    """CI saw `hp scale --wait` time out with no agent: the one starting met a look (ensure,
    poke) holding the lock for a moment, took it for another agent and left. Looks hold it
    shared now: an agent waits them out, and two looks at once never see each other as an
    agent (which made a stale pid file read as a live agent)."""
    _, pidf, _ = paths(tmp_path, "lab")
    pidf.write_text("999999")  # a dead agent's
    stop, seen = threading.Event(), []

    def look() -> None:
        while not stop.is_set():
            if (pid := holder(tmp_path, "lab")) is not None:
                seen.append(pid)

    looks = [threading.Thread(target=look) for _ in range(3)]
    for t in looks:
        t.start()
    try:
        turned_away = 0
        for _ in range(200):
            f = take(tmp_path, "lab")
            if f is None:
                turned_away += 1
            else:
                f.close()
    finally:
        stop.set()
        for t in looks:
            t.join()
    assert turned_away == 0
    assert set(seen) <= {os.getpid(), -1}  # the live taker (its pid file being written: -1), never the dead one


def test_a_poke_as_soon_as_the_agent_holds_the_lock_does_not_end_it(tmp_path: Path) -> None:
    """CI: `hp scale` just after `hp create` poked the new agent (SIGUSR1) before its
    handler was set, while it loaded its modules; SIGUSR1's default ended it and the
    scale-up never began. The agent is started for real here, for a cluster the store does
    not know: it gets as far as its first look at the store, then ends (not by the signal)."""
    _, pidf, _ = paths(tmp_path, "lab")
    p = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.agent", "lab"],
        env={**os.environ, "HP_HOME": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not (pidf.exists() and pidf.read_text().strip()) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
        os.kill(p.pid, signal.SIGUSR1)  # the module load after the lock takes 0.1-0.5 s: this lands in it
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)
    assert p.returncode != -signal.SIGUSR1, "the poke ended the agent"
    assert "does not exist" in err  # it reached the store: past the window the poke fell in
