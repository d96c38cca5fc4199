"""Judge the GPU check's JSON (healthchecks/gpu/hp_gpu_check.py), pure.

Every problem is a :class:`Finding` with a severity and an action:

severity  info < warning < error < fatal; error and fatal fail the check.
action    an Action (orchestrator/verdict.py): NONE < MONITOR < RECOVER <
          REPLACE; the verdict's action is the strongest of its findings. With
          ``NodeRecovery: Automatic`` the one escalation policy (recovery/rules.py)
          reboots for RECOVER (then checks again and replaces if it still
          fails) and replaces at once for REPLACE. MONITOR is an event to
          record (an application XID), never a reason to touch the node. A
          failing finding with action NONE is a setup problem (wrong wiring,
          a missing image): the node stays drained with the reason, nothing is
          rebooted or replaced for it.

What is judged (see judge_gpu_check): the software part (driver answering, GPU
count against the type, persistence and compute mode, model), the health
counters (uncorrectable ECC, row remapping pending / failed, retired pages
pending, clock event reasons HW slowdown / thermal / power brake, PCIe link
below the card's maximum), the XID events seen during the check (XID_TABLE),
compute (bf16 GEMM and HBM copy against the model's thresholds AND against the
best GPU of the node), the intra-node all_reduce (never judged with one rank:
busbw is 0 by definition), and DCGM: when no DCGM image is configured the
result says "DCGM not configured", neither a pass nor a failure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..verdict import Action, ParseError, Verdict, strongest
from .dcgm import judge_dcgm, parse_dcgm
from .discovery import clock_event_names, short_model
from .nccl import parse_nccl_tests
from .thresholds import DEFAULT_TOLERANCE, GpuThresholds

SEVERITIES = ("info", "warning", "error", "fatal")
FAILING = frozenset({"error", "fatal"})
# all_reduce busbw is judged on sizes from here up (the check runs 16M..4G by 4x).
NCCL_JUDGE_MIN_BYTES = 1 << 30


@dataclass(frozen=True)
class Finding:
    """One thing found. gpu: the NVML index of the GPU concerned, None for the node."""

    code: str
    severity: str
    action: Action
    message: str
    gpu: int | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES or not isinstance(self.action, Action):
            raise ValueError(f"bad finding {self.code}: severity {self.severity!r}, action {self.action!r}")

    @property
    def fails(self) -> bool:
        return self.severity in FAILING


@dataclass(frozen=True)
class XidPolicy:
    severity: str
    action: Action
    what: str


# XID -> what it means and what to do. Sources: NVIDIA's XID catalogue and GPU
# fleets' practice (tests/fixtures/gpu-h200/README.md): 79 (fallen off the bus)
# needs a reboot; 48 (double-bit ECC), 63/64 (row remap), 94/95 (contained /
# uncontained ECC) a reset or a replacement; 13/31/43 are usually the
# application's fault: an event to monitor, never a reason to touch the node.
XID_TABLE: Mapping[int, XidPolicy] = {
    13: XidPolicy("warning", Action.MONITOR, "graphics engine exception, usually an application fault"),
    31: XidPolicy("warning", Action.MONITOR, "GPU memory page fault, usually an application's illegal access"),
    43: XidPolicy("warning", Action.MONITOR, "GPU stopped processing (the driver reset an application's channel)"),
    45: XidPolicy("info", Action.MONITOR, "preemptive cleanup after an earlier error or a killed process"),
    48: XidPolicy("fatal", Action.REPLACE, "double-bit ECC error (uncorrectable memory error)"),
    61: XidPolicy("error", Action.RECOVER, "internal micro-controller breakpoint"),
    62: XidPolicy("error", Action.RECOVER, "internal micro-controller halt"),
    63: XidPolicy("error", Action.RECOVER, "ECC page retirement or row remapping recorded: a GPU reset applies it"),
    64: XidPolicy("fatal", Action.REPLACE, "ECC page retirement or row remapping failed"),
    69: XidPolicy("error", Action.RECOVER, "graphics engine class error"),
    74: XidPolicy("error", Action.RECOVER, "NVLink error"),
    79: XidPolicy("fatal", Action.RECOVER, "GPU has fallen off the bus"),
    92: XidPolicy("warning", Action.MONITOR, "high single-bit ECC error rate"),
    94: XidPolicy(
        "error", Action.RECOVER, "contained ECC error: the affected application was stopped, a reset recovers"
    ),
    95: XidPolicy("fatal", Action.REPLACE, "uncontained ECC error: every application on the GPU was affected"),
    119: XidPolicy("error", Action.RECOVER, "GSP RPC timeout"),
    120: XidPolicy("error", Action.RECOVER, "GSP error"),
    140: XidPolicy("fatal", Action.REPLACE, "unrecovered ECC error"),
    154: XidPolicy("error", Action.RECOVER, "GPU recovery action changed: the driver asks for a reset or reboot"),
}
UNKNOWN_XID = XidPolicy("warning", Action.MONITOR, "not in hp's XID table")


def xid_policy(xid: int) -> XidPolicy:
    return XID_TABLE.get(xid, UNKNOWN_XID)


def xid_finding(xid: int, gpu: int | None, when: str = "during the check") -> Finding:
    p = xid_policy(xid)
    where = f"GPU {gpu}" if gpu is not None else "a GPU"
    return Finding(f"xid-{xid}", p.severity, p.action, f"XID {xid} on {where} {when}: {p.what}", gpu)


# Clock event reasons: HW slowdowns fail (the GPU cannot hold its clocks: cooling,
# power delivery), a SW thermal slowdown is a warning, a SW power cap is normal
# under full load.
CLOCK_REASON_POLICY: Mapping[str, tuple[str, str, str]] = {
    "hw_slowdown": ("error", Action.REPLACE, "HW slowdown (the board asserted a slowdown: power or thermal fault)"),
    "hw_thermal_slowdown": ("error", Action.REPLACE, "HW thermal slowdown (the GPU overheated)"),
    "hw_power_brake_slowdown": ("error", Action.REPLACE, "HW power brake (the system's power supply braked the GPU)"),
    "sw_thermal_slowdown": (
        "warning",
        Action.MONITOR,
        "SW thermal slowdown (clocks lowered to stay under the temperature target)",
    ),
}


@dataclass(frozen=True)
class DcgmRun:
    """What the core got when it ran ``dcgmi diag -r N -j`` in the configured
    DCGM image. error: it could not run at all (the image is missing, the
    container did not start); else output and exit_code."""

    image: str
    output: str = ""
    exit_code: int | None = None
    error: str | None = None


@dataclass
class GpuVerdict:
    """The GPU check's outcome.

    passed: no error or fatal finding. reasons: the messages of the failing
    findings (what the user reads in the drain reason and the status). notes:
    the others (info, warning). figures: measured values and thresholds.
    action: the strongest action of all findings (Action.NONE without findings).
    """

    passed: bool
    reasons: list[str]
    figures: dict[str, float]
    findings: list[Finding]
    action: Action
    notes: list[str] = field(default_factory=list)

    def verdict(self) -> Verdict:
        """The common Verdict of every check tool (orchestrator/verdict.py)."""
        return Verdict(self.passed, list(self.reasons), dict(self.figures))

    def by_code(self, code: str) -> list[Finding]:
        return [f for f in self.findings if f.code == code]


def make_verdict(findings: list[Finding], figures: dict[str, float]) -> GpuVerdict:
    fails = [f for f in findings if f.fails]
    return GpuVerdict(
        passed=not fails,
        reasons=[f.message for f in fails],
        figures=figures,
        findings=findings,
        action=strongest(f.action for f in findings),
        notes=[f.message for f in findings if not f.fails],
    )


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class _Judge:
    def __init__(
        self,
        doc: Mapping[str, Any],
        expected_gpus: int | None,
        model: str | None,
        thresholds: GpuThresholds | None,
        tolerance: float,
    ):
        self.doc, self.expected, self.model, self.th, self.tol = doc, expected_gpus, model, thresholds, tolerance
        self.findings: list[Finding] = []
        self.figures: dict[str, float] = {}
        self.xids: set[int] = set()
        self._missing: tuple[int, list[Any]] | None = None

    def add(self, code: str, severity: str, action: Action, message: str, gpu: int | None = None) -> None:
        self.findings.append(Finding(code, severity, action, message, gpu))

    # -- software -------------------------------------------------------------------
    def software(self) -> list[dict[str, Any]]:
        sw = self.doc.get("software")
        if not isinstance(sw, Mapping):
            self.add("no-software-part", "error", Action.NONE, "the GPU check printed no software part")
            return []
        if sw.get("status") != "ok":
            why = str(sw.get("why") or "no reason given")
            if "LibraryNotFound" in why or "cannot be imported" in why:
                self.add(
                    "nvml-missing",
                    "error",
                    Action.NONE,
                    f"NVML is not usable in the check container ({why}): the driver's files are not "
                    "mounted or the check image is broken",
                )
            else:
                self.add("driver-not-answering", "fatal", Action.RECOVER, f"the GPU driver does not answer: {why}")
            if self.expected:
                self.figures["gpus_expected"] = float(self.expected)
            self.figures["gpus_seen"] = 0.0
            return []
        gpus = [g for g in sw.get("gpus") or [] if isinstance(g, Mapping)]
        lost = [x for x in sw.get("inaccessible") or [] if isinstance(x, Mapping) and x.get("lost")]
        other = [x for x in sw.get("inaccessible") or [] if isinstance(x, Mapping) and not x.get("lost")]
        self.figures["gpus_seen"] = float(len(gpus))
        for x in lost:
            self.add(
                "gpu-lost",
                "fatal",
                Action.RECOVER,
                f"a GPU has fallen off the bus (NVML index {x.get('nvml_index')}: {x.get('error')})",
                x["nvml_index"] if isinstance(x.get("nvml_index"), int) else None,
            )
        if other:
            self.add(
                "gpus-not-given",
                "info",
                Action.NONE,
                f"{len(other)} GPU(s) of the host are not this node's (no access): not judged",
            )
        if self.expected is not None:
            self.figures["gpus_expected"] = float(self.expected)
            if len(gpus) < self.expected:
                missing = self.expected - len(gpus)
                self._missing = (missing, lost)
            elif len(gpus) > self.expected:
                self.add(
                    "gpu-count-high",
                    "error",
                    Action.NONE,
                    f"the node sees {len(gpus)} GPUs, its type has {self.expected}: its GPU wiring "
                    "gives it GPUs that are not its own",
                )
        major = str(sw.get("driver_version") or "").split(".")[0]
        if major.isdigit():
            self.figures["driver_major"] = float(major)
        for g in gpus:
            i = g.get("index")
            name = g.get("name")
            if self.model and isinstance(name, str) and short_model(name) != self.model:
                self.add(
                    "gpu-model",
                    "error",
                    Action.NONE,
                    f"GPU {i} is {name} ({short_model(name)}), the node's type expects {self.model}",
                    i,
                )
            if g.get("persistence_mode") is False:
                self.add(
                    "persistence-off",
                    "warning",
                    Action.NONE,
                    f"GPU {i}: persistence mode is off (slower first CUDA start; enable it on the host: "
                    "nvidia-smi -pm 1)",
                    i,
                )
            mode = g.get("compute_mode")
            if mode == "Prohibited":
                self.add(
                    "compute-prohibited",
                    "error",
                    Action.RECOVER,
                    f"GPU {i}: compute mode is Prohibited, no CUDA program can run",
                    i,
                )
            elif isinstance(mode, str) and mode != "Default":
                self.add(
                    "compute-exclusive",
                    "warning",
                    Action.NONE,
                    f"GPU {i}: compute mode is {mode}, one process at a time",
                    i,
                )
        return gpus

    def missing_gpus(self) -> None:
        if self._missing is None:
            return
        n, lost = self._missing
        if lost or 79 in self.xids:
            self.add(
                "gpu-missing",
                "fatal",
                Action.RECOVER,
                f"{n} GPU(s) of the type missing ({int(self.figures['gpus_seen'])} of {self.expected}): "
                "fallen off the bus, a reboot may bring it back",
            )
        else:
            self.add(
                "gpu-missing",
                "fatal",
                Action.REPLACE,
                f"{n} GPU(s) of the type missing: the node sees {int(self.figures['gpus_seen'])} of {self.expected}",
            )

    # -- counters -------------------------------------------------------------------
    def counters(self) -> None:
        rows = self.doc.get("counters")
        if not isinstance(rows, list):
            rows = self.doc.get("counters_start")
        if not isinstance(rows, list):
            return
        start = {r.get("index"): r for r in self.doc.get("counters_start") or [] if isinstance(r, Mapping)}
        for r in rows:
            if isinstance(r, Mapping):
                self.counter_row(r, start.get(r.get("index")))

    def counter_row(self, r: Mapping[str, Any], start: Mapping[str, Any] | None) -> None:
        i = r.get("index")
        unc = _num(r.get("ecc_uncorrected_volatile"))
        if unc is not None:
            self.figures[f"gpu{i}.ecc_uncorrected_volatile"] = unc
            if unc > 0:
                before = _num((start or {}).get("ecc_uncorrected_volatile"))
                rose = f", {unc - before:g} of them during the check" if before is not None and before < unc else ""
                self.add(
                    "ecc-uncorrectable",
                    "fatal",
                    Action.REPLACE,
                    f"GPU {i}: {unc:g} uncorrectable ECC error(s) since the driver loaded{rose}",
                    i,
                )
        if r.get("ecc_mode_current") is False:
            self.add("ecc-off", "warning", Action.NONE, f"GPU {i}: ECC is disabled, memory errors go undetected", i)
        agg = _num(r.get("ecc_uncorrected_aggregate"))
        if agg and (unc or 0) == 0:
            self.add(
                "ecc-history",
                "info",
                Action.NONE,
                f"GPU {i}: {agg:g} uncorrectable ECC error(s) in its lifetime, none since the driver loaded",
                i,
            )
        remap = r.get("remapped_rows")
        if isinstance(remap, Mapping) and "pending" in remap:
            if remap.get("failure"):
                self.add(
                    "remap-failure",
                    "fatal",
                    Action.REPLACE,
                    f"GPU {i}: row remapping failed (no spare rows left for a failing memory row)",
                    i,
                )
            if remap.get("pending"):
                self.add(
                    "remap-pending",
                    "error",
                    Action.RECOVER,
                    f"GPU {i}: a row remapping is pending, a GPU reset applies it",
                    i,
                )
        if r.get("retired_pages_pending") is True:
            self.add(
                "retired-pages-pending",
                "error",
                Action.RECOVER,
                f"GPU {i}: retired pages pending, a GPU reset retires them",
                i,
            )
        self.clock_reasons(r)
        self.pcie(r)

    def clock_reasons(self, r: Mapping[str, Any]) -> None:
        i = r.get("index")
        load = r.get("under_load") if isinstance(r.get("under_load"), Mapping) else None
        mask = _num((load or {}).get("clock_event_reasons_mask"))
        when = "while loaded"
        if mask is None:
            mask, when = _num(r.get("clock_event_reasons")), "at rest"
        if mask is None:
            return
        self.figures[f"gpu{i}.clock_event_reasons"] = mask
        for name in sorted(clock_event_names(int(mask))):
            if name in CLOCK_REASON_POLICY:
                sev, act, what = CLOCK_REASON_POLICY[name]
                self.add(f"clocks-{name.replace('_', '-')}", sev, act, f"GPU {i}: {what}, {when}", i)

    def pcie(self, r: Mapping[str, Any]) -> None:
        i = r.get("index")
        p = r.get("pcie") if isinstance(r.get("pcie"), Mapping) else {}
        load = r.get("under_load") if isinstance(r.get("under_load"), Mapping) else {}
        gen, gen_max = _num(p.get("gen")), _num(p.get("gen_max"))
        width, width_max = _num(p.get("width")), _num(p.get("width_max"))
        best_gen = _num(load.get("pcie_gen_best"))
        best_width = _num(load.get("pcie_width_best"))
        width_seen = max(x for x in (width, best_width, 0.0) if x is not None)
        for key, v in (
            ("pcie_gen", best_gen or gen),
            ("pcie_gen_max", gen_max),
            ("pcie_width", width_seen or None),
            ("pcie_width_max", width_max),
        ):
            if v is not None:
                self.figures[f"gpu{i}.{key}"] = v
        if width_max and width_seen and width_seen < width_max:
            self.add(
                "pcie-width",
                "error",
                Action.REPLACE,
                f"GPU {i}: PCIe link is x{width_seen:g}, the card and slot support x{width_max:g} "
                "(a bad seat, riser or slot)",
                i,
            )
        if gen_max and best_gen is not None and best_gen < gen_max:
            self.add(
                "pcie-gen",
                "error",
                Action.RECOVER,
                f"GPU {i}: PCIe link trained to gen {best_gen:g} under load, the maximum is gen {gen_max:g}",
                i,
            )
        elif gen_max and best_gen is None and gen is not None and gen < gen_max:
            self.add(
                "pcie-gen-idle",
                "info",
                Action.NONE,
                f"GPU {i}: PCIe link at gen {gen:g} of {gen_max:g} at rest (GPUs lower it to save "
                "power; judged under load only)",
                i,
            )

    # -- XID ------------------------------------------------------------------------
    def xid(self) -> None:
        x = self.doc.get("xid")
        if not isinstance(x, Mapping):
            return
        if x.get("status") == "error":
            self.add("xid-unwatched", "warning", Action.NONE, f"XID events could not be watched: {x.get('why')}")
        events = [e for e in x.get("events") or [] if isinstance(e, Mapping) and _num(e.get("xid")) is not None]
        self.figures["xid_events"] = float(len(events))
        seen: set[tuple[int, Any]] = set()
        for e in events:
            key = (int(e["xid"]), e.get("index"))
            self.xids.add(key[0])
            if key in seen:
                continue
            seen.add(key)
            self.findings.append(xid_finding(key[0], e.get("index")))

    # -- compute --------------------------------------------------------------------
    def compute(self) -> None:
        c = self.doc.get("compute")
        if not isinstance(c, Mapping):
            self.add("no-compute-part", "error", Action.NONE, "the GPU check printed no compute part")
            return
        if c.get("status") == "skipped":
            if self.figures.get("gpus_seen"):
                self.add("compute-skipped", "info", Action.NONE, f"compute not run: {c.get('why')}")
            return
        if c.get("status") == "error" and not c.get("gpus"):
            self.add("compute-unavailable", "error", Action.NONE, f"compute could not run: {c.get('why')}")
            return
        rows = [r for r in c.get("gpus") or [] if isinstance(r, Mapping)]
        gemm: dict[Any, float] = {}
        hbm: dict[Any, float] = {}
        for r in rows:
            i = r.get("index")
            if r.get("error"):
                self.add("compute-error", "error", Action.RECOVER, f"GPU {i}: compute failed: {r['error']}", i)
                continue
            g = r.get("gemm") if isinstance(r.get("gemm"), Mapping) else {}
            if g.get("result_ok") is False:
                self.add(
                    "gemm-wrong",
                    "fatal",
                    Action.REPLACE,
                    f"GPU {i}: the GEMM computed wrong results (relative error {g.get('max_rel_error')})",
                    i,
                )
            if (t := _num(g.get("tflops"))) is not None:
                gemm[i] = t
            h = r.get("hbm") if isinstance(r.get("hbm"), Mapping) else {}
            if (b := _num(h.get("gbps"))) is not None:
                hbm[i] = b
        self.perf("gemm", "bf16 GEMM", "TFLOP/s", gemm, self.th.bf16_gemm_tflops if self.th else None)
        self.perf("hbm", "HBM copy", "GB/s", hbm, self.th.hbm_copy_gbps if self.th else None)

    def perf(self, key: str, what: str, unit: str, values: Mapping[Any, float], minimum: float | None) -> None:
        if not values:
            return
        best = max(values.values())
        floor = (1 - self.tol) * best
        self.figures[f"{key}_best"] = best
        self.figures[f"{key}_node_floor"] = floor
        if minimum is not None:
            self.figures[f"{key}_min"] = float(minimum)
        elif self.th is not None:
            self.add(
                f"{key}-no-threshold",
                "info",
                Action.NONE,
                f"no {what} threshold for {self.th.model}: judged against the node's best GPU only",
            )
        for i, v in sorted(values.items(), key=lambda kv: str(kv[0])):
            self.figures[f"gpu{i}.{key}"] = v
            if minimum is not None and v < minimum:
                self.add(
                    f"{key}-slow",
                    "error",
                    Action.RECOVER,
                    f"GPU {i}: {what} {v:.0f} {unit} is below the {self.th.model if self.th else ''} "
                    f"threshold {minimum:g} {unit}",
                    i,
                )
            elif v < floor:
                self.add(
                    f"{key}-slow-vs-node",
                    "error",
                    Action.RECOVER,
                    f"GPU {i}: {what} {v:.0f} {unit} is {100 * (1 - v / best):.0f}% below the best GPU of "
                    f"the node ({best:.0f} {unit}; tolerance {100 * self.tol:.0f}%)",
                    i,
                )
        if self.th is not None and not self.th.measured:
            self.figures[f"{key}_threshold_measured"] = 0.0

    # -- NCCL -----------------------------------------------------------------------
    def nvlink(self) -> bool:
        rows = self.doc.get("counters") or self.doc.get("counters_start") or []
        links = [_num(r.get("nvlink_active")) for r in rows if isinstance(r, Mapping)]
        return bool(links) and all(x is not None and x > 0 for x in links)

    def nccl(self) -> None:
        n = self.doc.get("nccl")
        if not isinstance(n, Mapping):
            return
        ranks = int(_num(n.get("ranks")) or 0)
        self.figures["nccl_ranks"] = float(ranks)
        if n.get("status") == "skipped" or ranks < 2:
            if ranks == 1:
                self.add(
                    "nccl-one-rank",
                    "info",
                    Action.NONE,
                    "one GPU: the intra-node all_reduce is not judged (with one rank busbw is 0 by "
                    "definition, it says nothing about links)",
                )
            return
        if n.get("status") != "ok" and not n.get("output"):
            why = str(n.get("why") or "no reason given")
            setup = any(s in why for s in ("not found on PATH", "without NCCL", "cannot be imported", "did not start"))
            self.add(
                "nccl-failed",
                "error",
                Action.NONE if setup else Action.RECOVER,
                f"intra-node all_reduce across {ranks} GPUs did not run: {why}",
            )
            return
        nvlink = self.nvlink()
        minimum = self.th.nccl_min(ranks, nvlink) if self.th else None
        if minimum is not None:
            self.figures["nccl_min_busbw_gbps"] = minimum
        if n.get("method") == "nccl-tests":
            self.nccl_tests(n, ranks, minimum)
        else:
            self.nccl_rows(n, ranks, minimum)

    def nccl_tests(self, n: Mapping[str, Any], ranks: int, minimum: float | None) -> None:
        try:
            res = parse_nccl_tests(str(n.get("output") or ""))
        except ParseError as e:
            self.add("nccl-failed", "error", Action.RECOVER, f"all_reduce_perf printed no result: {e}")
            return
        if res.n_ranks and res.n_ranks < 2:
            self.add(
                "nccl-one-rank", "info", Action.NONE, "all_reduce_perf ran one rank: busbw 0 by definition, not judged"
            )
            return
        if res.n_ranks and res.n_ranks != ranks:  # what really ran decides the threshold
            ranks = res.n_ranks
            self.figures["nccl_ranks"] = float(ranks)
            minimum = self.th.nccl_min(ranks, self.nvlink()) if self.th else None
            if minimum is not None:
                self.figures["nccl_min_busbw_gbps"] = minimum
        for e in res.errors:
            self.add("nccl-failed", "error", Action.RECOVER, f"all_reduce_perf: {e}")
        if _num(n.get("exit_code")) not in (None, 0.0) and not res.errors:
            self.add("nccl-failed", "error", Action.RECOVER, f"all_reduce_perf exited {n.get('exit_code')}")
        wrong = sum((r.oop_wrong or 0) + (r.ip_wrong or 0) for r in res.rows)
        if wrong or (res.out_of_bounds or 0) > 0:
            self.add(
                "nccl-wrong",
                "fatal",
                Action.REPLACE,
                f"all_reduce across {ranks} GPUs returned wrong data ({wrong} wrong elements, "
                f"{res.out_of_bounds or 0} out of bounds)",
            )
        big = [(r.oop_busbw + r.ip_busbw) / 2 for r in res.rows if r.size_bytes >= NCCL_JUDGE_MIN_BYTES]
        self.nccl_bw(big, ranks, minimum)

    def nccl_rows(self, n: Mapping[str, Any], ranks: int, minimum: float | None) -> None:
        rows = [r for r in n.get("rows") or [] if isinstance(r, Mapping)]
        if not rows:
            self.add("nccl-failed", "error", Action.RECOVER, f"intra-node all_reduce gave no result: {n.get('why')}")
            return
        wrong = sum(int(_num(r.get("wrong")) or 0) for r in rows)
        if wrong:
            self.add(
                "nccl-wrong",
                "fatal",
                Action.REPLACE,
                f"all_reduce across {ranks} GPUs returned wrong data ({wrong} wrong values)",
            )
        big = [
            float(r["busbw_gbps"])
            for r in rows
            if (_num(r.get("size_bytes")) or 0) >= NCCL_JUDGE_MIN_BYTES and _num(r.get("busbw_gbps")) is not None
        ]
        self.nccl_bw(big, ranks, minimum)

    def nccl_bw(self, big: list[float], ranks: int, minimum: float | None) -> None:
        if not big:
            self.add(
                "nccl-no-large-sizes",
                "warning",
                Action.NONE,
                f"the all_reduce ran no size >= {NCCL_JUDGE_MIN_BYTES >> 20} MiB: bandwidth not judged",
            )
            return
        avg = sum(big) / len(big)
        self.figures["nccl_busbw_gbps"] = avg
        if minimum is not None and avg < minimum:
            self.add(
                "nccl-slow",
                "error",
                Action.RECOVER,
                f"intra-node all_reduce busbw {avg:.1f} GB/s across {ranks} GPUs is below {minimum:g} GB/s",
            )
        elif minimum is None:
            self.add(
                "nccl-no-threshold",
                "info",
                Action.NONE,
                f"no all_reduce threshold for {ranks} GPUs of this model: busbw {avg:.1f} GB/s not judged",
            )

    # -- DCGM -----------------------------------------------------------------------
    def dcgm(self, run: DcgmRun | None) -> None:
        if run is None:
            self.add(
                "dcgm-not-configured",
                "info",
                Action.NONE,
                "DCGM not configured: no DCGM image set (HP_DCGM_IMAGE), dcgmi diag was not run",
            )
            self.figures["dcgm_configured"] = 0.0
            return
        self.figures["dcgm_configured"] = 1.0
        if run.error:
            self.add("dcgm-unavailable", "error", Action.NONE, f"DCGM image {run.image} could not run: {run.error}")
            return
        try:
            result = parse_dcgm(run.output)
        except ParseError as e:
            self.add(
                "dcgm-unreadable",
                "error",
                Action.NONE,
                f"dcgmi diag in {run.image} printed no diagnostic (exit {run.exit_code}): {e}",
            )
            return
        v = judge_dcgm(result, run.exit_code if run.exit_code is not None else 0)
        self.figures.update({f"dcgm.{k}": x for k, x in v.figures.items()})
        # Deployment tests (software, persistence, pending row remaps, stray processes): a
        # reboot resets the GPUs and the driver state; a failed hardware test: replace.
        hardware = any(r.status == "Fail" and r.category not in ("Deployment", "") for r in result.results)
        for reason in v.reasons:
            self.add("dcgm", "error", Action.REPLACE if hardware else Action.RECOVER, f"DCGM: {reason}")


def judge_gpu_check(
    doc: Mapping[str, Any] | str,
    *,
    expected_gpus: int | None,
    model: str | None = None,
    thresholds: GpuThresholds | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    dcgm: DcgmRun | None = None,
) -> GpuVerdict:
    """Judge one node's GPU check.

    doc: hp_gpu_check.py's JSON (text or parsed).
    expected_gpus, model: what the node's instance type promises.
    thresholds: the model's row of the threshold table (None: judged only
        against the node's best GPU). tolerance: how much slower than the node's
        best GPU a GPU may be (0.10).
    dcgm: the DCGM run, None when no DCGM image is configured.
    """
    if isinstance(doc, str):
        try:
            parsed = json.loads(doc.strip().splitlines()[-1]) if doc.strip() else None
        except (json.JSONDecodeError, IndexError):
            parsed = None
        if not isinstance(parsed, Mapping):
            try:
                parsed = json.loads(doc)
            except json.JSONDecodeError:
                parsed = None
        if not isinstance(parsed, Mapping):
            return make_verdict(
                [
                    Finding(
                        "unreadable",
                        "error",
                        Action.NONE,
                        "the GPU check printed no JSON result: " + (doc.strip()[-300:] or "nothing"),
                    )
                ],
                {},
            )
        doc = parsed
    if doc.get("tool") != "hp_gpu_check":
        return make_verdict(
            [
                Finding(
                    "unreadable",
                    "error",
                    Action.NONE,
                    'the JSON is not hp_gpu_check\'s result (no "tool": "hp_gpu_check")',
                )
            ],
            {},
        )
    j = _Judge(doc, expected_gpus, model, thresholds, tolerance)
    j.software()
    j.xid()
    j.missing_gpus()
    j.counters()
    j.compute()
    j.nccl()
    j.dcgm(dcgm)
    for part, secs in (doc.get("timings_s") or {}).items():
        if _num(secs) is not None:
            j.figures[f"seconds.{part}"] = float(secs)
    return make_verdict(j.findings, j.figures)
