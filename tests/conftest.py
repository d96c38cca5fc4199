"""Shared test fixtures.

End-to-end tests use real Docker containers and real Slurm. Each test's clusters get
unique names, run under a private HP_HOME, and are deleted (with every container,
network and volume labelled for them) even when the test fails.
"""

from __future__ import annotations

import collections
import glob
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The Slurm release the end-to-end tests' clusters run: `HP_TEST_SLURM=26.05 make e2e` runs
# them on 26.05 (every `hp create` gets --slurm, unless the test gives one); unset: hp's default.
TEST_SLURM = os.environ.get("HP_TEST_SLURM", "")


def slurm_release() -> Any:
    """The release the tests' clusters run (a SlurmRelease; HP_TEST_SLURM, checked)."""
    from orchestrator.releases import DEFAULT, SlurmRelease, problem

    if TEST_SLURM and (bad := problem(TEST_SLURM, "HP_TEST_SLURM")):
        raise pytest.UsageError(bad)
    return SlurmRelease(TEST_SLURM) if TEST_SLURM else DEFAULT


def docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:  # noqa: BLE001
        return False


# The longest e2e and fault tests (seconds, measured in a 4-worker run on the 2-core VM,
# rounded), by node id prefix. pytest-xdist hands tests out in collection order (groups of
# several tests first), so these are collected first and none of them starts last.
LONGEST_FIRST = {
    "tests/e2e/test_autoresume.py": 240,
    "tests/faults/test_agent_sigkill.py::test_agent_sigkill_at_random_moments": 230,
    "tests/e2e/test_json_contract.py": 130,
    "tests/faults/test_container_faults.py::test_kill_and_pause": 100,
    "tests/e2e/test_health.py::test_network_fault": 85,
    "tests/e2e/test_health.py::test_on_start": 75,
    "tests/e2e/test_recovery.py::test_hand_reboot": 70,
    "tests/e2e/test_install.py": 70,
    "tests/e2e/test_hostile.py::test_events_belong": 70,
    "tests/e2e/test_health.py::test_cgroup_faults": 65,
    "tests/e2e/test_continuous.py::test_concurrent_scaling": 60,
    "tests/e2e/test_health.py": 55,
    "tests/e2e/test_recovery.py": 50,
    "tests/e2e/test_foundation.py::test_default_cluster": 50,
}


