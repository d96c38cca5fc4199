"""Talk to Slurm: `scontrol`/`sinfo` with --json inside the controller container.

The one module that knows Slurm's command line, so that pyslurm can replace it once
a distribution ships the Slurm it compiles against. Parsers are pure functions.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .errors import OperationFailed
from .provider import DockerProvider


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: tuple[str, ...]  # e.g. ("IDLE", "DYNAMIC_NORM"), ("IDLE", "DRAIN")
    reason: str = ""
    features: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    address: str = ""

    @property
    def base(self) -> str:
        """The base state: IDLE, ALLOCATED, MIXED, DOWN, FUTURE, UNKNOWN..."""
        return self.state[0] if self.state else "UNKNOWN"

    @property
    def flags(self) -> set[str]:
        return set(self.state[1:])

    @property
    def drained(self) -> bool:
        return bool({"DRAIN", "DRAINING", "DRAINED"} & self.flags)

    @property
    def not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.flags or self.base == "DOWN"

    @property
    def usable(self) -> bool:
        """Idle and able to take jobs."""
        return self.base == "IDLE" and not self.drained and not ({"NOT_RESPONDING", "FAIL", "MAINTENANCE"} & self.flags)

    @property
    def display(self) -> str:
        """sinfo-like compact state, e.g. idle, alloc, drain, idle+drain."""
        s = self.base.lower()
        extra = [f.lower() for f in self.state[1:] if f not in ("DYNAMIC_NORM",)]
        return "+".join([s, *extra])


@dataclass
class JobInfo:
    job_id: int
    state: str
    nodes: str
    exit_code: int | None = None
    extra: dict = field(default_factory=dict)


def parse_nodes(text: str) -> list[SlurmNode]:
    """Parse `scontrol show nodes --json` (Slurm 24.11 data_parser v0.0.42)."""
    doc = _load(text)
    out = []
    for n in doc.get("nodes", []):
        feats = n.get("features") or []
        if isinstance(feats, str):
            feats = [f for f in feats.split(",") if f]
        parts = n.get("partitions") or []
        out.append(SlurmNode(
            name=n["name"], state=tuple(n.get("state") or ()), reason=n.get("reason") or "",
            features=tuple(feats), partitions=tuple(parts), address=n.get("address") or "",
        ))
    return out


def parse_jobs(text: str) -> list[JobInfo]:
    doc = _load(text)
    out = []
    for j in doc.get("jobs", []):
        st = j.get("job_state") or ["UNKNOWN"]
        ec = j.get("exit_code") or {}
        rc = ec.get("return_code", {}) if isinstance(ec, dict) else {}
        code = rc.get("number") if isinstance(rc, dict) and rc.get("set") else None
        out.append(JobInfo(job_id=int(j["job_id"]), state=st[0] if isinstance(st, list) else str(st),
                           nodes=j.get("nodes") or "", exit_code=code))
    return out


def _load(text: str) -> dict:
    try:
        doc = json.loads(text[text.index("{"):])
    except (ValueError, json.JSONDecodeError) as e:
        raise OperationFailed(f"unexpected output from Slurm: {text[:300]!r}") from e
    errs = [e.get("description") or e.get("error") for e in doc.get("errors", []) if isinstance(e, dict)]
    if errs and not doc.get("nodes") and not doc.get("jobs"):
        raise OperationFailed("Slurm: " + "; ".join(str(e) for e in errs))
    return doc


class Slurm:
    """Slurm operations, run in the controller container."""

    def __init__(self, provider: DockerProvider, controller: str):
        self.p = provider
        self.controller = controller

    def _run(self, *args: str, check: bool = True) -> str:
        res = self.p.exec(self.controller, list(args))
        if check and res.exit_code != 0:
            raise OperationFailed(f"{' '.join(args)} failed ({res.exit_code}): {res.output.strip()[:500]}")
        return res.output

    def ping(self) -> bool:
        try:
            return self.p.exec(self.controller, ["scontrol", "ping"]).exit_code == 0
        except OperationFailed:  # the controller's container is not running
            return False

    def nodes(self) -> list[SlurmNode]:
        return parse_nodes(self._run("scontrol", "show", "nodes", "--json"))

    def job(self, job_id: int) -> JobInfo | None:
        """One job, also one that ended in the last MinJobAge seconds (squeue omits those)."""
        res = self.p.exec(self.controller, ["scontrol", "show", "job", "--json", str(job_id)])
        return next(iter(parse_jobs(res.output)), None) if res.exit_code == 0 else None

    def update(self, nodes: list[str], state: str, reason: str | None = None) -> None:
        if not nodes:
            return
        args = ["scontrol", "update", f"nodename={','.join(nodes)}", f"state={state}"]
        if reason is not None:
            args.append(f"reason={reason}")
        self._run(*args)

    def delete(self, nodes: list[str]) -> None:
        if nodes:
            self._run("scontrol", "delete", f"nodename={','.join(nodes)}")
