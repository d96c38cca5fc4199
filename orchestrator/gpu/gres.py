"""Slurm GRES for hp's dynamic GPU nodes (Slurm 24.11, configless), pure.

What a GPU node needs:

* ``GresTypes=gpu`` in the controller's slurm.conf (a gres.conf ``Name`` "must
  match a value in GresTypes in slurm.conf", gres.conf(5));
* ``Gres=gpu:<type>:<N>`` in ``slurmd -Z --conf`` (dynamic_nodes.html: "slurmd -Z
  --conf "RealMemory=80000 Gres=gpu:2 Feature=f1""; slurmd(8): NodeName and Port
  are not allowed there);
* a gres.conf that names the node's device files, or lets slurmd detect them:
  without ``File=`` (or AutoDetect) Slurm counts GPUs but never sets
  ``CUDA_VISIBLE_DEVICES`` (src/plugins/gres/common/gres_common.c: "The gres.conf
  file must identify specific device files in order to set the
  CUDA_VISIBLE_DEVICES env var"; gres.html: "Be sure to specify the File
  parameters in the gres.conf file and ensure they are in the increasing numeric
  order").

Facts that shape the design (Slurm 24.11 docs shipped in Debian 13's
slurm-wlm-doc 24.11.5, and Slurm's source):

1. Configless ships gres.conf from the controller. configless_slurm.html lists
   gres.conf among the "Supported configuration files"; slurmd writes what it
   fetched into SlurmdSpoolDir/conf-cache (linked at /run/slurm/conf) and
   *deletes* a cached file the controller does not have
   (src/common/fetch_config.c ``_write_conf``: ``if (!exists) unlink``), so a node
   cannot keep a gres.conf of its own: every node reads the controller's file.
2. One file for all nodes: lines apply to the nodes named by ``NodeName=`` (a
   hostlist; "If using the gres.conf file to describe the resources available to
   nodes, the first parameter on the line should be NodeName", gres.conf(5)).
   Dynamic nodes are named before they start (hp names them group-index, the
   container's hostname), so the controller's gres.conf can carry a node's lines
   before its slurmd first registers.
3. slurmctld caches the files it ships and reloads them only on ``scontrol
   reconfigure`` (src/slurmctld: ``configless_setup`` "load the internal cached
   config values to avoid regenerating on each RPC"; ``configless_update`` on
   reconfigure), which also pushes them to running slurmds (slurm.conf(5),
   SlurmctldParameters=enable_configless). So when a node's lines are new or
   changed, hp must write the file on the controller AND reconfigure BEFORE that
   node's slurmd starts; writing the lines of the first GPU nodes before
   slurmctld starts avoids the reconfigure at create.
4. AutoDetect. ``nvml`` needs slurmd built with NVML; Debian 13's slurm-wlm 24.11.5
   ships gpu_generic, gpu_nrt and gpu_nvidia plugins but no gpu_nvml (looked at
   in hp's worker image, /usr/lib/x86_64-linux-gnu/slurm-wlm/), so hp's images
   cannot use it. ``nvidia`` (new in 24.11, "No library required, but doesn't
   detect MIGs or NVlinks", gres.conf(5)) reads /proc/driver/nvidia/gpus/*/information
   ("Device Minor" -> /dev/nvidiaN, "Model" -> type, lower case with "_" for
   spaces; src/plugins/gpu/nvidia/gpu_nvidia.c). In a container that /proc is the
   host's unless the NVIDIA runtime masked it: with plain device nodes (or CDI)
   on a host with more GPUs than the node has, AutoDetect finds them all, and
   "If not all system-detected devices are specified by the slurm.conf
   configuration, then the relevant slurmd will be drained" (gres.html). So
   AutoDetect only where the node's /proc view holds exactly its GPUs (the NVIDIA
   runtime, or a node holding every GPU of its host, such as h200.1x on the lent
   one-GPU host); elsewhere explicit ``Name=gpu Type=<t> File=/dev/nvidiaN`` lines.
   "AutoDetect cannot be used with cloud nodes" (gres.conf(5)) is about
   State=CLOUD nodes, not ``slurmd -Z`` ones.
5. A Type given with AutoDetect "should match or be a substring of the value
   that is detected, using an underscore in lieu of any spaces" (gres.conf(5)):
   "NVIDIA H200" is detected as nvidia_h200, and hp's type ``h200`` is a
   substring; ``h100-pcie`` becomes ``h100_pcie`` (slurm_gpu_type).
6. Without ``ConstrainDevices`` (hp runs task/none and proctrack/linuxproc in
   containers), a job step sees every GPU of its node; Slurm sets
   CUDA_VISIBLE_DEVICES, which CUDA honours but ``nvidia-smi -L`` does not (use
   ``nvidia-smi -L -i $CUDA_VISIBLE_DEVICES``). On a one-GPU node the two agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

AUTODETECT_PLUGINS = {"nvml": "gpu_nvml.so", "nvidia": "gpu_nvidia.so"}


class GresError(ValueError):
    """GRES settings that Slurm would refuse or misread."""


def slurm_gpu_type(model: str) -> str:
    """Slurm GRES Type for hp's short model name ("h100-pcie" -> "h100_pcie"):
    letters, digits and "_" only, so that it is a substring of what AutoDetect
    reports."""
    t = re.sub(r"[^a-z0-9_]", "_", model.lower()).strip("_")
    if not t:
        raise GresError(f"GPU model {model!r} gives an empty Slurm GRES type")
    return t


def node_gres(model: str, count: int) -> str:
    """``gpu:<type>:<count>``, the value of Gres= and of srun --gres."""
    if count < 1:
        raise GresError(f"a GPU node needs at least one GPU, got {count}")
    return f"gpu:{slurm_gpu_type(model)}:{count}"


def slurmd_conf_gres(model: str, count: int) -> str:
    """The ``Gres=`` word of ``slurmd -Z --conf`` for a node with `count` GPUs."""
    return f"Gres={node_gres(model, count)}"


def slurm_conf_lines(any_gpu_node: bool) -> list[str]:
    """Lines the controller's slurm.conf needs for GPU nodes."""
    return ["GresTypes=gpu"] if any_gpu_node else []


