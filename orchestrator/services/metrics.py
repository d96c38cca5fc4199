"""Prometheus metrics of one cluster, collected when scraped (prometheus_client's custom
collector; the agent serves it on 127.0.0.1:<port>/metrics, `hp metrics NAME`).

Slurm's view, read through the Slurm boundary (slurm/client.py):
  slurm_controller_up, slurm_nodes{partition,state}, slurm_jobs{partition,state}
hp's own, from its store and Docker:
  hp_nodes{group,phase}, hp_node_launch_failures_total{group} (each is retried),
  hp_node_reboots_total{group}, hp_node_replacements_total{group},
  hp_health_check_results_total{check,result}, hp_health_check_duration_seconds{check}
  (a summary: count and sum), hp_accounting_healthy{reason} (with Accounting),
  hp_scrape_duration_seconds.
Every sample carries cluster="<name>". Counts from hp's history are of what it keeps
(docs/accounting.md): a counter may restart after the history is pruned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..core.context import Cluster
from ..errors import TRANSIENT
from ..naming import group_prefix
from ..state.phases import Phase
from .accounting import health

log = logging.getLogger("hp.metrics")

CACHE_S = 1.0  # scrapes closer together than this get the same answer

# A cluster's deep health check results that ended: (check, result, how many, seconds in
# all) rows, from the health checks' records (state/health_requests.Records.summary),
# which sit a floor above the services: the agent passes them in.
HealthResults = Callable[[str], Iterable[tuple[str, str, int, float]]]


class ClusterCollector:
    """A prometheus_client collector (collect() yields metric families)."""

    def __init__(self, cluster: Cluster, health_results: HealthResults):
        self.c = cluster
        self.health_results = health_results
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Any]] | None = None

    def describe(self) -> list[Any]:
        return []  # unchecked collector: families are known only when collected

    def collect(self) -> Iterator[Any]:
        with self._lock:
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > CACHE_S:
                self._cached = (now, self._families())
            yield from self._cached[1]

    def _families(self) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        t0 = time.monotonic()
        c, name = self.c, self.c.name
        out: list[Any] = []
        spec = c.spec
        # -- Slurm's view
        up = GaugeMetricFamily("slurm_controller_up", "1 when slurmctld answers", labels=["cluster"])
        nodes = GaugeMetricFamily(
            "slurm_nodes",
            "Slurm nodes by partition and state (as sinfo: a node is counted in each of its partitions)",
            labels=["cluster", "partition", "state"],
        )
        jobs = GaugeMetricFamily(
            "slurm_jobs",
            "Jobs slurmctld knows by partition and state (ended ones for MinJobAge)",
            labels=["cluster", "partition", "state"],
        )
        answered = True
        try:
            counts: dict[tuple[str, str], int] = {}
            for n in c.slurm.nodes():
                for part in n.partitions or ("",):
                    key = (part, n.display)
                    counts[key] = counts.get(key, 0) + 1
            for (part, state), k in sorted(counts.items()):
                nodes.add_metric([name, part, state], k)
            for (state, part), k in sorted(c.slurm.job_states().items()):
                jobs.add_metric([name, part, state.lower()], k)
        except TRANSIENT as e:  # the controller does not answer: said so, the rest still served
            log.info("Slurm did not answer a scrape: %s", e)
            answered = False
        up.add_metric([name], 1 if answered else 0)
        out += [up, nodes, jobs]
        # -- hp's own
        groups = {g.InstanceGroupName.lower(): g.InstanceGroupName for g in spec.InstanceGroups}

        def group(node: str) -> str:
            return groups.get(group_prefix(node), group_prefix(node))

        phases = GaugeMetricFamily("hp_nodes", "hp's nodes by group and phase", labels=["cluster", "group", "phase"])
        by_phase: dict[tuple[str, str], int] = {}
        for node, rec in c.store.latest_phases(name).items():
            if rec.phase is not Phase.REMOVED:
                key = (group(node), rec.phase.value)
                by_phase[key] = by_phase.get(key, 0) + 1
        for (g, ph), k in sorted(by_phase.items()):
            phases.add_metric([name, g, ph], k)
        out.append(phases)
        history = c.store.phase_counts(name)
        for metric, phase, doc in (
            ("hp_node_launch_failures", Phase.LAUNCH_FAILED, "Node launches that failed (each is retried)"),
            ("hp_node_reboots", Phase.REBOOTING, "Node reboots (recovery, health checks, by hand)"),
            ("hp_node_replacements", Phase.REPLACING, "Node replacements (recovery, health checks, by hand)"),
        ):
            fam = CounterMetricFamily(metric, doc, labels=["cluster", "group"])
            per: dict[str, int] = {}
            for (node, ph), k in history.items():
                if ph == phase.value:
                    per[group(node)] = per.get(group(node), 0) + k
            for g in sorted(set(groups.values()) | set(per)):
                fam.add_metric([name, g], per.get(g, 0))
            out.append(fam)
        results = CounterMetricFamily(
            "hp_health_check_results",
            "Deep health check results by check and result",
            labels=["cluster", "check", "result"],
        )
        durations = SummaryMetricFamily(
            "hp_health_check_duration_seconds", "Time deep health checks took, by check", labels=["cluster", "check"]
        )
        per_check: dict[str, tuple[int, float]] = {}
        for check, state, k, secs in self.health_results(name):
            results.add_metric([name, check, state], k)
            n0, s0 = per_check.get(check, (0, 0.0))
            per_check[check] = (n0 + k, s0 + secs)
        for check, (k, secs) in sorted(per_check.items()):
            durations.add_metric([name, check], count_value=k, sum_value=secs)
        out += [results, durations]
        if spec.accounting:
            acct = GaugeMetricFamily(
                "hp_accounting_healthy",
                "1 when slurmdbd and its database answer (reason: why not)",
                labels=["cluster", "reason"],
            )
            try:
                h = health(c)
                acct.add_metric([name, h.reason or ""], 1 if h.healthy else 0)
            except TRANSIENT as e:
                log.info("accounting health unknown: %s", e)
                acct.add_metric([name, "Unknown"], 0)
            out.append(acct)
        took = GaugeMetricFamily("hp_scrape_duration_seconds", "Time this scrape took", labels=["cluster"])
        took.add_metric([name], time.monotonic() - t0)
        out.append(took)
        return out


def registry(cluster: Cluster, health_results: HealthResults) -> Any:
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(ClusterCollector(cluster, health_results))  # type: ignore[arg-type]
    return reg
