"""The agent SIGKILLed between a GPU node's reboot and its re-check (issue 47, point 2): the
next agent replaces the node (a new container under the same name), never reboots it again.

Real: the agent process (`python -m orchestrator.agent NAME`, started by the test through
tests/gpu_standin.py), its GPU watch, Docker, Slurm, hp's monitor program in its own
container, the drain, the reboot, the SIGKILL and the replace. Standing in for the hardware
this host lacks (gpu_standin.py): the GPUs (/dev/null and /dev/zero as /dev/nvidia0 and 1) and
NVML, which reports a row remapping pending on the node's GPU after every reboot (a
RECOVER-class finding: reboot, re-check, replace).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from conftest import ROOT, small_spec, wait_until
from gpu_standin import TYPES, apply, monitor_image

INTERVAL_S = 20  # the monitor's snapshots: the re-check comes at the first one after the reboot


def phases(store: Any, name: str, node: str) -> list[tuple[str, str]]:
    """(phase, message) of the node's recorded phases, oldest first."""
    out = []
    for r in store.node_history(name, node):
        phase, message = (r.phase, r.message) if hasattr(r, "phase") else (r[0], r[1])
        out.append((str(phase), message))
    return out


def test_agent_killed_between_a_gpu_reboot_and_its_recheck_replaces_the_node(docker_ok, tmp_path, monkeypatch):
    from fakes import FakeAgents

    from orchestrator.cluster.create import CreateOptions, create
    from orchestrator.cluster.teardown import remove_resources
    from orchestrator.core.context import Cluster, Env
    from orchestrator.docker.engine import DockerEngine
    from orchestrator.docker.images import Images
    from orchestrator.releases import DEFAULT
    from orchestrator.slurm.client import SlurmCli
    from orchestrator.spec.model import validate
    from orchestrator.state.store import Store

    t0 = time.monotonic()
    name = f"hi-gk-{os.urandom(3).hex()}"
    home = tmp_path / "home"
    types = tmp_path / "types.yaml"
    types.write_text(TYPES)
    store = Store(home)
    env = Env(provider=DockerEngine(), store=store, slurm_factory=SlurmCli, agents=FakeAgents())
    doc = small_spec(name, [("gpu", "hi.gpu", 1)], login=False, NodeRecovery="Automatic")
    doc["InstanceGroups"][0]["InstanceType"] = "cpu.nano"
    monkeypatch.setenv("HP_HOME", str(home))
    monkeypatch.setenv("HP_INSTANCE_TYPES", str(types))
    agent_env = {
        **os.environ,
        "HP_HOME": str(home),
        "HP_INSTANCE_TYPES": str(types),
        "HP_GPU_MONITOR_INTERVAL": str(INTERVAL_S),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    agents: list[subprocess.Popen[bytes]] = []
    log = home / "clusters" / name / "gpu-agent.log"

    def start_agent(image: str) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            a = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "gpu_standin.py"), name, image],
                env=agent_env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        agents.append(a)
        return a

    c = Cluster(env, name)
    try:
        image = monitor_image(Images(env.provider, DEFAULT).refs()["worker"], tmp_path)  # the spec's release
        apply(monkeypatch.setattr, image)
        create(env, validate(doc, env.catalogue), CreateOptions(timeout=120))
        first = c.node_containers()["gpu-1"].id
        agent = start_agent(image)

        def rebooted() -> bool:
            ps = [p for p, _ in phases(store, name, "gpu-1")]
            return "Rebooting" in ps and ps[-1] == "Running" and ps.index("Rebooting") < len(ps) - 1

        wait_until(rebooted, 90, "gpu-1 drained for the pending remap and rebooted", poll=0.1)
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        at_kill = phases(store, name, "gpu-1")
        assert c.node_containers()["gpu-1"].id == first, "replaced before the agent was killed"
        assert [p for p, _ in at_kill].count("Rebooting") == 1 and "Replacing" not in [p for p, _ in at_kill], at_kill
        print(f"\nagent SIGKILLed {time.monotonic() - t0:.1f} s in, after the reboot: {at_kill}", file=sys.stderr)
        start_agent(image)

        def replaced() -> Any:
            cont = c.node_containers().get("gpu-1")
            ps = [p for p, _ in phases(store, name, "gpu-1")]
            upto = ps[: ps.index("Replacing")] if "Replacing" in ps else ps
            assert upto.count("Rebooting") == 1, f"gpu-1 rebooted again, not replaced: {phases(store, name, 'gpu-1')}"
            back = "Replacing" in ps and ps[-1] == "Running" and ps.index("Replacing") < len(ps) - 1
            return cont is not None and cont.id != first and cont.running and back and ps

        ps = wait_until(replaced, 120, "gpu-1 replaced by the restarted agent, its new container Running", poll=0.5)
        history = phases(store, name, "gpu-1")
        before = ps[: ps.index("Replacing")]
        assert before.count("Rebooting") == 1, history  # one reboot for the finding, then the replace
        why = next(m for p, m in history if p == "Replacing")
        assert "GPU finding: hp:gpu:recover:remap-pending" in why, history  # the GPU watch's step, not another's
        print(f"gpu-1 replaced {time.monotonic() - t0:.1f} s in: {history}", file=sys.stderr)
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGTERM)
                a.wait(timeout=20)
        remove_resources(env.provider, name)
