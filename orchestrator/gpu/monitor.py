"""Passive GPU monitoring, the pure half (HyperPod's health-monitoring agent).

The monitor program (healthchecks/gpu/hp_gpu_monitor.py) runs
long-lived in hp's GPU check image next to a GPU node and prints one JSON line
per event or snapshot:

    {"type": "start", "t": 0.0, "interval_s": 30, "gpus": [{"index": 0, "uuid": "GPU-..."}],
     "xid": {"status": "ok", "why": null}}
    {"type": "snapshot", "t": 30.0, "nvml_error": null, "gpus": [{"index": 0, "uuid": "GPU-...",
     "ecc_uncorrected_volatile": 0, "ecc_corrected_volatile": 0,
     "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
     "retired_pages_pending": {"unsupported": "..."}}]}
    {"type": "xid", "t": 12.5, "index": 0, "uuid": "GPU-...", "xid": 79}
    {"type": "error", "t": 1.0, "why": "..."}

:class:`MonitorState` turns successive lines into NEW findings (the same
Finding as the deep check: severity and action): a counter that went up, a
condition that appeared (pending remap, remap failure, retired pages pending, a
GPU gone, NVML not answering), a new XID. A condition is reported when it
appears, not at every snapshot; a counter each time it rises.
:func:`decide` says what to do with the node: drain it with a reason naming the
finding when one fails, and when to act (a replace-class finding at once, a
reboot when its jobs have ended).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..slurm.model import GPU_MONITOR_PREFIX
from ..verdict import ACTIONS, Action, strongest
from .judge import FAILING, Finding, xid_finding

DRAIN_PREFIX = GPU_MONITOR_PREFIX
REASON_MAX = 200


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class GpuCounters:
    """The watched counters of one GPU in one snapshot (None: not reported or
    unsupported)."""

    index: int | None
    uuid: str
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_pending: bool | None = None
    error: str | None = None


@dataclass(frozen=True)
class Snapshot:
    t: float
    gpus: Mapping[str, GpuCounters]  # by UUID
    nvml_error: str | None = None


@dataclass(frozen=True)
class XidEvent:
    t: float
    xid: int
    index: int | None = None
    uuid: str = ""


def _counters(g: Mapping[str, Any]) -> GpuCounters:
    remap = g.get("remapped_rows") if isinstance(g.get("remapped_rows"), Mapping) else {}
    retired = g.get("retired_pages_pending")
    return GpuCounters(
        index=_int(g.get("index")),
        uuid=str(g.get("uuid") or f"index-{g.get('index')}"),
        ecc_uncorrected_volatile=_int(g.get("ecc_uncorrected_volatile")),
        ecc_corrected_volatile=_int(g.get("ecc_corrected_volatile")),
        remap_pending=remap.get("pending") if isinstance(remap.get("pending"), bool) else None,
        remap_failure=remap.get("failure") if isinstance(remap.get("failure"), bool) else None,
        retired_pages_pending=retired if isinstance(retired, bool) else None,
        error=str(g["error"]) if g.get("error") else None,
    )


def parse_line(line: str | Mapping[str, Any]) -> Snapshot | XidEvent | Mapping[str, Any] | None:
    """One monitor line: a Snapshot, an XidEvent, the raw mapping of another
    type ("start", "error"), or None for a line that is not monitor JSON."""
    if isinstance(line, str):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            return None
    else:
        obj = line
    if not isinstance(obj, Mapping):
        return None
    t = float(obj.get("t") or 0.0)
    kind = obj.get("type")
    if kind == "snapshot":
        gpus = [_counters(g) for g in obj.get("gpus") or [] if isinstance(g, Mapping)]
        return Snapshot(t, {g.uuid: g for g in gpus}, str(obj["nvml_error"]) if obj.get("nvml_error") else None)
    if kind == "xid" and _int(obj.get("xid")) is not None:
        return XidEvent(t, int(obj["xid"]), _int(obj.get("index")), str(obj.get("uuid") or ""))
    return obj if kind in ("start", "error") else None


@dataclass
class MonitorState:
    """What the monitor has seen of one node. expected_gpus: the node's type,
    to notice a GPU that was never there."""

    expected_gpus: int | None = None
    last: Snapshot | None = None
    active: set[str] = field(default_factory=set)  # conditions reported and still true
    gone: dict[str, GpuCounters] = field(default_factory=dict)

    def _edge(self, key: str, now: bool, make: Any) -> list[Finding]:
        """Report a condition when it appears; forget it when it clears."""
        if now and key not in self.active:
            self.active.add(key)
            return [make()]
        if not now:
            self.active.discard(key)
        return []

    def feed(self, item: Snapshot | XidEvent | Mapping[str, Any] | None) -> list[Finding]:
        if isinstance(item, Snapshot):
            return self.feed_snapshot(item)
        if isinstance(item, XidEvent):
            return [xid_finding(item.xid, item.index, when="(passive monitoring)")]
        if isinstance(item, Mapping) and item.get("type") == "start":
            x = item.get("xid") if isinstance(item.get("xid"), Mapping) else {}
            if x.get("status") not in (None, "ok"):
                return self._edge(
                    "xid-unwatched",
                    True,
                    lambda: Finding(
                        "xid-unwatched", "warning", Action.NONE, f"XID events are not watched: {x.get('why')}"
                    ),
                )
        if isinstance(item, Mapping) and item.get("type") == "error":
            return [Finding("monitor-error", "warning", Action.NONE, f"GPU monitor: {item.get('why')}")]
        return []

    def feed_line(self, line: str) -> list[Finding]:
        return self.feed(parse_line(line))

    def feed_lines(self, lines: Iterable[str]) -> list[Finding]:
        out: list[Finding] = []
        for line in lines:
            out += self.feed_line(line)
        return out

    def feed_snapshot(self, snap: Snapshot) -> list[Finding]:
        out: list[Finding] = []
        out += self._edge(
            "nvml",
            snap.nvml_error is not None,
            lambda: Finding(
                "driver-not-answering", "fatal", Action.RECOVER, f"the GPU driver stopped answering: {snap.nvml_error}"
            ),
        )
        if snap.nvml_error is not None:
            return out  # no counters to compare; keep the last good snapshot
        prev = self.last.gpus if self.last else {}
        for uuid, old in prev.items():
            if uuid not in snap.gpus:
                self.gone[uuid] = old
        for uuid in list(self.gone):
            old = self.gone[uuid]
            out += self._edge(
                f"lost:{uuid}",
                uuid not in snap.gpus,
                lambda old=old: Finding(
                    "gpu-lost",
                    "fatal",
                    Action.RECOVER,
                    f"GPU {old.index} ({old.uuid}) is gone: fallen off the bus?",
                    old.index,
                ),
            )
            if uuid in snap.gpus:
                del self.gone[uuid]
        if self.expected_gpus is not None:
            n = len(snap.gpus)
            out += self._edge(
                "count",
                n < self.expected_gpus,
                lambda: Finding(
                    "gpu-missing",
                    "fatal",
                    Action.REPLACE,
                    f"the node sees {n} of the {self.expected_gpus} GPUs of its type",
                ),
            )
        for uuid, g in snap.gpus.items():
            out += self._gpu(g, prev.get(uuid))
        self.last = snap
        return out

    def _gpu(self, g: GpuCounters, old: GpuCounters | None) -> list[Finding]:
        i = g.index
        out: list[Finding] = []
        out += self._edge(
            f"err:{g.uuid}",
            g.error is not None,
            lambda: Finding("gpu-unreadable", "error", Action.RECOVER, f"GPU {i}: NVML cannot read it: {g.error}", i),
        )
        unc, was = g.ecc_uncorrected_volatile, old.ecc_uncorrected_volatile if old else None
        if unc is not None and unc > 0 and (was is None or unc > was):
            since = f"rose from {was} to {unc}" if was is not None else f"{unc} since the driver loaded"
            out.append(
                Finding("ecc-uncorrectable", "fatal", Action.REPLACE, f"GPU {i}: uncorrectable ECC errors {since}", i)
            )
        cor, cwas = g.ecc_corrected_volatile, old.ecc_corrected_volatile if old else None
        if cor is not None and cwas is not None and cor > cwas:
            out.append(
                Finding(
                    "ecc-correctable",
                    "info",
                    Action.MONITOR,
                    f"GPU {i}: correctable ECC errors rose from {cwas} to {cor}",
                    i,
                )
            )
        out += self._edge(
            f"remap-failure:{g.uuid}",
            bool(g.remap_failure),
            lambda: Finding("remap-failure", "fatal", Action.REPLACE, f"GPU {i}: row remapping failed", i),
        )
        out += self._edge(
            f"remap-pending:{g.uuid}",
            bool(g.remap_pending),
            lambda: Finding(
                "remap-pending",
                "error",
                Action.RECOVER,
                f"GPU {i}: a row remapping is pending, a GPU reset applies it",
                i,
            ),
        )
        out += self._edge(
            f"retired:{g.uuid}",
            bool(g.retired_pages_pending),
            lambda: Finding(
                "retired-pages-pending",
                "error",
                Action.RECOVER,
                f"GPU {i}: retired pages pending, a reset retires them",
                i,
            ),
        )
        return out


@dataclass(frozen=True)
class MonitorDecision:
    """drain: take the node out of service (reason names the finding).
    action: the findings' (an Action). at_once: act without waiting for
    the node's jobs to end (replace-class findings)."""

    drain: bool
    action: Action
    at_once: bool
    reason: str


