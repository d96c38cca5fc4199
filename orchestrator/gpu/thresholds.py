"""Per-model GPU thresholds, shipped as package data (orchestrator/data/gpu-thresholds.yaml).

The loader validates the whole file and reports every problem at once, each
naming the file and where in it: an unknown model (not one of
discovery.KNOWN_MODELS), an unknown or mistyped field, a negative figure, an
NCCL GPU count below 2, a tolerance outside (0, 1). An overlay file
(``HP_GPU_THRESHOLDS``) replaces shipped models of the same name.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import resources
from ..errors import BadInput
from .discovery import KNOWN_MODELS

ENV_OVERLAY = "HP_GPU_THRESHOLDS"
SHIPPED = "gpu-thresholds.yaml"  # package data (resources.data)
DEFAULT_TOLERANCE = 0.10


class ThresholdsError(ValueError):
    """A thresholds file that cannot be used, or a model without thresholds.
    problems: one line each, prefixed by the file."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        head = "bad GPU thresholds" if len(self.problems) == 1 else f"bad GPU thresholds: {len(self.problems)} problems"
        text = (
            f"{head}: {self.problems[0]}"
            if len(self.problems) == 1
            else "\n".join([head] + [f"  - {p}" for p in self.problems])
        )
        super().__init__(text)


@functools.cache
def _file_model() -> type[Any]:
    """The file's pydantic model, made on first use: importing this module (the health
    checks' service, `hp health-check status`) loads no pydantic."""
    from pydantic import BaseModel, ConfigDict, Field, field_validator

    class _Model(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=False)

        Measured: bool
        Source: str = ""
        Bf16GemmTflops: float | None = Field(default=None, gt=0)
        HbmCopyGBps: float | None = Field(default=None, gt=0)
        NcclAllReduceBusBwGBps: dict[int, float] = Field(default_factory=dict)
        NcclAllReduceBusBwGBpsPcie: dict[int, float] = Field(default_factory=dict)

        @field_validator("NcclAllReduceBusBwGBps", "NcclAllReduceBusBwGBpsPcie")
        @classmethod
        def _gpu_counts(cls, v: dict[int, float]) -> dict[int, float]:
            for n, bw in v.items():
                if n < 2:
                    raise ValueError(f"GPU count {n}: all_reduce thresholds start at 2 GPUs (one rank has busbw 0)")
                if bw <= 0:
                    raise ValueError(f"{n} GPUs: bus bandwidth must be > 0, got {bw}")
            return v

    class _File(BaseModel):
        model_config = ConfigDict(extra="forbid")

        TolerancePerNode: float = Field(default=DEFAULT_TOLERANCE, gt=0, lt=1)
        Models: dict[str, _Model] = Field(default_factory=dict)

    return _File


@dataclass(frozen=True)
class GpuThresholds:
    """The thresholds of one model; None / empty: not judged against a figure
    (only against the node's best GPU)."""

    model: str
    measured: bool
    source: str
    bf16_gemm_tflops: float | None = None
    hbm_copy_gbps: float | None = None
    nccl_busbw_gbps: Mapping[int, float] = field(default_factory=dict)
    nccl_busbw_gbps_pcie: Mapping[int, float] = field(default_factory=dict)
    origin: str = ""  # the file it came from

    def nccl_min(self, n_gpus: int, nvlink: bool = True) -> float | None:
        """Least all_reduce busbw for a node of n_gpus: the entry for the
        largest count <= n_gpus; None below 2 GPUs or without an entry."""
        table = self.nccl_busbw_gbps if nvlink else self.nccl_busbw_gbps_pcie
        keys = [k for k in table if k <= n_gpus]
        if n_gpus < 2 or not keys:
            return None
        return float(table[max(keys)])


@dataclass(frozen=True)
class ThresholdTable:
    tolerance: float
    models: Mapping[str, GpuThresholds]
    sources: tuple[str, ...]

    def for_model(self, model: str) -> GpuThresholds:
        try:
            return self.models[model]
        except KeyError:
            raise ThresholdsError(
                f"no GPU thresholds for model {model!r} in {', '.join(self.sources)} (models there: "
                f"{', '.join(sorted(self.models)) or 'none'}); add it to a file named by {ENV_OVERLAY}"
            ) from None


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(x) for x in loc)


def parse_thresholds(text: str, source: str) -> ThresholdTable:
    """Validate one thresholds file. Raises ThresholdsError listing every
    problem, each as "<source>: <where>: <what>"."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ThresholdsError(f"{source}: not YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ThresholdsError(
            f"{source}: expected a mapping with Models (and TolerancePerNode), got {type(doc).__name__}"
        )
    problems: list[str] = []
    models = doc.get("Models")
    if isinstance(models, dict):
        for name in models:
            if name not in KNOWN_MODELS:
                problems.append(
                    f"{source}: Models.{name}: unknown GPU model {name!r} (known: {', '.join(sorted(KNOWN_MODELS))})"
                )
    from pydantic import ValidationError

    try:
        parsed = _file_model().model_validate(doc)
    except ValidationError as e:
        for err in e.errors():
            where = _loc(err["loc"])
            msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            got = "" if err["type"] == "extra_forbidden" else f" (got {err.get('input')!r})"
            problems.append(f"{source}: {where}: {msg}{got}")
        raise ThresholdsError(problems) from None
    if problems:
        raise ThresholdsError(problems)
    out = {
        name: GpuThresholds(
            model=name,
            measured=m.Measured,
            source=m.Source,
            bf16_gemm_tflops=m.Bf16GemmTflops,
            hbm_copy_gbps=m.HbmCopyGBps,
            nccl_busbw_gbps=dict(m.NcclAllReduceBusBwGBps),
            nccl_busbw_gbps_pcie=dict(m.NcclAllReduceBusBwGBpsPcie),
            origin=source,
        )
        for name, m in parsed.Models.items()
    }
    return ThresholdTable(tolerance=parsed.TolerancePerNode, models=out, sources=(source,))


def merge(base: ThresholdTable, overlay: ThresholdTable, overlay_has_tolerance: bool) -> ThresholdTable:
    return ThresholdTable(
        tolerance=overlay.tolerance if overlay_has_tolerance else base.tolerance,
        models={**base.models, **overlay.models},
        sources=base.sources + overlay.sources,
    )


def shipped_text() -> str:
    return resources.data(SHIPPED).read_text()


def load_thresholds(
    extra: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> ThresholdTable:
    """The shipped table, overlaid by `extra` or $HP_GPU_THRESHOLDS if set."""
    table = parse_thresholds(shipped_text(), f"built-in data/{SHIPPED}")
    path = extra or (env if env is not None else os.environ).get(ENV_OVERLAY)
    if not path:
        return table
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ThresholdsError(f"{p}: cannot read: {e.strerror}") from None
    over = parse_thresholds(text, str(p))
    import yaml

    doc = yaml.safe_load(text)
    return merge(table, over, isinstance(doc, dict) and "TolerancePerNode" in doc)


def thresholds_checked() -> ThresholdTable:
    """The GPU threshold table (shipped, and HP_GPU_THRESHOLDS); a bad file is bad
    input (exit 2) listing every problem."""
    try:
        return load_thresholds()
    except ThresholdsError as e:
        raise BadInput(e.problems, "bad GPU thresholds") from None
