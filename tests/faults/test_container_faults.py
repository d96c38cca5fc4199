"""Real faults on live clusters: `docker kill` and `docker pause` of the controller and of
workers, concurrent commands on one cluster, and a restart of the Docker engine itself
(dockerd stopped and started, no systemctl). After each, the cluster converges (no
duplicate, no leak, Slurm matching Docker) and a job runs; times are printed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import small_spec, write_spec
from invariants import converge


def cluster(hp, tmp_path, workers: int = 3, login: bool = True) -> str:
    name = hp.name("fc")
    doc = small_spec(name, [("cpu", "cpu.nano", workers)], login=login)
    doc["InstanceGroups"][0]["InstanceType"] = "cpu.nano"
    hp("create", "-f", str(write_spec(tmp_path / f"{name}.json", doc)), "--timeout", "120", check=True)
    return name


def docker(*args: str, tries: int = 3) -> None:
    """Inject a fault with the docker CLI. `docker pause` failed once in a clean-clone run on
    a slow VM (exit 1; the freezer can time out under load): tried again up to `tries`
    times, and a failure names the engine's own words."""
    for _ in range(tries):
        r = subprocess.run(["docker", *args], capture_output=True, text=True)
        if r.returncode == 0:
            return
        time.sleep(1.0)
    raise AssertionError(f"docker {' '.join(args)} failed {tries} times, last: {r.stderr.strip() or r.stdout.strip()}")


def job_runs(hp, name: str, n: int, timeout: float = 60) -> float:
    t0 = time.monotonic()
    while True:
        r = hp("exec", name, "--", "srun", f"-N{n}", "--immediate=5", "hostname", timeout=60)
        if r.returncode == 0 and len(set(r.stdout.split())) == n:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"srun -N{n} never ran: {r.stderr[-500:]}"
        time.sleep(0.5)


def saved(hp, name: str) -> None:
    """Wait until slurmctld has saved the last job's end to its state files. It saves at
    most SAVE_MAX_WAIT (5 s) after a change; killed before that, it comes back with the
    job that just ended as running, and the job holds its nodes until InactiveLimit (30 s)
    ends it: the controller-kill round then converged in 71-78 s in sessions 4 and 5 (a
    worker's in 13-24 s), a measure of Slurm's InactiveLimit, not of hp's recovery."""
    deadline = time.monotonic() + 60
    while True:
        r = hp("exec", name, "--", "squeue", "-h", "-t", "all", "-o", "%T", timeout=30, check=True)
        states = r.stdout.split()
        if not set(states) & {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "SIGNALING"}:
            break
        assert time.monotonic() < deadline, f"jobs never ended: {states}"
        time.sleep(0.5)
    time.sleep(6.0)


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_kill_and_pause_of_controller_and_workers(hp, tmp_path, fault):
    name = cluster(hp, tmp_path)
    out = []
    for node in ("cpu-1", "controller-1", "cpu-2"):
        if fault == "kill" and node.startswith("controller"):
            saved(hp, name)
        t0 = time.monotonic()
        docker(fault, f"hp-{name}-{node}")
        took = converge(hp, name, timeout=120)
        job = job_runs(hp, name, 3)
        out.append(
            f"docker {fault} {node}: converged in {took:.1f} s, srun -N3 ran {job:.1f} s later "
            f"({time.monotonic() - t0:.1f} s in all)"
        )
    print("\n" + "\n".join(out), file=sys.stderr)


def test_concurrent_commands_on_one_cluster(hp, tmp_path):
    name = cluster(hp, tmp_path, workers=3, login=False)
    errors: list[str] = []

    def run(*args: str) -> None:
        r = hp(*args, timeout=300)
        if r.returncode not in (0, 1, 2) or "Traceback" in r.stderr:
            errors.append(f"hp {' '.join(args)} -> {r.returncode}: {r.stderr[-500:]}")

    cmds = [
        ("scale", name, "cpu", "5"),
        ("add-nodes", name, "cpu", "1"),
        ("delete-nodes", name, "cpu-2"),
        ("health-check", "start", name, "--node", "cpu-3", "--check", "InstanceStress", "--stress-seconds", "1"),
        ("reboot", name, "cpu-1", "--timeout", "60"),
        ("nodes", name),
        ("scale", name, "cpu", "4"),
    ]
    threads = [threading.Thread(target=run, args=c) for c in cmds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == []
    took = converge(hp, name, timeout=180)
    target = next(g for g in hp.json("describe", name)["InstanceGroups"] if g["InstanceGroupName"] == "cpu")[
        "TargetCount"
    ]
    assert target in (4, 5, 3, 6), target  # whichever write landed last; never lost, never doubled
    print(f"\nconcurrent commands: converged in {took:.1f} s at {target} nodes", file=sys.stderr)


def _dockerd_pid() -> int | None:
    r = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True)
    pids = r.stdout.split()
    return int(pids[0]) if pids else None