def _weight(item: pytest.Item) -> int:
    return max((w for k, w in LONGEST_FIRST.items() if item.nodeid.startswith(k)), default=0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
    items.sort(key=_weight, reverse=True)  # stable: the others keep their order


@pytest.fixture(scope="session")
def docker_ok() -> None:
    if not docker_available():
        if os.environ.get("CI"):
            pytest.fail("no Docker engine answers (make test starts one)")
        pytest.skip("no Docker engine")


class Hp:
    """Runs the real `hp` CLI in a subprocess, with a private HP_HOME."""

    def __init__(self, home: Path):
        self.home = home
        self.env = {**os.environ, "HP_HOME": str(home), "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
        self.made: list[str] = []

    def __call__(
        self, *args: str, check: bool = False, timeout: float = 600, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        if TEST_SLURM and args[:1] == ("create",) and "--slurm" not in args:
            args = (*args, "--slurm", TEST_SLURM)
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"hp {' '.join(args)} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        return r

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "orchestrator.cli", *args]

    def json(self, *args: str) -> Any:
        r = self(*args, "--json", check=True)
        return json.loads(r.stdout)

    def name(self, prefix: str = "t") -> str:
        n = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.made.append(n)
        return n

    def diagnose(self) -> str:
        """What a failed test's clusters looked like: nodes, last events, the agent's log tail."""
        out = []
        for n in self.made:
            r = self("nodes", n, timeout=60)
            out.append(f"=== hp nodes {n}\n{r.stdout}{r.stderr}")
            r = self("events", n, timeout=60)
            out.append(f"=== hp events {n} (last 20)\n" + "\n".join((r.stdout + r.stderr).splitlines()[-20:]))
            log = self.home / "clusters" / n / "agent.log"
            if log.exists():
                lines, seen = [], set()
                for line in log.read_text(errors="replace").splitlines()[-400:]:
                    key = line[24:]  # without the timestamp: a repeated line once
                    if key not in seen:
                        seen.add(key)
                        lines.append(line[:300])
                out.append(f"=== agent log of {n} (last 40 distinct lines)\n" + "\n".join(lines[-40:]))
        return "\n".join(out)

    def cleanup(self) -> None:
        from orchestrator.cluster.teardown import remove_resources
        from orchestrator.docker.engine import DockerEngine as DockerProvider

        for n in self.made:
            self("delete", n, timeout=120)
            remove_resources(DockerProvider(), n)  # whatever a failed delete left


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.stash[_CALL_FAILED] = rep.failed


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def hp(docker_ok: None, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Hp]:
    home = tmp_path_factory.mktemp("hphome")
    h = Hp(home)
    try:
        yield h
    finally:
        if request.node.stash.get(_CALL_FAILED, False):
            print("\n" + h.diagnose(), file=sys.stderr)
        h.cleanup()
        shutil.rmtree(home, ignore_errors=True)


def wait_until(fn: Any, timeout: float, what: str, poll: float = 0.5) -> Any:
    """fn's first true value within `timeout` s; else an AssertionError with its last one.
    A look that took longer than `poll` (an `hp` call on a loaded machine: 0.3-0.6 s of CPU
    each) is followed by as long a pause, so that a wait never keeps more than half a core
    busy with its looks while the suite's other tests need the CPU; the last look is at the
    deadline."""
    deadline = time.monotonic() + timeout
    while True:
        t = time.monotonic()
        last = fn()
        if last:
            return last
        now = time.monotonic()
        if now >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last: {last!r}")
        time.sleep(min(max(poll, now - t), deadline - now))


def put_file(container: Any, path: str, text: str, uid: int = 1000) -> None:
    """A file of the node user's (mode 0755) in a docker-py container, by the engine's archive API."""
    data = text.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(Path(path).name)
        info.size, info.mode, info.uid, info.gid = len(data), 0o755, uid, uid
        tar.addfile(info, io.BytesIO(data))
    assert container.put_archive(str(Path(path).parent), buf.getvalue())


def write_spec(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def small_spec(
    name: str, groups: list[tuple[str, str, int]] | None = None, login: bool = True, itype: str = "cpu.nano", **top: Any
) -> dict[str, Any]:
    """A cluster spec: controller, optional login, and (group, type, count) compute groups."""
    igs: list[dict[str, Any]] = [
        {
            "InstanceGroupName": "controller",
            "InstanceType": "cpu.small",
            "InstanceCount": 1,
            "SlurmConfig": {"NodeType": "Controller"},
        }
    ]
    if login:
        igs.append(
            {
                "InstanceGroupName": "login",
                "InstanceType": itype,
                "InstanceCount": 1,
                "SlurmConfig": {"NodeType": "Login"},
            }
        )
    for g, t, n in groups or [("cpu", itype, 2)]:
        igs.append(
            {
                "InstanceGroupName": g,
                "InstanceType": t,
                "InstanceCount": n,
                "SlurmConfig": {"NodeType": "Compute", "PartitionNames": [g]},
            }
        )
    return {"ClusterName": name, "InstanceGroups": igs, **top}


def _engine_report(tr: Any) -> None:
    """After failures, the local engine's state: does it answer a network list (the call
    a wedged Docker 20.10 stops answering), what is left by role, and, when it is stuck,
    where its goroutines wait (SIGUSR1 makes dockerd write them) and its log's last errors."""
    import docker

    tr.write_sep("=", "the local Docker engine after the run")
    t0 = time.monotonic()
    try:
        c = docker.APIClient(timeout=20)
        c.networks()
        tr.write_line(f"network list answered in {time.monotonic() - t0:.1f} s")
        roles = collections.Counter((x.get("Labels") or {}).get("io.hp.role", "-") for x in c.containers(all=True))
        tr.write_line(f"containers left by io.hp.role: {dict(roles) or 'none'}")
        return
    except Exception as e:  # noqa: BLE001
        tr.write_line(f"network list: no answer in {time.monotonic() - t0:.1f} s ({str(e)[:160]})")
    pid = subprocess.run(["pgrep", "-xo", "dockerd"], capture_output=True, text=True).stdout.strip()
    if pid:
        os.kill(int(pid), signal.SIGUSR1)
        time.sleep(2)
        dumps = sorted(glob.glob("/var/run/docker/goroutine-stacks-*.log"))
        if dumps:
            text = Path(dumps[-1]).read_text(errors="replace")
            waits = collections.Counter()
            for block in text.split("\n\n"):
                lines = block.splitlines()
                if lines and "minutes]" in lines[0] and len(lines) > 2:
                    frame = next((ln for ln in lines[1:] if "sync." not in ln and "runtime." not in ln), lines[1])
                    waits[frame.split("(")[0].strip()] += 1
            tr.write_line(f"{dumps[-1]}: goroutines waiting for minutes, by first own frame:")
            for frame, n in waits.most_common(12):
                tr.write_line(f"    {n:4d}  {frame[:200]}")
    log = Path("/tmp/dockerd.log")
    if log.exists():
        errs = [ln for ln in log.read_text(errors="replace").splitlines() if "level=error" in ln or "level=warn" in ln]
        for ln in errs[-10:]:
            tr.write_line(f"    {ln[:240]}")


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """At the very end, the fault suite's figures and a few lines per failed test (its `E`
    lines): a CI log that keeps only its tail still says what was measured and why each
    test failed."""
    figures = [
        (rep.nodeid, [ln for ln in rep.capstderr.splitlines() if ln.strip()][-6:])
        for rep in terminalreporter.stats.get("passed", [])
        if rep.when == "call" and rep.nodeid.startswith("tests/faults/") and rep.capstderr
    ]
    if figures:  # what the fault suite measured, also in a CI log that keeps only its tail
        terminalreporter.write_sep("=", "fault suite figures")
        for nodeid, lines in figures:
            terminalreporter.write_line(nodeid.split("::", 1)[1])
            for ln in lines:
                terminalreporter.write_line(f"    {ln[:200]}")
    failed = terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", [])
    if not failed:
        return
    _engine_report(terminalreporter)
    terminalreporter.write_sep("=", f"why each of {len(failed)} failed (E lines)")
    for rep in failed:
        e_lines = [ln[2:].strip() for ln in rep.longreprtext.splitlines() if ln.startswith("E ")]
        terminalreporter.write_line(f"{rep.nodeid} [{rep.when}]")
        for ln in (e_lines or rep.longreprtext.splitlines()[-1:])[:4]:
            terminalreporter.write_line(f"    {ln[:240]}")
