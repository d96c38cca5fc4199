"""InstanceConnectivity across the nodes under check (at least 2): iperf3 between
node pairs (a ring, so a failure names the node(s) it implicates), an Open MPI
allreduce over ssh between the check containers, and on GPU nodes nccl-tests
all_reduce_perf. Traffic stays on the cluster's own network."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..catalogue import InstanceType
from ..cluster import Cluster, parallel
from . import sidecar
from .logic import implicated, ring_pairs, thresholds
from .parsers import judge_iperf3, judge_mpi_allreduce, judge_nccl, parse_iperf3, parse_mpi_allreduce, parse_nccl_tests

SSH_PORT = 2222  # in the node's network namespace; the node's own sshd (if any) keeps 22
IPERF_PORT = 5201
KEY = "/root/.ssh/hp-health"
SSH = (f"ssh -p {SSH_PORT} -i {KEY} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
       "-o BatchMode=yes -o ConnectTimeout=5 -o LogLevel=ERROR")
NCCL_SIZES = ("-b", "8", "-e", "128M", "-f", "2")


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
    sidecar.run(cluster, first, f"mkdir -p /root/.ssh && ssh-keygen -q -t ed25519 -N '' -f {KEY}")
    priv = cluster.p.get_file(first.cid, KEY)
    pub = cluster.p.get_file(first.cid, KEY + ".pub")

    def one(sc: sidecar.Sidecar) -> None:
        sidecar.run(cluster, sc, "mkdir -p /root/.ssh /run/sshd && chmod 700 /root/.ssh")
        cluster.p.put_files(sc.cid, "/root/.ssh", {"authorized_keys": (pub, 0o600, 0), "hp-health": (priv, 0o600, 0)})
        sidecar.run(cluster, sc, "ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key </dev/null; "
                    f"/usr/sbin/sshd -p {SSH_PORT} -h /etc/ssh/ssh_host_ed25519_key -o PasswordAuthentication=no "
                    f"-o PermitRootLogin=prohibit-password; iperf3 -s -D -p {IPERF_PORT}")

    parallel(one, cars)


def iperf_ring(cluster: Cluster, cars: list[sidecar.Sidecar], min_gbps: float, seconds: int) -> tuple[dict, dict, str]:
    by = {c.node: c for c in cars}
    pairs = ring_pairs([c.node for c in cars])

    def one(pair: tuple[str, str]):
        a, b = pair
        r = sidecar.run(cluster, by[a], ["iperf3", "-c", b, "-p", str(IPERF_PORT), "-t", str(seconds), "-J",
                                         "--connect-timeout", "3000"])
        try:
            v = judge_iperf3(parse_iperf3(r.output), r.exit_code, min_gbps)
        except Exception as e:  # noqa: BLE001 - no JSON at all: the client could not run
            from .parsers import Verdict

            v = Verdict(False, [f"iperf3 gave no result ({r.exit_code}): {str(e)[:100]}; {r.output.strip()[:200]}"], {})
        return v, r.output

    res = dict(zip(pairs, parallel(one, pairs)))
    text = "".join(f"==== iperf3 {a} -> {b} ====\n{out}\n" for (a, b), (_, out) in res.items())
    return {p: v for p, (v, _) in res.items()}, {p: v.passed for p, (v, _) in res.items()}, text


def mpi_allreduce(cluster: Cluster, cars: list[sidecar.Sidecar]) -> tuple[object, str]:
    hosts = [c.node for c in cars]
    cmd = (f"mpirun --allow-run-as-root -np {len(hosts)} --map-by node --host {','.join(h + ':1' for h in hosts)} "
           f"--mca plm_rsh_agent '{SSH}' --mca btl tcp,self --mca btl_tcp_if_include eth0 "
           f"--mca oob_tcp_if_include eth0 /usr/local/bin/mpi_allreduce 65536 2>&1")
    r = sidecar.run(cluster, cars[0], cmd)
    v = judge_mpi_allreduce(parse_mpi_allreduce(r.output), expected_size=len(hosts), expected_hosts=hosts,
                            exit_code=r.exit_code)
    return v, f"==== {cmd}\n{r.output}\n"


def nccl(cluster: Cluster, cars: list[sidecar.Sidecar], itype: InstanceType) -> tuple[object, str]:
    """nccl-tests all_reduce_perf over MPI, from the nccl-tests image's binary
    (HP_NCCL_TESTS_BIN) run by the same mpirun; fixed size range NCCL_SIZES."""
    hosts = [c.node for c in cars]
    binary = os.environ.get("HP_NCCL_TESTS_BIN", "/usr/local/bin/all_reduce_perf")
    cmd = (f"mpirun --allow-run-as-root -np {len(hosts)} --map-by node --host {','.join(h + ':1' for h in hosts)} --mca plm_rsh_agent '{SSH}' "
           f"{binary} {' '.join(NCCL_SIZES)} -g {itype.gpus} 2>&1")
    r = sidecar.run(cluster, cars[0], cmd)
    try:
        v = judge_nccl(parse_nccl_tests(r.output), thresholds(itype)["NcclBusBwGbps"], 8, 128 * 2**20,
                       exit_code=r.exit_code)
    except Exception as e:  # noqa: BLE001 - no nccl-tests output at all
        from .parsers import Verdict

        v = Verdict(False, [f"all_reduce_perf gave no result ({r.exit_code}): {str(e)[:200]}"], {})
    return v, f"==== {cmd}\n{r.output}\n"


def run_connectivity(cluster: Cluster, cars: list[sidecar.Sidecar], itypes: dict[str, InstanceType],
                     iperf_seconds: int = 1) -> ConnResult:
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
                out.reasons[c.node].append("MPI allreduce across " + ",".join(x.node for x in good) + ": "
                                           + "; ".join(mv.reasons[:3]))
        gpu = [c for c in good if itypes[c.node].gpus]
        if len(gpu) >= 2:
            nv, ntext = nccl(cluster, gpu, itypes[gpu[0].node])
            out.output += ntext
            for c in gpu:
                out.figures[c.node].update({f"nccl.{k}": x for k, x in nv.figures.items()})
                if not nv.passed:
                    out.reasons[c.node].append("nccl all_reduce_perf: " + "; ".join(nv.reasons[:3]))
    return out
