"""The instance-type catalogue: what a node of a type gets and advertises."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import resources
from ..errors import BadInput


@dataclass(frozen=True)
class InstanceType:
    name: str
    vcpus: int  # CPUs advertised to Slurm
    cpu_limit: float  # cores of the host the container may use (cgroup quota)
    memory_mib: int  # container memory limit and Slurm RealMemory
    gpus: int = 0
    gpu_model: str | None = None  # hp's short model name (h200...); None: any model
    # Deep health-check thresholds (HealthThresholds in the YAML), e.g. IperfGbps.
    health: dict[str, float] = field(default_factory=dict, hash=False, compare=False)


DOCKER_MIN_MEMORY_MIB = 6
"""The engine refuses a smaller memory limit ("Minimum memory limit allowed is 6MB")."""
DOCKER_MIN_CPUS = 0.01
"""The least CPU quota the engine takes ("Range of CPUs is from 0.01 to ...")."""


def range_problems(t: InstanceType) -> list[str]:
    """Values that Docker (at a node's create) or Slurm (at its registration) would refuse."""
    out = []
    if t.vcpus < 1:
        out.append(f"VCpus must be at least 1 (Slurm's CPUs=), got {t.vcpus}")
    if not t.cpu_limit >= DOCKER_MIN_CPUS:  # not <: NaN too
        out.append(f"CpuLimit must be at least {DOCKER_MIN_CPUS} cores (Docker's least CPU quota), got {t.cpu_limit}")
    if t.memory_mib < DOCKER_MIN_MEMORY_MIB:
        out.append(
            f"MemoryMiB must be at least {DOCKER_MIN_MEMORY_MIB} (Docker's least memory limit), got {t.memory_mib}"
        )
    if t.gpus < 0:
        out.append(f"Gpus must be 0 or more, got {t.gpus}")
    return out


def _parse(doc: object, source: str) -> dict[str, InstanceType]:
    if not isinstance(doc, dict):
        raise BadInput(f"{source}: expected a mapping of type name to its fields", "bad instance-type file")
    out: dict[str, InstanceType] = {}
    problems = []
    for name, f in doc.items():
        try:
            t = InstanceType(
                name=str(name),
                vcpus=int(f["VCpus"]),
                cpu_limit=float(f["CpuLimit"]),
                memory_mib=int(f["MemoryMiB"]),
                gpus=int(f.get("Gpus", 0)),
                gpu_model=str(f["GpuModel"]) if f.get("GpuModel") else None,
                health={str(k): float(v) for k, v in (f.get("HealthThresholds") or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            problems.append(
                f"{source}: {name}: needs VCpus, CpuLimit, MemoryMiB (and optional Gpus, GpuModel, HealthThresholds): {e}"
            )
            continue
        if bad := range_problems(t):
            problems += [f"{source}: {name}: {p}" for p in bad]
        else:
            out[t.name] = t
    if problems:
        raise BadInput(problems, "bad instance-type file")
    return out


@functools.cache
def _builtin() -> dict[str, InstanceType]:
    """The shipped catalogue, parsed once per process (it is package data: it does not change)."""
    import yaml

    text = resources.data("instance-types.yaml").read_text()
    return _parse(yaml.safe_load(text), "built-in catalogue")


def load_catalogue(
    extra: str | os.PathLike[str] | None = None, discovered: dict[str, dict] | None = None
) -> dict[str, InstanceType]:
    """The shipped catalogue, then `discovered` types (GPU types named after the
    host's GPUs: gpu/inventory.py), overlaid by `extra` or $HP_INSTANCE_TYPES if set."""
    types = dict(_builtin())
    if discovered:
        found = _parse(discovered, "GPU types discovered on the Docker host")
        types.update({k: v for k, v in found.items() if k not in types})
    extra = extra or os.environ.get("HP_INSTANCE_TYPES")
    if extra:
        import yaml

        p = Path(extra)
        try:
            doc = yaml.safe_load(p.read_text())
        except OSError as e:
            raise BadInput(f"cannot read instance-type file {p}: {e.strerror}") from None
        types.update(_parse(doc, str(p)))
    return types


class Catalogue(Mapping[str, InstanceType]):
    """load_catalogue's result, with the discovered GPU types fetched only when a name is
    not a shipped or user type, or when the whole catalogue is listed: discovery may run
    a probe container on the host, which a cluster of CPU types never needs. A shipped or
    user type's entry does not depend on discovery (discovered types only fill the
    names the shipped catalogue lacks, and the user's file overlays them)."""

    def __init__(self, extra: str | os.PathLike[str] | None, discover: Callable[[], dict[str, dict]]):
        self._extra = extra
        self._static = load_catalogue(extra)
        self._discover = discover
        self._all: dict[str, InstanceType] | None = None
        self._lock = threading.Lock()  # one discovery, whichever thread asks first

    def _full(self) -> dict[str, InstanceType]:
        with self._lock:
            if self._all is None:
                self._all = load_catalogue(self._extra, self._discover())
            return self._all

    def __getitem__(self, name: str) -> InstanceType:
        return self._static[name] if name in self._static else self._full()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._static or name in self._full()

    def __iter__(self) -> Iterator[str]:
        return iter(self._full())

    def __len__(self) -> int:
        return len(self._full())
