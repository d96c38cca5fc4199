"""GPU nodes on real Docker and real Slurm.

- On a host without GPUs (this lab): a GPU type is refused before anything is made
  (exit 2, InsufficientCapacity naming GPUs); and Slurm's side of a GPU node (Gres=,
  the controller's gres.conf shipped configless, `scontrol reconfigure` before the
  node's slurmd starts, CUDA_VISIBLE_DEVICES set by Slurm) is proven with a stand-in
  device (/dev/null seen as /dev/nvidia0 in the node), the rest of hp unchanged.
- On a host with GPUs (skipped elsewhere): a cluster of the type named after them,
  `srun --gres=gpu:1 nvidia-smi -L` showing one GPU, its deep check, its monitor.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import small_spec, write_spec


def host_gpus():
    from orchestrator import assembly

    return assembly.env().gpus(refresh=True)


@pytest.fixture(scope="module")
def gpus(docker_ok, tmp_path_factory):
    old = os.environ.get("HP_HOME")
    os.environ["HP_HOME"] = str(tmp_path_factory.mktemp("gpu-discovery"))
    try:
        return host_gpus()
    finally:
        if old is None:
            os.environ.pop("HP_HOME", None)
        else:
            os.environ["HP_HOME"] = old


def test_a_gpu_type_is_refused_on_a_host_without_gpus(hp, tmp_path, gpus):
    if gpus.gpus:
        pytest.skip(f"this host has GPUs: {gpus.summary()}")
    name = hp.name("gi")
    doc = small_spec(name, [("gpu", "gpu.1x", 1)], login=False)
    path = write_spec(tmp_path / "gpu.json", doc)
    for extra in ((), ("--dry-run",)):
        r = hp("create", "-f", str(path), *extra)
        assert r.returncode == 2, r.stderr
        assert "InsufficientCapacity" in r.stderr and "GPU(s)" in r.stderr and "gpu.1x" in r.stderr
        assert "no NVIDIA GPU device" in r.stderr
    assert hp.json("list")["ClusterSummaries"] == []
    from orchestrator.docker.engine import DockerEngine

    p = DockerEngine()
    assert p.containers(name) == [] and p.networks(name) == [] and p.volumes(name) == []
    cap = hp.json("capacity", "show")["Pool"]
    assert cap["Gpus"] == [] and "no NVIDIA GPU device" in cap["GpuDiscovery"]


def test_slurm_side_of_a_gpu_node_with_a_stand_in_device(docker_ok, tmp_path, monkeypatch, gpus):
    """The core's GPU path on real Slurm 24.11, on a CPU host: discovery says the host
    has two "h200" GPUs whose device nodes are /dev/null and /dev/zero (seen as
    /dev/nvidia0 and /dev/nvidia1 in the nodes). What is real: the node containers, the
    capacity decision, `Gres=gpu:h200:1` in slurmd -Z --conf, the controller's gres.conf
    (written after slurmctld started, at create, and rewritten at scale-up), the
    reconfigure before each GPU node's slurmd starts, and Slurm's CUDA_VISIBLE_DEVICES."""
    from fakes import FakeAgents
    from gpu_standin import stand_in_gpus

    from orchestrator.cluster.create import CreateOptions, create
    from orchestrator.cluster.teardown import remove_resources
    from orchestrator.core.context import Cluster, Env
    from orchestrator.core.launcher import Launcher
    from orchestrator.docker import images as images_mod
    from orchestrator.docker.engine import DockerEngine
    from orchestrator.gpu import gresconf
    from orchestrator.slurm.client import SlurmCli
    from orchestrator.slurm.model import parse_nodes
    from orchestrator.spec.model import validate
    from orchestrator.state.store import Store

    stand_in_gpus(monkeypatch.setattr)  # tests/gpu_standin.py: /dev/null and /dev/zero as two h200s
    monkeypatch.setattr(images_mod, "GPU_IMAGES", ())  # no GPU check image: nothing here runs CUDA
    types = tmp_path / "types.yaml"
    types.write_text("gi.gpu: {VCpus: 1, CpuLimit: 0.1, MemoryMiB: 256, Gpus: 1, GpuModel: h200}\n")
    monkeypatch.setenv("HP_INSTANCE_TYPES", str(types))
    name = f"gi-gres-{os.urandom(3).hex()}"
    env = Env(provider=DockerEngine(), store=Store(tmp_path / "home"), slurm_factory=SlurmCli, agents=FakeAgents())
    doc = small_spec(name, [("gpu", "gi.gpu", 1)], login=False)
    doc["InstanceGroups"][0]["InstanceType"] = "cpu.nano"
    try:
        spec = validate(doc, env.catalogue)
        create(env, spec, CreateOptions(timeout=120))
        c = Cluster(env, name)
        ctl = c.controller_container
        conf = gresconf.current_gres_conf(c)
        assert "NodeName=gpu-1 Name=gpu Type=h200 File=/dev/nvidia0" in conf
        node = c.node_containers()["gpu-1"]
        assert node.labels["io.hp.gpu-devices"] == "/dev/nvidia0" and node.gpus == ["GPU-standin-0"]

        def srun(node: str) -> str:
            r = env.provider.exec(
                ctl, ["srun", "-w", node, "--gres=gpu:1", "sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES; ls /dev/nvidia*"]
            )
            assert r.exit_code == 0, r.output
            return r.output

        out = srun("gpu-1")
        assert "CVD=0" in out and "/dev/nvidia0" in out
        shown = env.provider.exec(ctl, ["scontrol", "show", "node", "gpu-1"]).output
        assert "Gres=gpu:h200:1" in shown
        # scale-up: the new node's lines, then a reconfigure, then its slurmd
        g = c.spec.group("gpu")
        lau = Launcher(c, c.images.refs())
        cid = lau.create_many([(g, 2)])["gpu-2"]
        assert isinstance(cid, str), cid
        assert "NodeName=gpu-2 Name=gpu Type=h200 File=/dev/nvidia1" in gresconf.current_gres_conf(c)
        assert lau.start(cid) is None and not lau.gres_pending
        t0 = time.monotonic()
        while True:
            ns = {
                n.name: n for n in parse_nodes(env.provider.exec(ctl, ["scontrol", "show", "nodes", "--json"]).output)
            }
            if "gpu-2" in ns and ns["gpu-2"].usable:
                break
            assert time.monotonic() - t0 < 60, json.dumps({k: v.display for k, v in ns.items()})
            time.sleep(0.5)
        assert "CVD=0" in srun("gpu-2")  # its one GPU (/dev/nvidia1 on the host side) is GRES index 0
        assert "Gres=gpu:h200:1" in env.provider.exec(ctl, ["scontrol", "show", "node", "gpu-2"]).output
    finally:
        remove_resources(env.provider, name)


def test_a_gpu_cluster_on_a_gpu_host(hp, tmp_path, gpus):
    """Where GPUs are found: the type named after them, Slurm's GRES, the deep check, the monitor."""
    if not gpus.gpus:
        pytest.skip(f"no GPU found on the Docker host: {gpus.why}")
    model = gpus.gpus[0].model
    itype = f"{model}.1x"
    name = hp.name("gi")
    doc = small_spec(name, [("gpu", itype, 1)], login=True, NodeRecovery="Automatic")
    path = write_spec(tmp_path / "gpu.json", doc)
    hp("create", "-f", str(path), "--timeout", "600", check=True)
    out = hp(
        "exec",
        name,
        "--",
        "srun",
        "-p",
        "gpu",
        "--gres=gpu:1",
        "sh",
        "-c",
        "echo CVD=$CUDA_VISIBLE_DEVICES; nvidia-smi -L -i $CUDA_VISIBLE_DEVICES",
        check=True,
    ).stdout
    assert "CVD=0" in out and out.count("GPU ") == 1
    r = hp("health-check", "start", name, "--check", "InstanceStress", "--wait", "--json", timeout=900)
    req = json.loads(r.stdout)["Request"]
    assert req["Results"] == {"gpu-1": "Passed"}, r.stdout
    from orchestrator.docker.engine import DockerEngine

    assert any(c.role == "gpu-monitor" for c in DockerEngine().containers(name))
