"""DCGM diagnostics: `dcgmi diag -r N -j` (4.x and 3.x JSON layouts), its command, parser and verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..verdict import ParseError, Verdict, json_object, obj, verdict

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


def _dcgm_result(test: str, category: str, raw: dict[str, Any], summary: bool) -> DcgmTestResult:
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
        where = f" on {noun}{'s' if len(r.entity_ids) > 1 else ''} " + ",".join(map(str, r.entity_ids))
    else:
        where = " on all GPUs"
    msg = "; ".join(r.warnings) or "; ".join(r.info) or "no message from DCGM"
    return f"DCGM test '{r.test}' failed{where}: {msg}"


def parse_dcgm(text: str) -> DcgmResult:
    """Parse ``dcgmi diag -r N -j`` output (DCGM 4.x or 3.x layout).

    Text before the first '{' is ignored. Raises ParseError when there is no
    DCGM diagnostic document.
    """
    doc = json_object(text, "dcgmi diag")
    if "DCGM Diagnostic" in doc:
        layout, body = "4.x", doc["DCGM Diagnostic"]
    elif "DCGM GPU Diagnostic" in doc:
        layout, body = "3.x", doc["DCGM GPU Diagnostic"]
    else:
        raise ParseError("dcgmi diag: neither 'DCGM Diagnostic' nor 'DCGM GPU Diagnostic' in JSON")
    body = obj(body)
    meta = obj(doc.get("metadata"))

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
                results.append(_dcgm_result(name, category, test["test_summary"], summary=True))

    runtime_error = pick("runtime_error")
    failures: list[str] = []
    if runtime_error:
        failures.append(f"DCGM could not run the diagnostic: {runtime_error}")
    failed_entity_tests = {r.test for r in results if r.status == "Fail" and not r.summary}
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
    if result.results and not result.failures and all(r.status == "Skip" for r in result.results):
        why = "; ".join(dict.fromkeys(m for r in result.results for m in r.info + r.warnings))
        reasons.append("DCGM skipped every test, nothing was checked" + (f": {why}" if why else ""))
    if exit_code != 0:
        reasons.append(f"dcgmi exited {exit_code}: {dcgmi_exit_reason(exit_code)}")
    figures = {
        "exit_code": float(exit_code),
        "tests_failed": float(len(result.failed_tests)),
        "results": float(len(result.results)),
    }
    return verdict(reasons, figures)


def command(level: int) -> list[str]:
    return ["dcgmi", "diag", "-r", str(int(level)), "-j"]


def run_verdict(text: str, exit_code: int) -> Verdict:
    try:
        return judge_dcgm(parse_dcgm(text), exit_code)
    except ParseError as e:
        return Verdict(False, [f"dcgmi diag gave no result ({exit_code}): {str(e)[:200]}"], {})
