"""Parsers and verdicts for the outputs of the deep health-check tools.

Pure functions over text: nothing here runs a tool, reads a file or keeps
state. Each ``parse_*`` turns one tool's own output into a typed result and
raises :class:`ParseError` when the text is not that tool's output at all;
each ``judge_*`` turns a result (plus the tool's exit status and the caller's
thresholds) into a :class:`Verdict` and never raises.

Tools covered, and the versions whose real output is under tests/fixtures:

* DCGM ``dcgmi diag -r N -j`` (4.x and 3.x JSON layouts)
* nccl-tests ``all_reduce_perf`` text
* stress-ng ``--metrics-brief --yaml FILE`` plus its log on stderr
* iperf3 ``-J``
* hp's own MPI_Allreduce check (healthchecks/cpu/mpi_allreduce.c)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal


class ParseError(ValueError):
    """The text is not (a complete enough piece of) the expected tool output."""


@dataclass
class Verdict:
    """Outcome of one check, as shown to the user.

    passed: True when nothing was wrong.
    reasons: one human-readable sentence per problem found; empty when passed.
    figures: measured values and the thresholds they were compared to, keyed
        by short names (e.g. ``avg_busbw_gbps`` and ``min_busbw_gbps``).
    """

    passed: bool
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)


def _verdict(reasons: list[str], figures: dict[str, float]) -> Verdict:
    return Verdict(passed=not reasons, reasons=reasons, figures=figures)


def _json_object(text: str, tool: str) -> dict[str, Any]:
    """The first JSON object in text; anything before the first '{' or after
    the object (dcgmi and srun may print lines around it) is ignored."""
    start = text.find("{")
    if start < 0:
        raise ParseError(f"{tool}: no JSON object in output")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise ParseError(f"{tool}: invalid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ParseError(f"{tool}: JSON is not an object")
    return obj


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _num(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------
# DCGM
# --------------------------------------------------------------------------

DCGMI_EXIT_CODES: Mapping[int, str] = {
    0: "diagnostic passed",
    226: "NVVS error (DCGM_ST_NVVS_ERROR, -30): a test failed or the diagnostic could not run",
    205: "isolate error (DCGM_ST_NVVS_ISOLATE_ERROR, -51): a GPU failed and must be isolated",
    242: "no data (DCGM_ST_NO_DATA, -14): the diagnostic produced no results",
}


def dcgmi_exit_reason(exit_code: int) -> str:
    """What a dcgmi exit status means. dcgmi exits with a negative DCGM status
    code truncated to 8 bits, so 226 is -30."""
    if exit_code in DCGMI_EXIT_CODES:
        return DCGMI_EXIT_CODES[exit_code]
    if 128 < exit_code < 256:
        return f"DCGM error status {exit_code - 256}"
    return f"unexpected exit status {exit_code}"


@dataclass(frozen=True)
class DcgmTestResult:
    """One test's outcome for one entity (or for all GPUs at once).

    test: DCGM's test name: 4.x plugin names ("software", "memory", "pcie"),
        3.x display names ("Denylist", "PCIe", "GPU Memory").
    category: "Deployment", "Hardware", "Integration", "Stress", ...
    status: "Pass", "Skip" or "Fail" (a 3.x "WARN" counts as "Fail", as dcgmi
        itself writes it).
    entity_group: "GPU" for GPU results, another DCGM entity group name
        ("CPU", ...) for others, "" for a 4.x ``test_summary``.
    entity_ids: the entity ids this result is about; empty for a summary or a
        3.x deployment result without ids (which covers every GPU).
    warnings: DCGM's warning messages (the reason for a Fail).
    info: DCGM's informational messages.
    summary: True for a 4.x per-test ``test_summary`` entry.
    """

    test: str
    category: str
    status: str
    entity_group: str = "GPU"
    entity_ids: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
    info: tuple[str, ...] = ()
    summary: bool = False

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        return self.entity_ids if self.entity_group == "GPU" else ()


@dataclass
class DcgmResult:
    """A parsed ``dcgmi diag -j`` document.

    layout: "4.x" (top key "DCGM Diagnostic") or "3.x" ("DCGM GPU Diagnostic").
    version, driver_version: as DCGM reports them, None when absent.
    results: every per-entity result and every 4.x test summary, in order.
    runtime_error: DCGM's document-level error (the diagnostic did not run).
    passed: no Fail anywhere, no runtime error, and at least one result.
    failures: one message per failure naming the test, the GPU(s) and DCGM's
        own message.
    """

    layout: str
    version: str | None
    driver_version: str | None
    results: list[DcgmTestResult]
    runtime_error: str | None
    passed: bool
    failures: list[str]

    @property
    def failed_tests(self) -> list[str]:
        return sorted({r.test for r in self.results if r.status == "Fail"})


def _dcgm_status(raw: Any) -> str:
    s = str(raw or "").strip().lower()
    if s == "pass":
        return "Pass"
    if s in ("skip", "skipped", "not run", "notrun"):
        return "Skip"
    return "Fail"  # FAIL, WARN and anything unknown


def _dcgm_messages(raw: Any, key: str) -> tuple[str, ...]:
    """Warnings/info: a string, a list of strings, or a list of objects
    carrying the text under ``key`` ("warning")."""
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    out: list[str] = []
    for item in items:
        if isinstance(item, dict):
            text = item.get(key) or item.get("message")
            if text:
                out.append(str(text))
        elif item is not None and str(item).strip():
            out.append(str(item))
    return tuple(out)


def _dcgm_ids(raw: Any) -> tuple[int, ...]:
    """3.x ids: an int, "0", or a CSV string "0,1,2"."""
    if raw is None:
        return ()
    if isinstance(raw, int):
        return (raw,)
    ids = []
    for part in str(raw).split(","):
        part = part.strip()
        if part.lstrip("-").isdigit():
            ids.append(int(part))
    return tuple(ids)


def _dcgm_result(
    test: str, category: str, raw: dict[str, Any], summary: bool
) -> DcgmTestResult:
    ids: tuple[int, ...]
    if summary:
        group, ids = "", ()
    elif "entity_group" in raw or "entity_id" in raw:  # 4.x
        group = str(raw.get("entity_group") or "GPU")
        eid = raw.get("entity_id")
        ids = (int(eid),) if isinstance(eid, int) else _dcgm_ids(eid)
    else:  # 3.x
        group = "GPU"
        ids = _dcgm_ids(raw.get("gpu_id", raw.get("gpu_ids")))
    return DcgmTestResult(
        test=test,
        category=category,
        status=_dcgm_status(raw.get("status")),
        entity_group=group,
        entity_ids=ids,
        warnings=_dcgm_messages(raw.get("warnings"), "warning"),
        info=_dcgm_messages(raw.get("info"), "info"),
        summary=summary,
    )


def _dcgm_failure(r: DcgmTestResult) -> str:
    if r.summary:
        where = ""
    elif r.entity_ids:
        noun = "GPU" if r.entity_group == "GPU" else r.entity_group
        where = f" on {noun}{'s' if len(r.entity_ids) > 1 else ''} " + ",".join(
            map(str, r.entity_ids)
        )
    else:
        where = " on all GPUs"
    msg = "; ".join(r.warnings) or "; ".join(r.info) or "no message from DCGM"
    return f"DCGM test '{r.test}' failed{where}: {msg}"


def parse_dcgm(text: str) -> DcgmResult:
    """Parse ``dcgmi diag -r N -j`` output (DCGM 4.x or 3.x layout).

    Text before the first '{' is ignored. Raises ParseError when there is no
    DCGM diagnostic document.
    """
    doc = _json_object(text, "dcgmi diag")
    if "DCGM Diagnostic" in doc:
        layout, body = "4.x", doc["DCGM Diagnostic"]
    elif "DCGM GPU Diagnostic" in doc:
        layout, body = "3.x", doc["DCGM GPU Diagnostic"]
    else:
        raise ParseError(
            "dcgmi diag: neither 'DCGM Diagnostic' nor 'DCGM GPU Diagnostic' in JSON"
        )
    body = _obj(body)
    meta = _obj(doc.get("metadata"))

    def pick(key: str) -> str | None:
        for src in (meta, doc, body):
            if src.get(key) not in (None, ""):
                return str(src[key])
        return None

    results: list[DcgmTestResult] = []
    for cat in body.get("test_categories") or []:
        if not isinstance(cat, dict):
            continue
        category = str(cat.get("category", ""))
        for test in cat.get("tests") or []:
            if not isinstance(test, dict):  # 3.x documents contain nulls
                continue
            name = str(test.get("name", "?"))
            for raw in test.get("results") or []:
                if isinstance(raw, dict):
                    results.append(_dcgm_result(name, category, raw, summary=False))
            if isinstance(test.get("test_summary"), dict):
                results.append(
                    _dcgm_result(name, category, test["test_summary"], summary=True)
                )

    runtime_error = pick("runtime_error")
    failures: list[str] = []
    if runtime_error:
        failures.append(f"DCGM could not run the diagnostic: {runtime_error}")
    failed_entity_tests = {
        r.test for r in results if r.status == "Fail" and not r.summary
    }
    for r in results:
        if r.status == "Fail" and not (r.summary and r.test in failed_entity_tests):
            failures.append(_dcgm_failure(r))
    if not results and not runtime_error:
        failures.append("DCGM reported no test results")
    return DcgmResult(
        layout=layout,
        version=pick("version"),
        driver_version=pick("Driver Version Detected"),
        results=results,
        runtime_error=runtime_error,
        passed=not failures,
        failures=failures,
    )


def judge_dcgm(result: DcgmResult, exit_code: int) -> Verdict:
    """Fail on any DCGM failure or a non-zero dcgmi exit status."""
    reasons = list(result.failures)
    if (
        result.results
        and not result.failures
        and all(r.status == "Skip" for r in result.results)
    ):
        why = "; ".join(
            dict.fromkeys(m for r in result.results for m in r.info + r.warnings)
        )
        reasons.append(
            "DCGM skipped every test, nothing was checked" + (f": {why}" if why else "")
        )
    if exit_code != 0:
        reasons.append(f"dcgmi exited {exit_code}: {dcgmi_exit_reason(exit_code)}")
    figures = {
        "exit_code": float(exit_code),
        "tests_failed": float(len(result.failed_tests)),
        "results": float(len(result.results)),
    }
    return _verdict(reasons, figures)


# --------------------------------------------------------------------------
# nccl-tests
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class NcclRow:
    """One size row of an nccl-tests table. Bandwidths in GB/s, times in us.
    ``*_wrong`` is None when nccl-tests printed "N/A" (run with -c 0)."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    oop_wrong: int | None
    ip_time_us: float
    ip_algbw: float
    ip_busbw: float
    ip_wrong: int | None


