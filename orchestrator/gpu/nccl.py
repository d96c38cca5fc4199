"""nccl-tests `all_reduce_perf` text: its command, parser and verdict."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..verdict import ParseError, Verdict, num, verdict

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


_NCCL_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device")
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
        if "Test NCCL failure" in line or "Test CUDA failure" in line or "Test failure" in line:
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
                res.params = {k.replace(" ", "_"): float(v) for k, v in _NCCL_PARAM.findall(body)}
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
                res.avg_busbw = num(m.group(1))
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
        return verdict(reasons, figures)

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
            reasons.append(f"nccl-tests reported {result.out_of_bounds} out-of-bounds values")
    if result.avg_busbw is not None:
        figures["tool_avg_busbw_gbps"] = result.avg_busbw
    if result.avg_busbw_status == "FAILED":
        reasons.append(
            f"nccl-tests marked its average bus bandwidth {result.avg_busbw} GB/s FAILED (NCCL_TESTS_MIN_BW)"
        )

    in_range = [r for r in result.rows if min_bytes <= r.size_bytes <= max_bytes]
    figures["rows_in_range"] = float(len(in_range))
    if not in_range:
        reasons.append(f"no result rows with size between {min_bytes} and {max_bytes} bytes")
    else:
        avg = sum(r.oop_busbw + r.ip_busbw for r in in_range) / (2 * len(in_range))
        figures["avg_busbw_gbps"] = avg
        if avg < min_busbw_gbps:
            reasons.append(
                f"average bus bandwidth {avg:.2f} GB/s over {len(in_range)} sizes "
                f"{in_range[0].size_bytes}..{in_range[-1].size_bytes} B is below {min_busbw_gbps:g} GB/s"
            )
    return verdict(reasons, figures)


SIZES = ("-b", "8", "-e", "128M", "-f", "2")
MIN_BYTES, MAX_BYTES = 8, 128 * 2**20


def command(binary: str, gpus_per_rank: int) -> list[str]:
    """all_reduce_perf over the fixed size range SIZES (thresholds need a fixed range)."""
    return [binary, *SIZES, "-g", str(int(gpus_per_rank))]


def run_verdict(text: str, exit_code: int, min_busbw_gbps: float) -> Verdict:
    try:
        return judge_nccl(parse_nccl_tests(text), min_busbw_gbps, MIN_BYTES, MAX_BYTES, exit_code=exit_code)
    except ParseError as e:
        return Verdict(False, [f"all_reduce_perf gave no result ({exit_code}): {str(e)[:200]}"], {})