def drain_reason(findings: Iterable[Finding]) -> str:
    """The Slurm drain reason: hp:gpu:<action>:<code> <message>, the strongest
    failing finding first, at most REASON_MAX characters."""
    fails = [f for f in findings if f.severity in FAILING]
    if not fails:
        return ""
    fails.sort(key=lambda f: (ACTIONS.index(f.action), f.severity == "fatal"), reverse=True)
    top = fails[0]
    more = f" (+{len(fails) - 1} more)" if len(fails) > 1 else ""
    text = f"{DRAIN_PREFIX}{top.action}:{top.code} {top.message}{more}"
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def reason_fault(reason: str) -> tuple[Action, str] | None:
    """What a drain reason of drain_reason's says: (its action, its mark
    `hp:gpu:<action>:<code>`, which the reason of every reboot for that finding holds:
    the history says whether the node was rebooted for it). None for another reason."""
    if not reason.startswith(DRAIN_PREFIX):
        return None
    mark = reason.split(" ", 1)[0]
    word = mark[len(DRAIN_PREFIX) :].split(":", 1)[0]
    return (Action(word), mark) if word in tuple(Action) else None


def decide(findings: Iterable[Finding]) -> MonitorDecision:
    fs = list(findings)
    fails = [f for f in fs if f.severity in FAILING]
    action = strongest(f.action for f in (fails or fs))
    return MonitorDecision(
        drain=bool(fails), action=action, at_once=bool(fails) and action == Action.REPLACE, reason=drain_reason(fs)
    )