@dataclass
class NcclResult:
    """Parsed nccl-tests output.

    version: from "# nccl-tests version X ..." (newer versions), else None.
    collective: from "# Collective test starting: X", else None.
    params: numbers from the "# nThread ... minBytes ... maxBytes ..." line.
    hosts: hosts named in the "#  Rank N ... on HOST device ..." lines, in
        rank order without repeats; n_ranks counts those lines.
    rows: the data rows.
    out_of_bounds: from "# Out of bounds values : N OK|FAILED"; None if absent.
    avg_busbw: nccl-tests' own "# Avg bus bandwidth" (mean over every row,
        both in- and out-of-place); avg_busbw_status is the "OK"/"FAILED"
        suffix printed when NCCL_TESTS_MIN_BW is set, else None.
    concluded: True when "# Collective test concluded" was seen.
    errors: NCCL/CUDA failure lines and "# error:" lines.
    """

    version: str | None = None
    collective: str | None = None
    params: dict[str, float] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    n_ranks: int = 0
    rows: list[NcclRow] = field(default_factory=list)
    out_of_bounds: int | None = None
    avg_busbw: float | None = None
    avg_busbw_status: str | None = None
    concluded: bool = False
    errors: list[str] = field(default_factory=list)


_NCCL_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device"
)
_NCCL_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_NCCL_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?")
_NCCL_PARAM = re.compile(
    r"(nThread|nGpus|minBytes|maxBytes|warmup iters|iters|agg iters|validation|graph|unalign)\s*:?\s+(\d+)"
)


