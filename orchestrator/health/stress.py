"""InstanceStress: stress-ng CPU and memory with verification on every node, DCGM
diagnostics and a GPU count on GPU nodes. Judged on bogo-ops per CPU-second (so a
node that merely waited for busy siblings is not blamed) and on what the node's own
cgroup grants against what its type promises."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..catalogue import InstanceType
from ..cluster import Cluster
from . import sidecar
from .logic import grant_problems, thresholds
from .parsers import ParseError, Verdict, judge_dcgm, parse_dcgm, parse_stress_ng

YAML_MARK = "@@HP-STRESS-YAML@@"
RC_MARK = "@@HP-STRESS-RC="


@dataclass(frozen=True)
class StressOptions:
    seconds: int = 3
    vm_bytes: str = "64M"
    dcgm_level: int = 2


def stress_command(opts: StressOptions, cpus: float | None) -> str:
    """stress-ng with one CPU stressor per granted CPU (at least one) and one memory
    stressor, verifying results; prints its log, then its YAML metrics."""
    n = max(1, math.ceil(cpus or 1))
    return (f"stress-ng --cpu {n} --vm 1 --vm-bytes {opts.vm_bytes} --verify --metrics-brief "
            f"--timeout {opts.seconds}s --yaml /tmp/hp-stress.yaml 2>&1; rc=$?; "
            f"echo '{YAML_MARK}'; cat /tmp/hp-stress.yaml 2>/dev/null; echo '{RC_MARK}'$rc")


def split_output(out: str) -> tuple[str, str, int]:
    """(log, yaml, stress-ng exit status) from the output of stress_command."""
    log, _, rest = out.partition(YAML_MARK)
    yml, _, rc = rest.rpartition(RC_MARK)
    try:
        code = int(rc.strip().split()[0])
    except (ValueError, IndexError):
        code = -1  # the shell itself was killed (e.g. out of memory)
    return log, yml, code


def judge(itype: InstanceType, out: str, granted_cpus: float | None, limits_problems: list[str]) -> Verdict:
    log, yml, code = split_output(out)
    th = thresholds(itype)
    try:
        res = parse_stress_ng(yml, log)
    except ParseError as e:
        return Verdict(False, [f"stress-ng output unreadable: {e}"], {"exit_code": float(code)})
    v = judge_stress(res, code, th, granted_cpus)
    v.reasons += limits_problems
    v.passed = not v.reasons
    return v


def judge_stress(res, code: int, th: dict[str, float], granted_cpus: float | None) -> Verdict:
    from .parsers import judge_stress as js

    return js(res, code, {"cpu": th["StressCpuBogoOpsPerCpuSecond"], "vm": th["StressVmBogoOpsPerCpuSecond"]},
              per="cpu", granted_cpus=granted_cpus)


def run_stress(cluster: Cluster, sc: sidecar.Sidecar, itype: InstanceType, opts: StressOptions) -> tuple[Verdict, str]:
    """Run the stress (and on GPU nodes the GPU checks) in the node's check container."""
    res = sidecar.run(cluster, sc, stress_command(opts, sc.limits.granted_cpus))
    out = res.output
    _, _, code = split_output(out)
    used = None
    v = judge(itype, out, sc.limits.granted_cpus, [])
    used = v.figures.get("cpus_used_total")
    v.reasons += grant_problems(itype, sc.limits, used)
    if code == -1 and res.exit_code != 0:
        v.reasons.append(f"the check's shell was killed (exit {res.exit_code}): out of memory?")
    if itype.gpus:
        gv, gout = run_gpu(cluster, sc, itype, opts)
        v.reasons += gv.reasons
        v.figures.update({f"gpu.{k}": x for k, x in gv.figures.items()})
        out += "\n\n==== GPU ====\n" + gout
    v.passed = not v.reasons
    return v, out


def run_gpu(cluster: Cluster, sc: sidecar.Sidecar, itype: InstanceType, opts: StressOptions) -> tuple[Verdict, str]:
    """`nvidia-smi -L` against the type's GPU count, then `dcgmi diag -r LEVEL -j` in the
    DCGM image (HP_DCGM_IMAGE; nothing can be pulled here, so it is configurable)."""
    reasons: list[str] = []
    smi = sidecar.run(cluster, sc, "nvidia-smi -L")
    seen = sum(1 for ln in smi.output.splitlines() if ln.startswith("GPU "))
    if seen != itype.gpus:
        reasons.append(f"nvidia-smi -L lists {seen} GPU(s), {itype.name} has {itype.gpus}")
    figures = {"gpus_seen": float(seen), "gpus_expected": float(itype.gpus)}
    image = os.environ.get("HP_DCGM_IMAGE", "nvcr.io/nvidia/cloud-native/dcgm:latest")
    out = smi.output
    try:
        node = next(c for c in cluster.p.containers(cluster.name) if c.labels.get("io.hp.node") == sc.node
                    and c.labels.get("io.hp.role") == "worker")
        dsc = sidecar.start(cluster, node, image, "dcgm")
        try:
            d = sidecar.run(cluster, dsc, ["dcgmi", "diag", "-r", str(opts.dcgm_level), "-j"])
        finally:
            sidecar.stop(cluster, dsc)
        out += "\n" + d.output
        dv = judge_dcgm(parse_dcgm(d.output), d.exit_code)
        reasons += dv.reasons
        figures.update(dv.figures)
    except (ParseError, StopIteration, Exception) as e:  # noqa: BLE001 - no DCGM image is a failed check
        reasons.append(f"DCGM diagnostics did not run: {str(e)[:200]}")
    return Verdict(not reasons, reasons, figures), out