@pytest.mark.serial
@pytest.mark.skipif(
    not (os.environ.get("CI") or os.environ.get("HP_FAULTS_ENGINE_RESTART")),
    reason="restarts the machine's Docker engine: only in CI (CI=1) or with HP_FAULTS_ENGINE_RESTART=1",
)
@pytest.mark.skipif(
    shutil.which("systemctl") and subprocess.run(["systemctl", "is-active", "-q", "docker"]).returncode == 0,
    reason="dockerd is managed by systemd here",
)
def test_engine_restart_with_a_cluster_alive(hp, tmp_path):
    name = cluster(hp, tmp_path, workers=2)
    pid = _dockerd_pid()
    assert pid, "no dockerd process"
    cmdline = open(f"/proc/{pid}/cmdline").read().split("\0")[:-1]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    while _dockerd_pid() is not None and time.monotonic() - t0 < 60:
        time.sleep(0.2)
    stopped = time.monotonic() - t0
    subprocess.Popen(
        cmdline,
        stdout=open("/tmp/dockerd.log", "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    t1 = time.monotonic()
    while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        assert time.monotonic() - t1 < 60, "dockerd did not come back"
        time.sleep(0.2)
    engine_back = time.monotonic() - t1
    # the agent (still running) sees the dead containers and recovers them; the controller first
    while True:
        r = subprocess.run(["docker", "exec", f"hp-{name}-controller-1", "scontrol", "ping"], capture_output=True)
        if r.returncode == 0:
            break
        assert time.monotonic() - t1 < 120, "the controller never came back"
        time.sleep(0.2)
    ctl_back = time.monotonic() - t1
    job = job_runs(hp, name, 2, timeout=120)
    took = converge(hp, name, timeout=120)
    print(
        f"\nengine restart: dockerd stopped in {stopped:.1f} s, answered {engine_back:.1f} s after start; "
        f"controller back {ctl_back:.1f} s and first srun -N2 {ctl_back + job:.1f} s after the engine started; "
        f"converged {took:.1f} s later",
        file=sys.stderr,
    )


def test_a_container_wedged_by_pause_during_an_exec_is_thawed_and_restarted():
    """Docker 20.10: `docker pause` while an exec starts leaves the container wedged (the
    exec's `runc init` froze; inspect, unpause and rm -f never answer). hp's restart (what
    a reboot does) thaws it through its freezer cgroup and restarts it, in bounded time."""
    import docker as dockerpy

    from orchestrator.docker.engine import DockerEngine

    api = dockerpy.APIClient(timeout=30)
    probe = dockerpy.APIClient(timeout=5)
    image = next(t for i in api.images(name="hp-worker") for t in i["RepoTags"] or [])
    cid = api.create_container(image, entrypoint=["sleep", "600"], labels={"io.hp.managed": "1"})["Id"]
    api.start(cid)
    stop = threading.Event()

    def execs() -> None:
        while not stop.is_set():
            try:
                api.exec_start(api.exec_create(cid, ["true"])["Id"])
            except dockerpy.errors.APIError:  # paused: refused at once
                time.sleep(0.01)
            except Exception:  # noqa: BLE001 - a read timeout while wedged: try again
                time.sleep(0.1)

    t = threading.Thread(target=execs, daemon=True)
    t.start()
    wedged = 0
    try:
        for attempt in range(30):
            time.sleep(0.2)
            api.pause(cid)
            try:
                probe.inspect_container(cid)
            except Exception:  # noqa: BLE001 - the read timeout is the wedge
                wedged = attempt + 1
                break
            api.unpause(cid)
        stop.set()
        if not wedged:
            pytest.skip("this engine did not wedge in 30 pauses during execs (fixed in Docker 23)")
        t0 = time.monotonic()
        DockerEngine().restart(cid, timeout=1)
        took = time.monotonic() - t0
        state = probe.inspect_container(cid)["State"]
        assert state["Running"] and not state["Paused"], state
        assert took < 45, took
        print(f"\nwedged at pause {wedged}; thawed and restarted in {took:.1f} s", file=sys.stderr)
    finally:
        stop.set()
        DockerEngine().remove_container(cid)