def _wrong(tok: str) -> int | None:
    return None if tok == "N/A" else int(float(tok))


def parse_nccl_tests(text: str) -> NcclResult:
    """Parse nccl-tests (all_reduce_perf and friends) text output.

    Data rows have 13 tokens: size count type redop root, then time algbw
    busbw #wrong for out-of-place (busbw at index 7, #wrong at 8) and in-place
    (11, 12). A trailing timestamp (-R) is ignored; the per-iteration layout
    (header with i_min ..., 21 tokens) is read with its own positions.
    Raises ParseError when neither a data row nor an nccl-tests header is seen.
    """
    res = NcclResult()
    per_iter = False
    seen_header = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if (
            "Test NCCL failure" in line
            or "Test CUDA failure" in line
            or "Test failure" in line
        ):
            res.errors.append(line)
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            if body.startswith("nccl-tests version"):
                res.version = body.split()[2]
                seen_header = True
            elif body.startswith("Collective test starting:"):
                res.collective = body.split(":", 1)[1].strip()
                seen_header = True
            elif body.startswith("Collective test concluded"):
                res.concluded = True
            elif body.startswith("nThread"):
                seen_header = True
                res.params = {
                    k.replace(" ", "_"): float(v) for k, v in _NCCL_PARAM.findall(body)
                }
            elif body.startswith("error:"):
                res.errors.append(body)
            elif "i_min" in body:
                per_iter = True
            elif m := _NCCL_RANK.match(line):
                res.n_ranks += 1
                if m.group(2) not in res.hosts:
                    res.hosts.append(m.group(2))
            elif m := _NCCL_OOB.match(line):
                res.out_of_bounds = int(m.group(1))
            elif m := _NCCL_AVG.match(line):
                res.avg_busbw = _num(m.group(1))
                res.avg_busbw_status = m.group(2)
            continue
        tok = line.split()
        if len(tok) < 13 or not tok[0].isdigit() or not tok[1].isdigit():
            continue
        ip = 13 if per_iter and len(tok) >= 21 else 9  # first in-place column
        try:
            res.rows.append(
                NcclRow(
                    size_bytes=int(tok[0]),
                    count=int(tok[1]),
                    dtype=tok[2],
                    redop=tok[3],
                    root=int(tok[4]),
                    oop_time_us=float(tok[5]),
                    oop_algbw=float(tok[6]),
                    oop_busbw=float(tok[7]),
                    oop_wrong=_wrong(tok[8]),
                    ip_time_us=float(tok[ip]),
                    ip_algbw=float(tok[ip + 1]),
                    ip_busbw=float(tok[ip + 2]),
                    ip_wrong=_wrong(tok[ip + 3]),
                )
            )
        except (ValueError, IndexError):
            continue  # not a data row after all
    if not res.rows and not seen_header:
        raise ParseError("nccl-tests: no header and no data rows in output")
    return res


