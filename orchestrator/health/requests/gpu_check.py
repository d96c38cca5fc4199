"""The GPU part of InstanceStress on a GPU node: hp's check program
(healthchecks/gpu/hp_gpu_check.py) in hp's GPU check image, in a
check container that shares the node's network and limits and is given the node's
own GPUs (the node's wiring, gpu/inventory.py), judged by gpu/judge.py.

DCGM runs only when a DCGM image is configured (HP_DCGM_IMAGE): `dcgmi diag -r N -j`
in that image with the node's GPUs. Without one, the result says "DCGM not
configured" (an info finding: never a silent pass, never a failure nobody asked
for). A configured image that is not on the engine: the check says so (a setup
finding, action none: the node stays drained, nothing is rebooted for it).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...core.context import Cluster
from ...docker.images import GPU_IMAGES
from ...docker.views import Container
from ...errors import TRANSIENT, BadInput
from ...gpu import dcgm
from ...gpu.judge import DcgmRun, Finding, GpuVerdict, judge_gpu_check, make_verdict
from ...gpu.thresholds import thresholds_checked
from ...gpu.wiring import GpuWiring, GpuWiringError
from ...naming import L_GPU_MODEL, L_GPUS
from ...spec.catalogue import InstanceType
from ...verdict import Action
from . import sidecar

log = logging.getLogger("hp.health")

CHECK_PROGRAM = "/opt/hp-gpu/bin/hp_gpu_check.py"
ENV_DCGM_IMAGE = "HP_DCGM_IMAGE"


@dataclass(frozen=True)
class GpuCheckOptions:
    gemm_seconds: float = 5.0
    dcgm_level: int = 2


def check_argv(expected_gpus: int, opts: GpuCheckOptions) -> list[str]:
    """The check program's command line: argv only, no shell."""
    return ["python3", CHECK_PROGRAM, "--expected-gpus", str(expected_gpus), "--gemm-seconds", f"{opts.gemm_seconds:g}"]


def image_ref(cluster: Cluster) -> str:
    return cluster.images.refs(GPU_IMAGES)["check-gpu"]


def node_wiring(cluster: Cluster, node: Container) -> GpuWiring | None:
    """The node's GPUs, given to a check or monitor container the way the node has
    them; None for HP_GPUS stand-ins. GpuWiringError when they cannot be."""
    if not node.gpus:
        raise GpuWiringError(f"{node.node} has no GPUs (no {L_GPUS} label)")
    return cluster.env.gpus(host=node.host).wiring(node.gpus)  # its own host's GPUs


def node_model(cluster: Cluster, node: Container) -> str | None:
    model = node.labels.get(L_GPU_MODEL)
    if model:
        return model
    models = cluster.env.gpus(host=node.host).model_of()
    return models.get(node.gpus[0]) if node.gpus else None


def condemned_gpus(findings: Sequence[Finding], by_index: Mapping[int, str], node_gpus: Sequence[str]) -> list[str]:
    """The node's GPUs its replace-class findings condemn (to quarantine, so that a
    replacement gets others): those named by NVML index (through `by_index`: index ->
    UUID as the check or monitor saw them); every GPU of the node when a finding names
    none (a GPU missing, a wrong all_reduce)."""
    bad = [f for f in findings if f.fails and f.action is Action.REPLACE]
    if not bad:
        return []
    named = {by_index.get(f.gpu) for f in bad if f.gpu is not None}
    if any(f.gpu is None for f in bad) or not named <= set(node_gpus):
        return list(node_gpus)
    return sorted(u for u in named if u)


def uuids_by_index(output: str) -> dict[int, str]:
    """NVML index -> UUID from the check program's JSON (its last line)."""
    try:
        doc = json.loads(output.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {}
    sw = doc.get("software") if isinstance(doc, dict) else None
    gpus = sw.get("gpus") if isinstance(sw, dict) else None
    return {
        g["index"]: g["uuid"]
        for g in gpus or []
        if isinstance(g, dict) and isinstance(g.get("index"), int) and isinstance(g.get("uuid"), str)
    }


@dataclass
class GpuCheckResult:
    verdict: GpuVerdict
    output: str
    condemned: list[str] = field(default_factory=list)  # GPU ids a replace-class finding names


def _setup_failure(code: str, message: str) -> GpuVerdict:
    return make_verdict([Finding(code, "error", Action.NONE, message)], {})


def run_dcgm(cluster: Cluster, node: Container, wiring: GpuWiring, rid: str, level: int) -> DcgmRun | None:
    """DCGM's diagnostic in the configured image; None when none is configured."""
    image = os.environ.get(ENV_DCGM_IMAGE, "").strip()
    if not image:
        return None
    if cluster.p.image_id(image) is None:
        return DcgmRun(
            image, error="the image is not on the Docker engine (pull or load it there, or unset HP_DCGM_IMAGE)"
        )
    try:
        sc = sidecar.start(cluster, node, image, rid, gpus=wiring)
        try:
            res = sidecar.run(cluster, sc, dcgm.command(level))
        finally:
            sidecar.stop(cluster, sc)
    except TRANSIENT as e:
        return DcgmRun(image, error=str(e)[:300])
    return DcgmRun(image, output=res.output, exit_code=res.exit_code)


def run_gpu_check(
    cluster: Cluster, node: Container, itype: InstanceType, rid: str, opts: GpuCheckOptions = GpuCheckOptions()
) -> GpuCheckResult:
    """Run and judge one GPU node's check. Engine failures while running it propagate
    (TRANSIENT: the check did not run)."""
    try:
        table = thresholds_checked()
    except BadInput as e:  # the file changed since the request was accepted: a setup problem
        return GpuCheckResult(_setup_failure("gpu-thresholds", str(e)), str(e))
    image = image_ref(cluster)
    if not cluster.images.exists(image):
        msg = f"the GPU check image {image} is not built ('hp images build --gpu')"
        return GpuCheckResult(_setup_failure("gpu-check-image-missing", msg), msg)
    try:
        wiring = node_wiring(cluster, node)
    except GpuWiringError as e:
        msg = f"the node's GPUs cannot be given to its check container: {e}"
        return GpuCheckResult(_setup_failure("gpu-wiring", msg), msg)
    if wiring is None:
        msg = "stand-in GPUs (HP_GPUS): there is no real GPU to check"
        return GpuCheckResult(make_verdict([Finding("gpu-stand-in", "warning", Action.NONE, msg)], {}), msg)
    sc = sidecar.start(cluster, node, image, rid, gpus=wiring)
    try:
        res = sidecar.run(cluster, sc, check_argv(itype.gpus, opts))
    finally:
        sidecar.stop(cluster, sc)
    d = run_dcgm(cluster, node, wiring, rid, opts.dcgm_level)
    model = itype.gpu_model or node_model(cluster, node)
    limits = table.models.get(model) if model else None
    v = judge_gpu_check(
        res.output, expected_gpus=itype.gpus, model=model, thresholds=limits, tolerance=table.tolerance, dcgm=d
    )
    out = res.output
    if d is None:
        out += "\nDCGM not configured (set HP_DCGM_IMAGE to a DCGM image on the engine)\n"
    else:
        out += f"\n==== DCGM ({d.image}) ====\n" + (d.error or d.output)
    return GpuCheckResult(v, out, condemned_gpus(v.findings, uuids_by_index(res.output), node.gpus))
