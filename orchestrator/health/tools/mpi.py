"""hp's own MPI_Allreduce check (healthchecks/cpu/mpi_allreduce.c): its output parser and verdict."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...verdict import Verdict, num, verdict

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


_MPI_LINE = re.compile(r"HP-MPI rank=(\d+) size=(\d+) host=(\S+) sum=(\S+) expected=(\S+) ok=([01])\b")


def parse_mpi_allreduce(text: str) -> MpiResult:
    """Parse the output of the check program mpi_allreduce.c. Never raises:
    no lines at all is a verdict, not a parse error."""
    res = MpiResult()
    for line in text.splitlines():
        m = _MPI_LINE.search(line)
        if m and num(m.group(4)) is not None and num(m.group(5)) is not None:
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
            reasons.append(f"communicator size {sizes[0]} differs from the expected {size}")
        by_rank: dict[int, list[str]] = {}
        for ln in result.lines:
            by_rank.setdefault(ln.rank, []).append(ln.host)
        for rank, hosts in sorted(by_rank.items()):
            if len(hosts) > 1:
                reasons.append(f"rank {rank} reported {len(hosts)} times (hosts {', '.join(hosts)})")
        missing = [r for r in range(size) if r not in by_rank]
        if missing:
            shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
            reasons.append(
                f"{len(missing)} of {size} ranks printed nothing: {shown}; "
                f"hosts that did report: {', '.join(result.hosts)}"
            )
    figures["ranks_missing"] = float(len(missing))

    # Recheck the sum against the size the rank saw, not only the rank's own "ok".
    bad = [ln for ln in result.lines if not ln.ok or ln.sum != ln.expected or ln.sum != ln.size * (ln.size + 1) / 2]
    figures["ranks_wrong"] = float(len(bad))
    for ln in bad[:8]:
        reasons.append(f"wrong allreduce sum on {ln.host} (rank {ln.rank}): got {ln.sum:g}, expected {ln.expected:g}")
    if len(bad) > 8:
        reasons.append(f"... and {len(bad) - 8} more ranks with a wrong sum")

    if expected_hosts is not None:
        silent = sorted(set(expected_hosts) - {ln.host for ln in result.lines})
        if silent:
            reasons.append(f"no HP-MPI line from host(s): {', '.join(silent)}")
    return verdict(reasons, figures)


BINARY = "/usr/local/bin/mpi_allreduce"


def mpirun(hosts: list[str], rsh_agent: str, program: list[str], subnet: str | None = None) -> list[str]:
    """An Open MPI launch of one rank per host, ranks started over ssh (`rsh_agent`). With
    `subnet` (the cluster network's, from `subnet_of`), MPI's TCP transport only on it: a
    registered host's node also has Docker's gateway bridge, the same subnet on every host.

    PRRTE's own traffic (out-of-band) is left to its default. Its include list compares an
    interface's kernel index as a 16-bit signed number (pmix_ifnametokindex returns int16_t;
    a subnet is first resolved to a name), so on a Docker host that has made more than 32767
    interfaces (each container start makes a veth pair) `oob_tcp_if_include eth0` matched
    nothing and mpirun exited 213 ("No network interfaces were found for out-of-band
    communications"): every healthy node failed the check."""
    argv = [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        str(len(hosts)),
        "--map-by",
        "node",
        "--host",
        ",".join(f"{h}:1" for h in hosts),
        "--mca",
        "plm_rsh_agent",
        rsh_agent,
    ]
    if subnet:
        argv += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", subnet]
    return argv + program


_INET = re.compile(r"\binet (\d+\.\d+\.\d+\.\d+/\d+)")

# run in a check container (the node's network namespace): its address on the cluster's network
ADDRESS_COMMAND = ["ip", "-o", "-4", "addr", "show", "dev", "eth0"]


def subnet_of(ip_output: str) -> str | None:
    """The subnet of the first IPv4 address in `ip -o -4 addr` output ("10.0.1.0/24"); None without one."""
    m = _INET.search(ip_output)
    return str(ipaddress.ip_interface(m.group(1)).network) if m else None


def command(hosts: list[str], rsh_agent: str, subnet: str | None, count: int = 65536) -> list[str]:
    return mpirun(hosts, rsh_agent, [BINARY, str(int(count))], subnet)