def judge_nccl(
    result: NcclResult,
    min_busbw_gbps: float,
    min_bytes: int,
    max_bytes: int,
    *,
    exit_code: int | None = None,
) -> Verdict:
    """Fail on any #wrong > 0, out-of-bounds values > 0, a missing footer, an
    error line, a non-zero exit status (when given), or when the mean busbw
    (in- and out-of-place averaged, as nccl-tests does) over the rows with
    min_bytes <= size <= max_bytes is below min_busbw_gbps (GB/s).

    The range must be fixed by the caller: nccl-tests' own "Avg bus
    bandwidth" averages every row, small sizes included, so it moves with -b/-e.
    """
    reasons: list[str] = []
    figures: dict[str, float] = {
        "min_busbw_gbps": float(min_busbw_gbps),
        "min_bytes": float(min_bytes),
        "max_bytes": float(max_bytes),
    }
    if exit_code is not None:
        figures["exit_code"] = float(exit_code)
        if exit_code != 0:
            reasons.append(f"nccl-tests exited {exit_code}")
    reasons.extend(f"nccl-tests error: {e}" for e in result.errors)
    if not result.rows:
        reasons.append("nccl-tests printed no result rows")
        return _verdict(reasons, figures)

    wrong = [
        (r.size_bytes, place, n)
        for r in result.rows
        for place, n in (("out-of-place", r.oop_wrong), ("in-place", r.ip_wrong))
        if n
    ]
    figures["wrong_total"] = float(sum(n for _, _, n in wrong))
    if wrong:
        listed = ", ".join(f"{n} at {size} B {place}" for size, place, n in wrong[:6])
        more = f" and {len(wrong) - 6} more" if len(wrong) > 6 else ""
        reasons.append(f"nccl-tests found wrong results (#wrong): {listed}{more}")

    if result.out_of_bounds is None:
        reasons.append("no '# Out of bounds values' footer: nccl-tests did not finish")
    else:
        figures["out_of_bounds"] = float(result.out_of_bounds)
        if result.out_of_bounds > 0:
            reasons.append(
                f"nccl-tests reported {result.out_of_bounds} out-of-bounds values"
            )
    if result.avg_busbw is not None:
        figures["tool_avg_busbw_gbps"] = result.avg_busbw
    if result.avg_busbw_status == "FAILED":
        reasons.append(
            f"nccl-tests marked its average bus bandwidth {result.avg_busbw} GB/s FAILED (NCCL_TESTS_MIN_BW)"
        )

    in_range = [r for r in result.rows if min_bytes <= r.size_bytes <= max_bytes]
    figures["rows_in_range"] = float(len(in_range))
    if not in_range:
        reasons.append(
            f"no result rows with size between {min_bytes} and {max_bytes} bytes"
        )
    else:
        avg = sum(r.oop_busbw + r.ip_busbw for r in in_range) / (2 * len(in_range))
        figures["avg_busbw_gbps"] = avg
        if avg < min_busbw_gbps:
            reasons.append(
                f"average bus bandwidth {avg:.2f} GB/s over {len(in_range)} sizes "
                f"{in_range[0].size_bytes}..{in_range[-1].size_bytes} B is below {min_busbw_gbps:g} GB/s"
            )
    return _verdict(reasons, figures)


# --------------------------------------------------------------------------
# stress-ng
# --------------------------------------------------------------------------

STRESS_NG_EXIT_CODES: Mapping[int, str] = {
    0: "success",
    1: "bad options or usage error",
    2: "one or more stressors failed",
    3: "a stressor could not initialise its resources (e.g. out of memory)",
    4: "a stressor is not implemented on this system",
    5: "killed by a signal",
    6: "no bogo-op metrics were produced",
    7: "metrics untrustworthy (bogo-op counters corrupted)",
}


def stress_ng_exit_reason(exit_code: int) -> str:
    if exit_code in STRESS_NG_EXIT_CODES:
        return STRESS_NG_EXIT_CODES[exit_code]
    if exit_code > 128:
        return f"terminated by signal {exit_code - 128}"
    return f"unexpected exit status {exit_code}"