def autodetect_choice(slurm_gpu_plugins: Iterable[str], nvml_library: bool = False) -> str | None:
    """Which AutoDetect the node image's slurmd supports: ``nvml`` when its
    gpu_nvml plugin is there and the node has libnvidia-ml (it detects NVLinks),
    else ``nvidia`` when gpu_nvidia is there (Slurm >= 24.11), else None.
    `slurm_gpu_plugins`: file names in the image's Slurm plugin folder."""
    have = {p.rsplit("/", 1)[-1] for p in slurm_gpu_plugins}
    if AUTODETECT_PLUGINS["nvml"] in have and nvml_library:
        return "nvml"
    if AUTODETECT_PLUGINS["nvidia"] in have:
        return "nvidia"
    return None


@dataclass(frozen=True)
class GresNode:
    """A GPU node as gres.conf sees it.

    name: the Slurm node name (hp: the container's hostname).
    device_files: /dev/nvidiaN of its GPUs, in PCI bus id order (wiring.GpuWiring.device_files).
    proc_filtered: its /proc/driver/nvidia/gpus lists exactly its GPUs (NVIDIA
        runtime, or it holds every GPU of its host), so AutoDetect counts right.
    """

    name: str
    model: str
    device_files: tuple[str, ...]
    proc_filtered: bool = False

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise GresError(f"node name {self.name!r} cannot be a gres.conf NodeName")
        bad = [f for f in self.device_files if not re.fullmatch(r"/dev/nvidia\d+", f)]
        if bad or not self.device_files:
            raise GresError(
                f"node {self.name}: GPU device files must be /dev/nvidiaN, got {', '.join(self.device_files) or 'none'}"
            )
        if len(set(self.device_files)) != len(self.device_files):
            raise GresError(f"node {self.name}: a device file is listed twice: {', '.join(self.device_files)}")

    @property
    def count(self) -> int:
        return len(self.device_files)

    def gres(self) -> str:
        return node_gres(self.model, self.count)


def node_lines(node: GresNode) -> list[str]:
    """Explicit gres.conf lines of one node: one per GPU, in the node's order
    (Slurm numbers a node's GPUs in the order of its File= lines)."""
    t = slurm_gpu_type(node.model)
    return [f"NodeName={node.name} Name=gpu Type={t} File={f}" for f in node.device_files]


HEADER = (
    "# gres.conf of hp cluster {cluster}, written by hp (orchestrator/gpu/gres.py).\n"
    "# Configless: slurmctld ships this file to every slurmd; each node reads its NodeName= lines.\n"
)


def gres_conf(nodes: Sequence[GresNode], autodetect: str | None, cluster: str = "") -> str:
    """The controller's gres.conf for the cluster's GPU nodes.

    With an AutoDetect the image supports (autodetect_choice) and every GPU
    node proc_filtered: one global ``AutoDetect=<plugin>`` line, the same for
    nodes that do not exist yet (no rewrite, no reconfigure when nodes come and
    go). Else explicit lines per node (node_lines), sorted by node name, and the
    file must be rewritten (and slurmctld reconfigured) before a node whose lines
    changed starts (lines_changed).
    """
    names = [n.name for n in nodes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise GresError(f"node(s) listed twice: {', '.join(dup)}")
    if autodetect is not None and autodetect not in AUTODETECT_PLUGINS:
        raise GresError(f"AutoDetect={autodetect!r}: hp uses {' or '.join(AUTODETECT_PLUGINS)}")
    out = [HEADER.format(cluster=cluster or "?").rstrip("\n")]
    if autodetect and all(n.proc_filtered for n in nodes):
        out.append(
            f"# Every GPU node sees exactly its own GPUs in /proc/driver/nvidia: detect them.\nAutoDetect={autodetect}"
        )
    else:
        for n in sorted(nodes, key=lambda n: n.name):
            out.extend(node_lines(n))
    return "\n".join(out) + "\n"


def _significant(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            lines.append(" ".join(line.split()))
    return lines


def lines_changed(old_text: str | None, new_text: str, node: str | None = None) -> bool:
    """Whether slurmctld must be reconfigured: the significant lines (for
    `node` only, with its global lines, when given) differ. Comments, blank
    lines and spacing do not count; line order does (it numbers the GPUs)."""
    old = _significant(old_text or "")
    new = _significant(new_text)
    if node is None:
        return old != new

    def mine(lines: list[str]) -> list[str]:
        return [ln for ln in lines if not ln.lower().startswith("nodename=") or ln.split()[0].split("=", 1)[1] == node]

    return mine(old) != mine(new)
