"""Pure decisions of the deep health checks: who may be checked when, whom a failed pair
implicates, which checks exist."""

from __future__ import annotations

from dataclasses import dataclass

from ...slurm.model import SlurmNode, is_gpu_monitor_reason, is_health_reason
from ...state.statuses import CheckState

CHECKS = ("InstanceStress", "InstanceConnectivity")


@dataclass(frozen=True)
class Outcome:
    """A node's final result in a request: Passed, Failed, Skipped or Error (an internal
    error, or a check the kernel killed: not judged), with the words shown after it."""

    result: CheckState
    detail: str = ""

    def __str__(self) -> str:
        if not self.detail:
            return self.result
        return f"{self.result} {self.detail}" if self.passed else f"{self.result}: {self.detail}"

    @property
    def passed(self) -> bool:
        return self.result is CheckState.PASSED


def ring_pairs(nodes: list[str]) -> list[tuple[str, str]]:
    """Client -> server pairs: each node sends to the next, the last to the first, so
    each node is in two pairs (one with two nodes: a single pair)."""
    if len(nodes) < 2:
        return []
    if len(nodes) == 2:
        return [(nodes[0], nodes[1])]
    return [(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]


def interleave_hosts(nodes: list[tuple[str, str]]) -> list[str]:
    """(node, host) pairs as a ring order in which neighbours are on different hosts
    where they can be: the first node of each host, then the second of each... With
    nodes on three or more hosts, a host whose traffic is cut fails both pairs of each
    of its nodes, and one pair of their neighbours: only its own nodes are implicated."""
    by: dict[str, list[str]] = {}
    for n, h in nodes:
        by.setdefault(h, []).append(n)
    out: list[str] = []
    i = 0
    while len(out) < len(nodes):
        out += [ns[i] for ns in by.values() if i < len(ns)]
        i += 1
    return out


def implicated(nodes: list[str], pair_ok: dict[tuple[str, str], bool]) -> set[str]:
    """Nodes to blame for failed pair tests: a node all of whose pairs failed. When
    every pair failed nothing tells the nodes apart, and all are implicated; with
    two nodes both are."""
    bad = set()
    for n in nodes:
        mine = [ok for (a, b), ok in pair_ok.items() if n in (a, b)]
        if mine and not any(mine):
            bad.add(n)
    if pair_ok and not any(pair_ok.values()):
        return set(nodes)
    if not bad:  # some pair failed but every node also passed one: blame both ends of the failed pairs
        bad = {x for (a, b), ok in pair_ok.items() if not ok for x in (a, b)}
    return bad


@dataclass(frozen=True)
class Claim:
    """What to do with a node when a request starts: drain it, or skip it and why."""

    drain: bool
    skip_reason: str = ""


def claim(snode: SlurmNode | None, on_start: bool = False) -> Claim:
    """Whether a request may take the node. A node drained by hp (a check, or the
    on-start drain it registers with) is hp's to check again; any other drain is
    someone's. A node waiting for its on-start checks is left to them by on-demand
    requests, so that it is not resumed after checks other than its group's."""
    if snode is None:
        return Claim(False, "not registered in Slurm")
    if snode.awaiting_onstart and not on_start:
        return Claim(False, "waiting for its on-start deep health checks (drained until they pass)")
    if snode.drained:
        if is_health_reason(snode.reason):  # hp's own check (this or an earlier one): check again
            return Claim(True)
        if is_gpu_monitor_reason(snode.reason) and not on_start:  # hp's GPU monitor: a check may clear it
            return Claim(True)
        return Claim(
            False, f"already drained by someone else (reason: {snode.reason or 'none'}); hp leaves it as it is"
        )
    if snode.not_responding:
        return Claim(False, f"Slurm reports it {snode.display}")
    return Claim(True)


def validate_checks(checks: list[str]) -> list[str]:
    return [f"unknown check {c!r} (checks: {', '.join(CHECKS)})" for c in checks if c not in CHECKS]