@dataclass(frozen=True)
class StressMetric:
    """One stressor's metrics as stress-ng reports them, all instances together.

    bogo_ops: bogo operations done by all instances.
    wall_s: wall-clock run time ("real time"; the instances' mean).
    usr_s, sys_s: user and system CPU time, summed over instances.
    reported_per_s_real: stress-ng's "bogo ops/s (real time)" = bogo_ops / wall_s.
    reported_per_s_cpu: stress-ng's "bogo ops/s (usr+sys time)"; None if absent.
    cpu_usage_pct_per_instance: CPU use of one instance in % of one CPU; None
        when only the log was available.
    instances: instance count from the log ("dispatching hogs: 2 cpu") or
        derived from cpu-usage-per-instance; None when unknown.

    Derived:
    cpu_s: usr_s + sys_s, the CPU time the stressor actually got.
    per_wall_s: bogo-ops per wall second: what the node delivered.
    per_cpu_s: bogo-ops per CPU second: how fast the CPU was while it ran.
    cpus_used: cpu_s / wall_s, CPUs the stressor occupied on average.

    A stressor that got less CPU than it asked for (a cgroup quota below its
    instance count, or CPUs shared with sibling containers) has a low
    per_wall_s but a normal per_cpu_s; a slow or sick CPU has both low.
    """

    stressor: str
    bogo_ops: float
    wall_s: float
    usr_s: float
    sys_s: float
    reported_per_s_real: float
    reported_per_s_cpu: float | None = None
    cpu_usage_pct_per_instance: float | None = None
    instances: int | None = None

    @property
    def cpu_s(self) -> float:
        return self.usr_s + self.sys_s

    @property
    def per_wall_s(self) -> float:
        return (
            self.bogo_ops / self.wall_s if self.wall_s > 0 else self.reported_per_s_real
        )

    @property
    def per_cpu_s(self) -> float:
        if self.cpu_s > 0:
            return self.bogo_ops / self.cpu_s
        return self.reported_per_s_cpu or 0.0

    @property
    def cpus_used(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class StressResult:
    """Parsed stress-ng run.

    metrics: per stressor, in output order (from the YAML; from the log's
        "metrc:" lines when the YAML has none).
    version: stress-ng version from the YAML system-info, else None.
    instances: per stressor, from the log's "dispatching hogs:" line.
    passed, failed, skipped, untrustworthy: stressor names from the log's
        summary lines (stress-ng >= 0.16 prints them; older ones do not).
    fail_lines: log lines at level "fail" or "error" (verification failures,
        corrupted counters, ...), without the "stress-ng: fail: [pid]" prefix.
    completed: True for "successful run completed", False for
        "unsuccessful run completed", None when neither line is present.
    other_lines: log lines without the "stress-ng: level: [pid]" prefix, such
        as option errors ("cpu-method must be one of: ...").
    """

    metrics: dict[str, StressMetric] = field(default_factory=dict)
    version: str | None = None
    instances: dict[str, int] = field(default_factory=dict)
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    untrustworthy: list[str] = field(default_factory=list)
    fail_lines: list[str] = field(default_factory=list)
    completed: bool | None = None
    other_lines: list[str] = field(default_factory=list)


_SNG_LOG = re.compile(r"^stress-ng:\s*([\w-]+):\s*\[\d+\]\s?(.*)$")
_SNG_SUMMARY = re.compile(
    r"^(passed|failed|skipped|metrics untrustworthy):\s*(\d+)(?::\s*(.*))?$"
)
_SNG_NAMES = re.compile(r"([\w-]+) \(\d+\)")
_SNG_SECTION = re.compile(r"^([A-Za-z][\w-]*):\s*$")
_SNG_KV = re.compile(r"^\s*(?:-\s+)?([\w-]+):\s*(.*?)\s*$")


def _yaml_metric_items(yaml_text: str) -> tuple[list[dict[str, str]], str | None]:
    """The ``metrics:`` list and stress-ng-version of a stress-ng YAML file.

    Read line by line rather than with a YAML library: stress-ng 0.19.02
    writes ``source-date-epoch:`` unindented inside build-info, which makes
    the file invalid YAML (see tests/fixtures/stress-ng-pass.yaml).
    """
    items: list[dict[str, str]] = []
    version = None
    section = ""
    for line in yaml_text.splitlines():
        if line.strip() in ("---", "..."):
            section = ""
            continue
        if m := _SNG_SECTION.match(line):
            section = m.group(1)
            continue
        m = _SNG_KV.match(line)
        if not m:
            continue
        key, value = m.group(1), m.group(2).strip("'\"")
        if section == "system-info" and key == "stress-ng-version":
            version = value
        elif section == "metrics":
            if key == "stressor" and line.lstrip().startswith("-"):
                items.append({})
            if items:
                items[-1][key] = value
    return items, version


def _metric_from_yaml(
    item: dict[str, str], instances: int | None
) -> StressMetric | None:
    name = item.get("stressor")
    ops = _num(item.get("bogo-ops"))
    if not name or ops is None:
        return None
    wall = _num(item.get("wall-clock-time")) or 0.0
    usr = _num(item.get("user-time")) or 0.0
    sys_ = _num(item.get("system-time")) or 0.0
    pct = _num(item.get("cpu-usage-per-instance"))
    if instances is None and pct and wall > 0:
        instances = max(1, round((usr + sys_) / wall * 100.0 / pct))
    return StressMetric(
        stressor=name,
        bogo_ops=ops,
        wall_s=wall,
        usr_s=usr,
        sys_s=sys_,
        reported_per_s_real=_num(item.get("bogo-ops-per-second-real-time")) or 0.0,
        reported_per_s_cpu=_num(item.get("bogo-ops-per-second-usr-sys-time")),
        cpu_usage_pct_per_instance=pct,
        instances=instances,
    )


def parse_stress_ng(yaml_text: str | None, log_text: str | None = None) -> StressResult:
    """Parse stress-ng's ``--yaml`` file and (optionally) its stderr log.

    Metrics come from the YAML; when it has none (missing, or stress-ng died
    before writing it) they come from the log's "metrc:" table, which has the
    same figures rounded to 2 decimals. Raises ParseError only when both
    texts are empty.
    """
    if not (yaml_text or "").strip() and not (log_text or "").strip():
        raise ParseError("stress-ng: no YAML and no log")
    res = StressResult()
    log_metrics: list[StressMetric] = []
    for line in (log_text or "").splitlines():
        m = _SNG_LOG.match(line.strip())
        if not m:
            if line.strip():
                res.other_lines.append(line.strip())
            continue
        level, msg = m.group(1), m.group(2).strip()
        if level in ("fail", "error"):
            res.fail_lines.append(msg)
        elif level == "metrc":
            tok = msg.split()
            if len(tok) == 7 and all(_num(t) is not None for t in tok[1:]):
                ops, real, usr, sys_, per_real, per_cpu = (float(t) for t in tok[1:])
                log_metrics.append(
                    StressMetric(tok[0], ops, real, usr, sys_, per_real, per_cpu)
                )
        elif msg.startswith("dispatching hogs:"):
            for part in msg.split(":", 1)[1].split(","):
                bits = part.split()
                if len(bits) == 2 and bits[0].isdigit():
                    res.instances[bits[1]] = int(bits[0])
        elif s := _SNG_SUMMARY.match(msg):
            names = _SNG_NAMES.findall(s.group(3) or "")
            target = {
                "passed": res.passed,
                "failed": res.failed,
                "skipped": res.skipped,
            }.get(s.group(1), res.untrustworthy)
            target.extend(names)
        elif "successful run completed" in msg:
            res.completed = not msg.startswith("unsuccessful")

    items, res.version = _yaml_metric_items(yaml_text or "")
    for item in items:
        parsed = _metric_from_yaml(item, res.instances.get(item.get("stressor", "")))
        if parsed:
            res.metrics[parsed.stressor] = parsed
    if not res.metrics:
        for metric in log_metrics:
            res.metrics[metric.stressor] = replace(
                metric, instances=res.instances.get(metric.stressor)
            )
    return res


def explain_cpu_time(result: StressResult, granted_cpus: float | None = None) -> str:
    """Say where a low bogo-ops/s (wall) comes from, using the CPU time the
    stressors actually got (usr+sys) against what they asked for (one CPU per
    instance) and, when known, the CPUs the node is granted (its cgroup quota
    or cpuset size).

    - got (almost) every CPU-second asked for: the CPU itself was slow;
    - used up the node's grant: limited by the node's own CPU quota;
    - got less than the grant: waited for CPUs held by other processes or
      sibling containers on the same host.
    """
    used = sum(m.cpus_used for m in result.metrics.values())
    demand_known = all(m.instances for m in result.metrics.values())
    demand = (
        float(sum(m.instances or 0 for m in result.metrics.values()))
        if demand_known
        else None
    )
    if demand and used >= 0.9 * demand:
        return f"it got the CPU time it asked for ({used:.2f} of {demand:g} CPUs): the CPU itself was slow"
    if granted_cpus is not None and used >= 0.9 * min(
        granted_cpus, demand or granted_cpus
    ):
        return (
            f"it used its whole CPU grant ({used:.2f} of {granted_cpus:g} CPUs): "
            "limited by the node's own CPU quota"
        )
    if granted_cpus is not None:
        return (
            f"it got only {used:.2f} of the {granted_cpus:g} CPUs granted to the node: "
            "it waited for CPUs held by other processes or sibling containers"
        )
    asked = f" of the {demand:g} CPUs it asked for" if demand else " CPUs"
    return (
        f"it got only {used:.2f}{asked}: the node's CPU quota is smaller, "
        "or it waited for CPUs held by other processes or sibling containers"
    )


def judge_stress(
    result: StressResult,
    exit_code: int,
    min_bogo_ops_per_s: Mapping[str, float],
    *,
    per: Literal["wall", "cpu"] = "wall",
    granted_cpus: float | None = None,
) -> Verdict:
    """Judge a stress-ng run.

    Fails on a non-zero exit status, "fail"/"error" log lines, stressors the
    log lists as failed or untrustworthy, missing metrics, a stressor with
    zero bogo-ops, or a stressor below its threshold in min_bogo_ops_per_s.

    per="wall" compares bogo-ops per wall second (what the node delivered);
    per="cpu" compares bogo-ops per CPU second (usr+sys), so a node that
    merely waited for CPU (quota, sibling containers) is not blamed for it;
    thresholds must then be per CPU second. Either way both rates, the CPUs
    used and (when a rate is low) the explanation of explain_cpu_time go into
    the verdict; granted_cpus sharpens that explanation.
    """
    reasons: list[str] = []
    figures: dict[str, float] = {"exit_code": float(exit_code)}
    if exit_code != 0:
        detail = (
            f" ({result.other_lines[0][:200]})"
            if exit_code == 1 and result.other_lines
            else ""
        )
        reasons.append(
            f"stress-ng exited {exit_code}: {stress_ng_exit_reason(exit_code)}{detail}"
        )
    for line in result.fail_lines[:5]:
        reasons.append(f"stress-ng reported: {line}")
    if len(result.fail_lines) > 5:
        reasons.append(f"... and {len(result.fail_lines) - 5} more failure lines")
    if result.failed:
        reasons.append(f"stressors failed: {', '.join(result.failed)}")
    if result.untrustworthy:
        reasons.append(
            f"stressor metrics untrustworthy: {', '.join(result.untrustworthy)}"
        )
    if not result.metrics:
        reasons.append("stress-ng produced no metrics")
    if granted_cpus is not None:
        figures["granted_cpus"] = float(granted_cpus)

    slow = False
    for name, m in result.metrics.items():
        figures[f"{name}.bogo_ops"] = m.bogo_ops
        figures[f"{name}.bogo_ops_per_s_wall"] = m.per_wall_s
        figures[f"{name}.bogo_ops_per_s_cpu"] = m.per_cpu_s
        figures[f"{name}.cpus_used"] = m.cpus_used
        if m.bogo_ops <= 0:
            reasons.append(f"stressor {name} did no work (0 bogo-ops)")
        elif m.wall_s <= 0:
            reasons.append(
                f"stressor {name} has no run time in its metrics: the figures are lost"
            )
    for name, threshold in min_bogo_ops_per_s.items():
        figures[f"{name}.min_bogo_ops_per_s_{per}"] = float(threshold)
        got = result.metrics.get(name)
        if got is None:
            reasons.append(f"no metrics for stressor {name}")
            continue
        rate = got.per_cpu_s if per == "cpu" else got.per_wall_s
        if rate < threshold and got.bogo_ops > 0 and got.wall_s > 0:
            slow = True
            reasons.append(
                f"stressor {name}: {rate:.2f} bogo-ops/s ({per}) is below {threshold:g} "
                f"[{got.per_wall_s:.2f}/s wall, {got.per_cpu_s:.2f}/s per CPU-second, "
                f"{got.cpus_used:.2f} CPUs used]"
            )
    if result.metrics:
        figures["cpus_used_total"] = sum(m.cpus_used for m in result.metrics.values())
    if slow:
        reasons.append("CPU time: " + explain_cpu_time(result, granted_cpus))
    return _verdict(reasons, figures)


# --------------------------------------------------------------------------
# iperf3
# --------------------------------------------------------------------------


@dataclass
class IperfResult:
    """Parsed ``iperf3 -c ... -J`` output. Rates in bits per second.

    received_bps: end.sum_received.bits_per_second (end.sum for UDP).
    sent_bps: end.sum_sent.bits_per_second.
    retransmits: end.sum_sent.retransmits (TCP), None if absent.
    seconds: duration of the received sum.
    error: the JSON "error" key: iperf3 failed (connect refused, peer reset).
    version: start.version, e.g. "iperf 3.12".
    """

    received_bps: float | None
    sent_bps: float | None
    retransmits: int | None
    seconds: float | None
    error: str | None
    version: str | None

    @property
    def received_gbps(self) -> float | None:
        return None if self.received_bps is None else self.received_bps / 1e9


def parse_iperf3(text: str) -> IperfResult:
    """Parse ``iperf3 -J`` JSON (text before the first '{' is ignored)."""
    doc = _json_object(text, "iperf3")
    end, start = _obj(doc.get("end")), _obj(doc.get("start"))
    if not end and "error" not in doc and "start" not in doc:
        raise ParseError("iperf3: JSON has neither 'start', 'end' nor 'error'")
    recv = _obj(end.get("sum_received") or end.get("sum"))
    sent = _obj(end.get("sum_sent"))
    retrans = sent.get("retransmits")
    return IperfResult(
        received_bps=_num(recv.get("bits_per_second")),
        sent_bps=_num(sent.get("bits_per_second")),
        retransmits=int(retrans) if isinstance(retrans, (int, float)) else None,
        seconds=_num(recv.get("seconds")),
        error=str(doc["error"]) if doc.get("error") else None,
        version=str(start["version"]) if start.get("version") else None,
    )


def judge_iperf3(result: IperfResult, exit_code: int, min_gbps: float) -> Verdict:
    """Fail on an "error" in the JSON (iperf 3.12 with -J exits 0 even when
    the connection is refused), a non-zero exit status, no received rate, or
    a received rate below min_gbps (Gbit/s)."""
    reasons: list[str] = []
    figures: dict[str, float] = {
        "exit_code": float(exit_code),
        "min_gbps": float(min_gbps),
    }
    if result.error:
        reasons.append(f"iperf3 error: {result.error}")
    if exit_code != 0:
        reasons.append(f"iperf3 exited {exit_code}")
    if result.sent_bps is not None:
        figures["sent_gbps"] = result.sent_bps / 1e9
    if result.retransmits is not None:
        figures["retransmits"] = float(result.retransmits)
    gbps = result.received_gbps
    if gbps is None:
        if not result.error:
            reasons.append("iperf3 reported no received throughput")
    else:
        figures["received_gbps"] = gbps
        if gbps < min_gbps:
            reasons.append(f"received {gbps:.3f} Gbit/s is below {min_gbps:g} Gbit/s")
    return _verdict(reasons, figures)


# --------------------------------------------------------------------------
# MPI allreduce check (healthchecks/cpu/mpi_allreduce.c)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class MpiRankLine:
    """One ``HP-MPI rank=R size=S host=H sum=X expected=Y ok=0|1`` line."""

    rank: int
    size: int
    host: str
    sum: float
    expected: float
    ok: bool


@dataclass
class MpiResult:
    """All HP-MPI lines found (in any order, with any prefix such as srun's
    ``--label`` "3: "); other lines are ignored."""

    lines: list[MpiRankLine] = field(default_factory=list)

    @property
    def hosts(self) -> list[str]:
        return sorted({ln.host for ln in self.lines})


_MPI_LINE = re.compile(
    r"HP-MPI rank=(\d+) size=(\d+) host=(\S+) sum=(\S+) expected=(\S+) ok=([01])\b"
)


def parse_mpi_allreduce(text: str) -> MpiResult:
    """Parse the output of healthchecks/cpu/mpi_allreduce.c. Never raises:
    no lines at all is a verdict, not a parse error."""
    res = MpiResult()
    for line in text.splitlines():
        m = _MPI_LINE.search(line)
        if m and _num(m.group(4)) is not None and _num(m.group(5)) is not None:
            res.lines.append(
                MpiRankLine(
                    rank=int(m.group(1)),
                    size=int(m.group(2)),
                    host=m.group(3),
                    sum=float(m.group(4)),
                    expected=float(m.group(5)),
                    ok=m.group(6) == "1",
                )
            )
    return res


def judge_mpi_allreduce(
    result: MpiResult,
    *,
    expected_size: int | None = None,
    expected_hosts: Sequence[str] | None = None,
    exit_code: int | None = None,
) -> Verdict:
    """Fail when any rank is missing or duplicated, ranks disagree on the
    communicator size (or it differs from expected_size), any sum is wrong,
    an expected host printed nothing, or the launcher exited non-zero.

    Several lines "rank=0 size=1" mean the processes were started as separate
    singleton jobs: the launcher did not wire MPI (PMI) between them.
    """
    reasons: list[str] = []
    figures: dict[str, float] = {"ranks_reported": float(len(result.lines))}
    if exit_code is not None:
        figures["exit_code"] = float(exit_code)
        if exit_code != 0:
            reasons.append(f"MPI job exited {exit_code}")
    if expected_size is not None:
        figures["expected_size"] = float(expected_size)
    sizes = sorted({ln.size for ln in result.lines})
    size = expected_size if expected_size is not None else max(sizes, default=0)
    missing: list[int] = []
    if not result.lines:
        reasons.append("no HP-MPI lines: no rank completed MPI_Allreduce")
        missing = list(range(size))
    if sizes == [1] and len(result.lines) > 1:
        reasons.append(
            f"{len(result.lines)} processes each ran as a separate size-1 MPI job on "
            f"{', '.join(result.hosts)}: the launcher did not wire MPI (PMI) between them"
        )
    elif result.lines:
        if len(sizes) > 1:
            reasons.append(f"ranks disagree on the communicator size: {sizes}")
        elif sizes[0] != size:
            reasons.append(
                f"communicator size {sizes[0]} differs from the expected {size}"
            )
        by_rank: dict[int, list[str]] = {}
        for ln in result.lines:
            by_rank.setdefault(ln.rank, []).append(ln.host)
        for rank, hosts in sorted(by_rank.items()):
            if len(hosts) > 1:
                reasons.append(
                    f"rank {rank} reported {len(hosts)} times (hosts {', '.join(hosts)})"
                )
        missing = [r for r in range(size) if r not in by_rank]
        if missing:
            shown = ", ".join(map(str, missing[:16])) + (
                " ..." if len(missing) > 16 else ""
            )
            reasons.append(
                f"{len(missing)} of {size} ranks printed nothing: {shown}; "
                f"hosts that did report: {', '.join(result.hosts)}"
            )
    figures["ranks_missing"] = float(len(missing))

    # Recheck the sum against the size the rank saw, not only the rank's own "ok".
    bad = [
        ln
        for ln in result.lines
        if not ln.ok or ln.sum != ln.expected or ln.sum != ln.size * (ln.size + 1) / 2
    ]
    figures["ranks_wrong"] = float(len(bad))
    for ln in bad[:8]:
        reasons.append(
            f"wrong allreduce sum on {ln.host} (rank {ln.rank}): got {ln.sum:g}, expected {ln.expected:g}"
        )
    if len(bad) > 8:
        reasons.append(f"... and {len(bad) - 8} more ranks with a wrong sum")

    if expected_hosts is not None:
        silent = sorted(set(expected_hosts) - {ln.host for ln in result.lines})
        if silent:
            reasons.append(f"no HP-MPI line from host(s): {', '.join(silent)}")
    return _verdict(reasons, figures)
