"""InstanceConnectivity across the nodes under check (at least 2): iperf3 between node
pairs (a ring, so a failure names the node(s) it implicates), an Open MPI allreduce
over ssh between the check containers, and on GPU nodes nccl-tests all_reduce_perf.
Traffic stays on the cluster's own network."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ... import waits
from ...core.context import Cluster, parallel
from ...docker.views import ExecResult
from ...gpu import nccl
from ...spec.catalogue import InstanceType
from ...verdict import Verdict
from ..tools import iperf, mpi
from ..tools.limits import thresholds
from . import sidecar
from .decisions import implicated, interleave_hosts, ring_pairs

SSH_PORT = 2222  # in the node's network namespace; the node's own sshd (if any) keeps 22
KEY = "/root/.ssh/hp-health"
SSH = (
    f"ssh -p {SSH_PORT} -i {KEY} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
    "-o BatchMode=yes -o ConnectTimeout=5 -o LogLevel=ERROR"
)


@dataclass
class ConnResult:
    """Per node: reasons it failed (empty: passed) and figures; plus the raw outputs."""

    reasons: dict[str, list[str]] = field(default_factory=dict)
    figures: dict[str, dict[str, float]] = field(default_factory=dict)
    output: str = ""


def setup_ssh(cluster: Cluster, cars: list[sidecar.Sidecar]) -> None:
    """A throwaway key for this request (made in the first check container, never
    written outside the check containers) and sshd plus iperf3 servers in each."""
    first = cars[0]
    sidecar.run(cluster, first, ["mkdir", "-p", "/root/.ssh"])
    sidecar.run(cluster, first, ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", KEY])
    priv = cluster.p.get_file(first.cid, KEY)
    pub = cluster.p.get_file(first.cid, KEY + ".pub")
    host_key = "/etc/ssh/ssh_host_ed25519_key"

    def one(sc: sidecar.Sidecar) -> None:
        sidecar.run(cluster, sc, ["mkdir", "-p", "-m", "700", "/root/.ssh", "/run/sshd"])
        cluster.p.put_files(sc.cid, "/root/.ssh", {"authorized_keys": (pub, 0o600, 0), "hp-health": (priv, 0o600, 0)})
        sidecar.run(cluster, sc, ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host_key])
        no_passwords = ["-o", "PasswordAuthentication=no", "-o", "PermitRootLogin=prohibit-password"]
        sidecar.run(cluster, sc, ["/usr/sbin/sshd", "-p", str(SSH_PORT), "-h", host_key, *no_passwords])
        sidecar.run(cluster, sc, iperf.server_command())

    parallel(one, cars)


NAME_TRIES = 4  # runs of a pair whose server's name does not resolve (iperf.name_not_resolved), 1 s apart


def iperf_ring(
    cluster: Cluster, cars: list[sidecar.Sidecar], min_gbps: float, seconds: int
) -> tuple[dict[tuple[str, str], Verdict], dict[tuple[str, str], bool], str]:
    by = {c.node: c for c in cars}
    # across hosts: neighbours in the ring on different hosts, so that a host that cannot
    # be reached implicates only its own nodes
    pairs = ring_pairs(interleave_hosts([(c.node, c.host) for c in cars]))

    def one(pair: tuple[str, str]) -> tuple[Verdict, str]:
        a, b = pair

        def run_pair() -> tuple[Verdict, ExecResult]:
            r = sidecar.run(cluster, by[a], iperf.client_command(b, seconds))
            return iperf.run_verdict(r.output, r.exit_code, min_gbps), r

        v, r = waits.poll(run_pair, lambda vr: not iperf.name_not_resolved(vr[0]), every=1.0, attempts=NAME_TRIES)
        if not iperf.only_too_slow(v):
            return v, r.output
        # connected but slow: a busy host slows a healthy pair too; the better of two runs
        r2 = sidecar.run(cluster, by[a], iperf.client_command(b, seconds))
        v2 = iperf.run_verdict(r2.output, r2.exit_code, min_gbps)
        return iperf.better(v, v2), f"{r.output}\n==== again (too slow) ====\n{r2.output}"

    res = dict(zip(pairs, parallel(one, pairs), strict=True))
    text = "".join(f"==== iperf3 {a} -> {b} ====\n{out}\n" for (a, b), (_, out) in res.items())
    return {p: v for p, (v, _) in res.items()}, {p: v.passed for p, (v, _) in res.items()}, text


def mpi_allreduce(cluster: Cluster, cars: list[sidecar.Sidecar]) -> tuple[Verdict, str]:
    hosts = [c.node for c in cars]
    cmd = mpi.command(hosts, SSH, mpi.subnet_of(sidecar.run(cluster, cars[0], mpi.ADDRESS_COMMAND).output))
    r = sidecar.run(cluster, cars[0], cmd)
    parsed = mpi.parse_mpi_allreduce(r.output)
    v = mpi.judge_mpi_allreduce(parsed, expected_size=len(hosts), expected_hosts=hosts, exit_code=r.exit_code)
    return v, f"==== {' '.join(cmd)}\n{r.output}\n"


def nccl_allreduce(cluster: Cluster, cars: list[sidecar.Sidecar], itype: InstanceType) -> tuple[Verdict, str]:
    """nccl-tests all_reduce_perf over MPI, from the nccl-tests binary (HP_NCCL_TESTS_BIN)."""
    hosts = [c.node for c in cars]
    binary = os.environ.get("HP_NCCL_TESTS_BIN", "/usr/local/bin/all_reduce_perf")
    cmd = mpi.mpirun(hosts, SSH, nccl.command(binary, itype.gpus))
    r = sidecar.run(cluster, cars[0], cmd)
    v = nccl.run_verdict(r.output, r.exit_code, thresholds(itype)["NcclBusBwGbps"])
    return v, f"==== {' '.join(cmd)}\n{r.output}\n"


def run_connectivity(
    cluster: Cluster, cars: list[sidecar.Sidecar], itypes: dict[str, InstanceType], iperf_seconds: int = 1
) -> ConnResult:
    out = ConnResult(reasons={c.node: [] for c in cars}, figures={c.node: {} for c in cars})
    setup_ssh(cluster, cars)
    min_gbps = min(thresholds(itypes[c.node])["IperfGbps"] for c in cars)
    verdicts, ok, text = iperf_ring(cluster, cars, min_gbps, iperf_seconds)
    out.output += text
    bad = implicated([c.node for c in cars], ok) if not all(ok.values()) else set()
    for (a, b), v in verdicts.items():
        for n in (a, b):
            if v.figures.get("received_gbps") is not None:
                out.figures[n][f"iperf.{a}->{b}.gbps"] = v.figures["received_gbps"]
            out.figures[n]["iperf.min_gbps"] = min_gbps
            if n in bad and not v.passed:
                out.reasons[n].append(f"iperf3 {a} -> {b}: " + "; ".join(v.reasons))
    good = [c for c in cars if c.node not in bad]
    if len(good) >= 2:
        mv, mtext = mpi_allreduce(cluster, good)
        out.output += mtext
        for c in good:
            out.figures[c.node].update({f"mpi.{k}": x for k, x in mv.figures.items()})
            if not mv.passed:
                across = ",".join(x.node for x in good)
                out.reasons[c.node].append(f"MPI allreduce across {across}: " + "; ".join(mv.reasons[:3]))
        gpu = [c for c in good if itypes[c.node].gpus]
        if len(gpu) >= 2:
            nv, ntext = nccl_allreduce(cluster, gpu, itypes[gpu[0].node])
            out.output += ntext
            for c in gpu:
                out.figures[c.node].update({f"nccl.{k}": x for k, x in nv.figures.items()})
                if not nv.passed:
                    out.reasons[c.node].append("nccl all_reduce_perf: " + "; ".join(nv.reasons[:3]))
    return out
