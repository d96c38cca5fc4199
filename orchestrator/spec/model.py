"""Cluster spec in the shape of HyperPod's CreateCluster request, and its validation.

Validation collects every problem (with its path in the spec) before failing, as
kind does: the user fixes a spec once, not once per error.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import releases
from ..errors import BadInput
from ..releases import SlurmRelease
from . import lifecycle, userwork
from . import names as specnames
from .catalogue import InstanceType
from .reference import reference_problem

NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
NAME_MAX = 63
SLURM_MAX_NODES = specnames.SLURM_MAX_NODE_COUNT  # slurmctld refuses a MaxNodeCount above this
MIN_MAX_NODES = 128
CHECKS = ("InstanceStress", "InstanceConnectivity")
# The cluster services' defaults (docs/accounting.md says why): accounting adds a few
# tenths of a second to the first job (docs/benchmarks.md) and ~60 MiB in the controller's
# container; REST opens a port on the host (loopback) and is asked for.
ACCOUNTING_DEFAULT = True
REST_DEFAULT = False


class _Model(BaseModel):
    # strict: no coercion ("2" or True as an integer), so hp and the JSON Schema judge alike
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, strict=True)


class SlurmConfig(_Model):
    NodeType: Literal["Controller", "Login", "Compute"]
    PartitionNames: list[str] = Field(default_factory=list)


class PlacementConfig(_Model):
    """hp's own: where a group's nodes go when hosts are registered (`hp hosts add`).
    Hosts: the registered hosts it may use, in order (default: all); Strategy: spread
    (evenly over them; the default for compute groups) or pack (the first that fits;
    the default for the controller and login groups)."""

    Hosts: list[str] = Field(default_factory=list)
    Strategy: Literal["spread", "pack"] | None = None


class LifeCycleSpec(_Model):
    """HyperPod's lifecycle script: OnCreate, a file of the folder SourceS3Uri (here a
    local folder or a file:// URI; recorded as an absolute path), run as root on each
    node of the group before its Slurm daemon starts (docs/lifecycle.md).
    OnCreateTimeout (hp's own): seconds it may take (default 600)."""

    SourceS3Uri: str
    OnCreate: str
    OnCreateTimeout: int | None = Field(default=None, strict=True)

    @property
    def timeout(self) -> int:
        return self.OnCreateTimeout if self.OnCreateTimeout is not None else lifecycle.TIMEOUT_DEFAULT


class InstanceGroup(_Model):
    InstanceGroupName: str
    InstanceType: str
    InstanceCount: int = Field(strict=True)
    MinCount: int | None = Field(default=None, strict=True)
    SlurmConfig: SlurmConfig
    OnStartDeepHealthChecks: list[Literal["InstanceStress", "InstanceConnectivity"]] = Field(default_factory=list)
    Image: str | None = None  # override of the role's image (lab use: a custom or broken image)
    Placement: PlacementConfig | None = None  # hp's own: hosts and strategy (multi-host)
    LifeCycleConfig: LifeCycleSpec | None = None
    # accepted for compatibility with HyperPod files, not used
    ExecutionRole: str | None = None
    ThreadsPerCore: int | None = None
    InstanceStorageConfigs: list[Any] | None = None
    TrainingPlanArn: str | None = None
    OverrideVpcConfig: dict[str, Any] | None = None
    ScheduledUpdateConfig: dict[str, Any] | None = None

    @property
    def node_type(self) -> str:
        return self.SlurmConfig.NodeType

    @property
    def partition(self) -> str | None:
        p = self.SlurmConfig.PartitionNames
        return p[0] if p else None


class AccountingConfig(_Model):
    """hp's own: Slurm accounting (slurmdbd and MariaDB, in the controller's container)."""

    Enabled: bool


class RestConfig(_Model):
    """hp's own: slurmrestd (auth/jwt) behind hp's verifying front on a loopback port."""

    Enabled: bool


class MountConfig(_Model):
    """hp's own: a host folder bind-mounted into every login and compute node (Target:
    default its Source's path)."""

    Source: str
    Target: str | None = None
    ReadOnly: bool = False

    @property
    def target(self) -> str:
        return self.Target if self.Target is not None else self.Source


class ClusterSpec(_Model):
    ClusterName: str
    InstanceGroups: list[InstanceGroup]
    NodeRecovery: Literal["Automatic", "None"] = "Automatic"
    NodeProvisioningMode: Literal["Continuous", "AllOrNothing"] | None = None
    VpcConfig: dict[str, Any] | None = None
    Tags: list[Any] | None = None
    Orchestrator: dict[str, Any] | None = None
    ClusterRole: str | None = None
    AutoScaling: dict[str, Any] | None = None
    # hp's own: Slurm's dynamic-node slots (default: 4x the compute nodes, at least 128),
    # fixed when the cluster is created; recorded with the spec
    MaxNodeCount: int | None = Field(default=None, strict=True)
    # hp's own: the cluster services (absent: the defaults; fixed when the cluster is created)
    Accounting: AccountingConfig | None = None
    Rest: RestConfig | None = None
    # hp's own: the user's work (spec/userwork.py): host folders on the login and compute
    # nodes, and Debian packages added to their images
    Mounts: list[MountConfig] | None = None
    NodePackages: list[str] | None = None
    # hp's own: the Slurm release the nodes run (releases.py; absent: the default, fixed when
    # the cluster is created; a stored spec from before the choice ran releases.BEFORE_CHOICE).
    # Not strict: YAML and JSON give a string, which the enum takes by value.
    SlurmVersion: SlurmRelease | None = Field(default=None, strict=False)

    @property
    def release(self) -> SlurmRelease:
        return self.SlurmVersion if self.SlurmVersion is not None else releases.DEFAULT

    @property
    def packages(self) -> tuple[str, ...]:
        """NodePackages, sorted and once each: what the derived node image is keyed by."""
        return userwork.package_key(self.NodePackages)

    @property
    def accounting(self) -> bool:
        """slurmdbd and its database run, and sacct works."""
        return self.Accounting.Enabled if self.Accounting is not None else ACCOUNTING_DEFAULT

    @property
    def rest(self) -> bool:
        """slurmrestd runs, behind hp's JWT-verifying front."""
        return self.Rest.Enabled if self.Rest is not None else REST_DEFAULT

    def with_services_fixed(self) -> ClusterSpec:
        """The spec with the services' settings and the Slurm release written out (recorded
        at create: a later default does not change an existing cluster)."""
        return self.model_copy(
            update={
                "Accounting": AccountingConfig(Enabled=self.accounting),
                "Rest": RestConfig(Enabled=self.rest),
                "SlurmVersion": self.release,
            }
        )

    @property
    def continuous(self) -> bool:
        return self.NodeProvisioningMode == "Continuous"

    def group(self, name: str) -> InstanceGroup | None:
        return next((g for g in self.InstanceGroups if g.InstanceGroupName == name), None)

    @property
    def controller(self) -> InstanceGroup:
        return next(g for g in self.InstanceGroups if g.node_type == "Controller")

    @property
    def login(self) -> InstanceGroup | None:
        return next((g for g in self.InstanceGroups if g.node_type == "Login"), None)

    @property
    def compute(self) -> list[InstanceGroup]:
        return [g for g in self.InstanceGroups if g.node_type == "Compute"]

    @property
    def max_nodes(self) -> int:
        """Slurm's dynamic-node slots: MaxNodeCount, or the default for the compute nodes."""
        if self.MaxNodeCount is not None:
            return self.MaxNodeCount
        n = sum(g.InstanceCount for g in self.compute)
        return min(max(MIN_MAX_NODES, 4 * n), SLURM_MAX_NODES)


DEFAULT_SPEC: dict[str, Any] = {
    "ClusterName": "hp",
    "NodeRecovery": "Automatic",
    "InstanceGroups": [
        {
            "InstanceGroupName": "controller",
            "InstanceType": "cpu.small",
            "InstanceCount": 1,
            "SlurmConfig": {"NodeType": "Controller"},
        },
        {
            "InstanceGroupName": "login",
            "InstanceType": "cpu.small",
            "InstanceCount": 1,
            "SlurmConfig": {"NodeType": "Login"},
        },
        {
            "InstanceGroupName": "cpu-a",
            "InstanceType": "cpu.small",
            "InstanceCount": 2,
            "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["cpu-a"]},
        },
        {
            "InstanceGroupName": "cpu-b",
            "InstanceType": "cpu.small",
            "InstanceCount": 2,
            "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["cpu-b"]},
        },
    ],
}


def name_problem(what: str, name: object) -> str | None:
    if not isinstance(name, str):
        return f"{what} must be a string"
    if len(name) > NAME_MAX:
        return f"{what} {name!r} is longer than {NAME_MAX} characters"
    if not NAME_RE.fullmatch(name):  # not .match: "$" also matches before a final newline
        return f"{what} {name!r} must match [a-zA-Z0-9](-*[a-zA-Z0-9])*"
    return None


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("literal['InstanceStress','InstanceConnectivity']",):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(spec)"


def _semantic_problems(raw: dict[str, Any], catalogue: Mapping[str, InstanceType], names: bool = True) -> list[str]:
    """Rules HyperPod enforces, checked on the raw document so that they are reported
    together with type errors; with `names`, also the limits of the names hp derives
    (names.py) and the engine's rule for an Image (reference.py): what Docker or Slurm
    would refuse later, after something was made."""
    problems: list[str] = []
    cluster = raw.get("ClusterName")
    if "ClusterName" in raw and (p := name_problem("ClusterName", cluster)):
        problems.append(p)
        cluster = None
    elif names and isinstance(cluster, str):
        problems += specnames.cluster_name_problems(cluster)
    groups = raw.get("InstanceGroups")
    if not isinstance(groups, list):
        return problems
    if not groups:
        problems.append("InstanceGroups: at least a Controller group is required")
    counts = {"Controller": 0, "Login": 0, "Compute": 0}
    seen: dict[str, int] = {}
    partitions: dict[str, str] = {}
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            continue
        path = f"InstanceGroups[{i}]"
        name = g.get("InstanceGroupName")
        if name is not None and (p := name_problem(f"{path}.InstanceGroupName", name)):
            problems.append(p)
        elif isinstance(name, str):
            if names and isinstance(cluster, str):
                problems += specnames.group_name_problems(cluster, name, what=f"{path}.InstanceGroupName")
            if name.lower() in seen:
                problems.append(
                    f"{path}.InstanceGroupName: {name!r} is already used by InstanceGroups[{seen[name.lower()]}]"
                )
            seen.setdefault(name.lower(), i)
        image = g.get("Image")
        if names and isinstance(image, str) and (p := reference_problem(image)):
            problems.append(f"{path}.Image: {_short(image)} {p}")
        pl = g.get("Placement")
        if isinstance(pl, dict) and isinstance(pl.get("Hosts"), list):
            hs = [h for h in pl["Hosts"] if isinstance(h, str)]
            for j, h in enumerate(hs):
                if p := name_problem(f"{path}.Placement.Hosts[{j}]", h):
                    problems.append(p)
            if len(set(hs)) != len(hs):
                problems.append(f"{path}.Placement.Hosts: a host is named twice")
        itype = g.get("InstanceType")
        if isinstance(itype, str) and itype not in catalogue:
            problems.append(
                f"{path}.InstanceType: unknown instance type {itype!r} (known: {', '.join(sorted(catalogue))})"
            )
        sc = g.get("SlurmConfig")
        ntype = sc.get("NodeType") if isinstance(sc, dict) else None
        count = g.get("InstanceCount")
        if isinstance(ntype, str) and ntype in counts:
            counts[ntype] += 1
        if isinstance(count, int) and not isinstance(count, bool):
            if count < 0:
                problems.append(f"{path}.InstanceCount: must be >= 0, got {count}")
            elif count > SLURM_MAX_NODES:
                problems.append(f"{path}.InstanceCount: must be at most {SLURM_MAX_NODES} (Slurm's limit), got {count}")
            if ntype == "Controller" and count != 1:
                problems.append(f"{path}.InstanceCount: a Controller group has exactly 1 instance, got {count}")
            mc = g.get("MinCount")
            if isinstance(mc, int) and not isinstance(mc, bool) and (mc < 0 or mc > count):
                problems.append(f"{path}.MinCount: must be between 0 and InstanceCount ({count}), got {mc}")
        if isinstance(sc, dict):
            parts = sc.get("PartitionNames")
            if ntype == "Compute":
                if not isinstance(parts, list) or len(parts) != 1:
                    problems.append(f"{path}.SlurmConfig.PartitionNames: a Compute group has exactly one partition")
                elif isinstance(parts[0], str):
                    pn = parts[0]
                    if p := name_problem(f"{path}.SlurmConfig.PartitionNames[0]", pn):
                        problems.append(p)
                    elif pp := specnames.partition_name_problems(
                        pn, what=f"{path}.SlurmConfig.PartitionNames[0]", keywords=names
                    ):
                        problems += pp
                    elif pn in partitions:
                        problems.append(
                            f"{path}.SlurmConfig.PartitionNames[0]: partition {pn!r} is already used by group {partitions[pn]!r}"
                        )
                    else:
                        partitions[pn] = str(name)
            elif ntype in ("Controller", "Login") and parts:
                problems.append(f"{path}.SlurmConfig.PartitionNames: only Compute groups have partitions")
    compute_total = sum(
        g.get("InstanceCount")
        for g in groups
        if isinstance(g, dict)
        and isinstance(g.get("InstanceCount"), int)
        and not isinstance(g.get("InstanceCount"), bool)
        and isinstance(g.get("SlurmConfig"), dict)
        and g["SlurmConfig"].get("NodeType") == "Compute"
    )
    mnc = raw.get("MaxNodeCount")
    if isinstance(mnc, int) and not isinstance(mnc, bool):
        if not 1 <= mnc <= SLURM_MAX_NODES:
            problems.append(f"MaxNodeCount: must be between 1 and {SLURM_MAX_NODES} (Slurm's limit), got {mnc}")
        elif compute_total > mnc:
            problems.append(f"InstanceGroups: {compute_total} compute nodes are more than MaxNodeCount {mnc}")
    elif compute_total > SLURM_MAX_NODES:
        problems.append(
            f"InstanceGroups: {compute_total} compute nodes are more than Slurm can hold ({SLURM_MAX_NODES} nodes)"
        )
    if counts["Controller"] != 1:
        problems.append(
            f"InstanceGroups: exactly one group with SlurmConfig.NodeType Controller is required, found {counts['Controller']}"
        )
    if counts["Login"] > 1:
        problems.append(
            f"InstanceGroups: at most one group with SlurmConfig.NodeType Login is allowed, found {counts['Login']}"
        )
    return problems


def validate(
    raw: object,
    catalogue: Mapping[str, InstanceType],
    *,
    name: str | None = None,
    existing: bool = False,
    base: Path | None = None,
) -> ClusterSpec:
    """Validate a spec document; raise BadInput listing every problem. `existing`: the
    stored spec of a cluster that exists (the name limits of names.py, newer than some
    clusters, are not applied: such a cluster must stay readable and deletable).
    `base`: the folder a LifeCycleConfig's relative SourceS3Uri is read from (the spec
    file's; default: the current folder)."""
    if not isinstance(raw, dict):
        raise BadInput("the spec must be a mapping (YAML or JSON object)", "invalid cluster spec")
    raw = dict(raw)
    if name is not None:
        raw["ClusterName"] = name
    problems: list[str] = []
    if existing:  # a cluster recorded before the services existed has none of them
        raw.setdefault("Accounting", {"Enabled": False})
        raw.setdefault("Rest", {"Enabled": False})
        raw.setdefault("SlurmVersion", releases.BEFORE_CHOICE.value)
        raw = _without_ignored_lifecycle(raw)
    elif isinstance(raw.get("InstanceGroups"), list):
        raw["InstanceGroups"], problems = lifecycle.resolve(raw["InstanceGroups"], base or Path.cwd())
    spec = None
    try:
        spec = ClusterSpec.model_validate(raw)
    except ValidationError as e:
        for err in e.errors():
            kind = err["type"]
            loc = _loc(err["loc"])
            if loc == "SlurmVersion":  # the releases named, and a YAML number told apart
                problems.append(releases.problem(err.get("input"), loc) or f"{loc}: {err['msg']}")
            elif kind == "extra_forbidden":
                problems.append(f"{loc}: unknown key")
            elif kind == "missing":
                problems.append(f"{loc}: required")
            else:
                problems.append(f"{loc}: {err['msg']} (got {_short(err.get('input'))})")
    problems += _semantic_problems(raw, catalogue, names=not existing)
    problems += userwork.mount_problems(raw, on_host=not existing) + userwork.package_problems(raw)
    if problems or spec is None:
        raise BadInput(problems, "invalid cluster spec")
    return spec


def _without_ignored_lifecycle(raw: dict[str, Any]) -> dict[str, Any]:
    """A stored spec from before lifecycle scripts ran (hp accepted and ignored any
    LifeCycleConfig, s3:// ones too): such a LifeCycleConfig is still ignored."""
    groups = raw.get("InstanceGroups")
    if not isinstance(groups, list):
        return raw

    def ignored(g: object) -> bool:
        lc = g.get("LifeCycleConfig") if isinstance(g, dict) else None
        uri = lc.get("SourceS3Uri") if isinstance(lc, dict) else None
        return lc is not None and not (isinstance(uri, str) and uri.startswith("/"))

    groups = [{k: v for k, v in g.items() if k != "LifeCycleConfig"} if ignored(g) else g for g in groups]
    return {**raw, "InstanceGroups": groups}


def _short(value: object, limit: int = 80) -> str:
    """A value for a message: its repr, cut (a free-form value may be large)."""
    r = reprlib.Repr()
    r.maxstring = r.maxother = limit
    r.maxlist = r.maxdict = 5
    r.maxlevel = 3
    text = r.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


GPU_TYPE_RE = re.compile(r"[a-z0-9][a-z0-9-]*\.\d+x")  # types named after a host's GPUs: h200.1x, h100.8x


def uses_only(raw: object, catalogue: Mapping[str, InstanceType], gpu_names: bool = False) -> bool:
    """Does a spec document name only instance types of `catalogue`? With `gpu_names`, an
    unknown name that cannot be a GPU type named after the host's GPUs counts too (it is
    unknown however many GPUs the host has)."""
    groups = raw.get("InstanceGroups") if isinstance(raw, dict) else None
    if not isinstance(groups, list):
        return True
    for g in groups:
        t = g.get("InstanceType") if isinstance(g, dict) else None
        if isinstance(t, str) and t not in catalogue and (not gpu_names or GPU_TYPE_RE.fullmatch(t)):
            return False
    return True


MODES = {"continuous": "Continuous", "all-or-nothing": None}


def with_overrides(
    raw: object,
    catalogue: Mapping[str, InstanceType],
    *,
    name: str | None = None,
    mode: str | None = None,
    problems: list[str] | None = None,
    accounting: bool | None = None,
    rest: bool | None = None,
    mounts: list[str] | None = None,
    slurm: str | None = None,
    base: Path | None = None,
) -> ClusterSpec:
    """Validate a spec document with the command line's overrides (--name, --mode,
    --accounting, --rest, --mount: added to the spec's Mounts, --slurm: SlurmVersion);
    BadInput listing every problem, `problems` (found by the caller) included. `base`: the
    spec file's folder (validate)."""
    problems = list(problems or [])
    if slurm is not None:
        if bad := releases.problem(slurm, "--slurm"):
            problems.append(bad)
        elif isinstance(raw, dict):
            raw = {**raw, "SlurmVersion": slurm}
    if isinstance(raw, dict):
        if mounts:
            have = raw.get("Mounts") if isinstance(raw.get("Mounts"), list) else []
            raw = {**raw, "Mounts": [*have, *(userwork.mount_arg(m) for m in mounts)]}
        if accounting is not None:
            raw = {**raw, "Accounting": {"Enabled": accounting}}
        if rest is not None:
            raw = {**raw, "Rest": {"Enabled": rest}}
    if mode is not None:
        if mode not in MODES:
            problems.append(f"--mode must be continuous or all-or-nothing, got {mode!r}")
        elif isinstance(raw, dict):
            raw = {k: v for k, v in raw.items() if k != "NodeProvisioningMode"}
            if MODES[mode]:
                raw["NodeProvisioningMode"] = MODES[mode]
    try:
        spec = validate(raw, catalogue, name=name, base=base)
    except BadInput as e:
        problems += e.problems
        spec = None
    if problems or spec is None:
        raise BadInput(problems, "invalid cluster spec")
    return spec
