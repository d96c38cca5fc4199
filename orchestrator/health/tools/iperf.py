"""iperf3 `-c SERVER -J`: its command, parser and verdict."""

from __future__ import annotations

from dataclasses import dataclass

from ...verdict import ParseError, Verdict, json_object, num, obj, verdict

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
    doc = json_object(text, "iperf3")
    end, start = obj(doc.get("end")), obj(doc.get("start"))
    if not end and "error" not in doc and "start" not in doc:
        raise ParseError("iperf3: JSON has neither 'start', 'end' nor 'error'")
    recv = obj(end.get("sum_received") or end.get("sum"))
    sent = obj(end.get("sum_sent"))
    retrans = sent.get("retransmits")
    return IperfResult(
        received_bps=num(recv.get("bits_per_second")),
        sent_bps=num(sent.get("bits_per_second")),
        retransmits=int(retrans) if isinstance(retrans, (int, float)) else None,
        seconds=num(recv.get("seconds")),
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
    return verdict(reasons, figures)


PORT = 5201


def server_command() -> list[str]:
    """An iperf3 server, daemonised, in a check container."""
    return ["iperf3", "-s", "-D", "-p", str(PORT)]


def client_command(server: str, seconds: int) -> list[str]:
    return ["iperf3", "-c", server, "-p", str(PORT), "-t", str(int(seconds)), "-J", "--connect-timeout", "3000"]


def only_too_slow(v: Verdict) -> bool:
    """The run worked (exit 0, no error) and only its rate was below the least: what a
    host busy with other work also gives a healthy pair (their CPU quota, not the link,
    was short), so it is measured once more (connectivity.iperf_ring)."""
    return not v.passed and v.figures.get("exit_code") == 0.0 and all(r.startswith("received ") for r in v.reasons)


NAME_ERRORS = ("Name or service not known", "Temporary failure in name resolution")


def name_not_resolved(v: Verdict) -> bool:
    """The client could not resolve the server's name: right after a node is replaced,
    Docker's DNS may not answer for the new container yet (seen once: a re-check right
    after a replacement), so the run is tried again a few times
    (connectivity.iperf_ring); a node whose network is cut keeps failing."""
    return not v.passed and any(e in r for r in v.reasons for e in NAME_ERRORS)


def better(a: Verdict, b: Verdict) -> Verdict:
    """Of two runs of one pair, the one that passed, else the faster."""
    if a.passed != b.passed:
        return a if a.passed else b
    return a if a.figures.get("received_gbps", 0.0) >= b.figures.get("received_gbps", 0.0) else b


def run_verdict(text: str, exit_code: int, min_gbps: float) -> Verdict:
    """The verdict on one client run; no JSON at all means the client could not run."""
    try:
        return judge_iperf3(parse_iperf3(text), exit_code, min_gbps)
    except ParseError as e:
        return Verdict(False, [f"iperf3 gave no result ({exit_code}): {str(e)[:100]}; {text.strip()[:200]}"], {})
