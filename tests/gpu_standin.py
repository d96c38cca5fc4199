"""Stand-ins for the GPU hardware this host lacks, and the real agent run with them.

What stands in, and only that (everything else is hp's own code, Docker and Slurm):

- the host's GPUs: discovery answers two "h200" GPUs whose device nodes are /dev/null and
  /dev/zero (seen as /dev/nvidia0 and /dev/nvidia1 in the nodes), wired in mode `devices`,
  as tests/e2e/test_gpu.py does (HP_GPUS stand-ins are never wired, and the GPU watch
  leaves unwired nodes alone);
- the check-gpu image (a large CUDA image, not built here): tests/fixtures/gpu-monitor-image,
  hp's worker image with the real healthchecks/gpu programs and a stand-in nvidia-ml-py
  (tests/unit/gpu_fakes.py's FakeNvml, with a row remapping pending for good).

`python tests/gpu_standin.py NAME IMAGE` is `python -m orchestrator.agent NAME` with
these stand-ins: the agent the test SIGKILLs and starts again (HP_HOME, HP_INSTANCE_TYPES and
HP_GPU_MONITOR_INTERVAL from its environment).
"""

from __future__ import annotations

import hashlib
import runpy
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMAGE_DIR = ROOT / "tests" / "fixtures" / "gpu-monitor-image"
STAND_IN = {"GPU-standin-0": "/dev/null", "GPU-standin-1": "/dev/zero"}
TYPES = "hi.gpu: {VCpus: 1, CpuLimit: 0.1, MemoryMiB: 256, Gpus: 1, GpuModel: h200}\n"


def stand_in_gpus(setattr_: Callable[[Any, str, Any], None]) -> None:
    """Discovery answers the stand-in GPUs, wired in mode `devices` (also tests/e2e/test_gpu.py).
    `setattr_`: pytest's monkeypatch.setattr in a test, setattr in the agent."""
    from orchestrator.gpu import inventory
    from orchestrator.gpu.discovery import GpuRecord
    from orchestrator.gpu.wiring import GpuWiring

    class StandIn(inventory.HostGpuInfo):
        def wiring(self, ids):  # type: ignore[no-untyped-def]
            k = [list(STAND_IN).index(i) for i in ids]
            return GpuWiring(
                "devices",
                tuple(ids),
                devices=tuple(f"{STAND_IN[i]}:/dev/nvidia{j}:rwm" for i, j in zip(ids, k, strict=True)),
                device_files=tuple(f"/dev/nvidia{j}" for j in k),
            )

    info = StandIn(
        engine="",
        source="discovery",
        gpus=tuple(GpuRecord(i, u, "stand-in H200", "h200", minor_number=i) for i, u in enumerate(STAND_IN)),
        mode="devices",
        host_cpus=2,
        host_memory_mib=4096,
    )
    setattr_(inventory, "discover", lambda *a, **k: info)


def apply(setattr_: Callable[[Any, str, Any], None], image: str) -> None:
    """The stand-in GPUs (stand_in_gpus); the check-gpu image is `image`."""
    from orchestrator.docker.images import Images

    stand_in_gpus(setattr_)
    tag = Images.tag

    def tag_or_stand_in(self, d, base_id=None):  # type: ignore[no-untyped-def]
        return image if d.name == "check-gpu" else tag(self, d, base_id)

    setattr_(Images, "tag", tag_or_stand_in)


def monitor_image(worker: str, tmp: Path) -> str:
    """The stand-in check-gpu image, FROM hp's worker image `worker`, tagged by what it is
    made of: built once."""
    files = {
        "Dockerfile": IMAGE_DIR / "Dockerfile",
        "pynvml.py": IMAGE_DIR / "pynvml.py",
        "hp_gpu_check.py": ROOT / "healthchecks" / "gpu" / "hp_gpu_check.py",
        "hp_gpu_monitor.py": ROOT / "healthchecks" / "gpu" / "hp_gpu_monitor.py",
        "gpu_fakes.py": ROOT / "tests" / "unit" / "gpu_fakes.py",
    }
    fixtures = ROOT / "tests" / "fixtures" / "gpu-h200"
    h = hashlib.sha256(worker.encode())
    for src in [*files.values(), *sorted(fixtures.iterdir())]:
        h.update(b"\0" + src.name.encode() + b"\0" + src.read_bytes())
    ref = "hp-test-gpumon:" + h.hexdigest()[:12]
    from orchestrator.docker.engine import DockerEngine

    p = DockerEngine()
    if p.image_id(ref) is None:
        ctx = tmp / "gpu-monitor-image"
        ctx.mkdir()
        for name, src in files.items():
            shutil.copy(src, ctx / name)
        shutil.copytree(fixtures, ctx / "gpu-h200")
        p.build_image(ctx, ref, None, {"PARENT": worker}, lambda line: None)
    return ref


if __name__ == "__main__":
    name, image = sys.argv[1], sys.argv[2]
    apply(setattr, image)
    sys.argv = [sys.argv[0], name]
    runpy.run_module("orchestrator.agent", run_name="__main__", alter_sys=True)
