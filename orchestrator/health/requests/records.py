"""Health-check requests and results in hp's SQLite database (tables made on first use)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...state.store import Store, iso

SCHEMA = """
CREATE TABLE IF NOT EXISTS health_requests (
  id TEXT PRIMARY KEY, cluster TEXT NOT NULL, state TEXT NOT NULL, checks TEXT NOT NULL,
  groups_ TEXT NOT NULL, nodes TEXT NOT NULL, options TEXT NOT NULL, pid INTEGER,
  created REAL NOT NULL, ended REAL, message TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS health_requests_cluster ON health_requests(cluster, state);
CREATE TABLE IF NOT EXISTS health_results (
  id INTEGER PRIMARY KEY AUTOINCREMENT, request TEXT NOT NULL, cluster TEXT NOT NULL,
  node TEXT NOT NULL, grp TEXT NOT NULL, check_name TEXT NOT NULL, attempt TEXT NOT NULL,
  state TEXT NOT NULL, started REAL, ended REAL, reasons TEXT NOT NULL DEFAULT '[]',
  figures TEXT NOT NULL DEFAULT '{}', output TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS health_results_req ON health_results(request, id);
"""
ACTIVE = ("Pending", "Running")


@dataclass
class Request:
    id: str
    cluster: str
    state: str
    checks: list[str]
    groups: list[str]
    nodes: list[str]
    options: dict[str, Any]
    pid: int | None
    created: float
    ended: float | None
    message: str


@dataclass
class Result:
    node: str
    group: str
    check: str
    attempt: str  # initial, after-reboot, after-replace, on-start
    state: str  # Waiting, Running, Passed, Failed, Skipped
    started: float | None = None
    ended: float | None = None
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)
    output: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "Node": self.node,
            "InstanceGroupName": self.group,
            "Check": self.check,
            "Attempt": self.attempt,
            "State": self.state,
            "StartTime": iso(self.started) if self.started else None,
            "EndTime": iso(self.ended) if self.ended else None,
            "Reasons": self.reasons,
            "Figures": self.figures,
            "Output": self.output or None,
        }


class Records:
    def __init__(self, store: Store):
        self.s = store
        store.executescript(SCHEMA)

    def new_request(
        self, cluster: str, checks: list[str], groups: list[str], nodes: list[str], options: dict[str, Any]
    ) -> str | None:
        """Record a request; None if the cluster already has an active one (one statement,
        so two racing CLIs can't both get in)."""
        rid = "hc-" + secrets.token_hex(4)
        self.s.execute(
            "INSERT INTO health_requests (id, cluster, state, checks, groups_, nodes, options, created) "
            "SELECT ?,?,?,?,?,?,?,? WHERE NOT EXISTS (SELECT 1 FROM health_requests WHERE cluster=? AND state IN (?,?))",
            (
                rid,
                cluster,
                "Pending",
                json.dumps(checks),
                json.dumps(groups),
                json.dumps(nodes),
                json.dumps(options),
                self.s.clock(),
                cluster,
                *ACTIVE,
            ),
        )
        return rid if self.request(rid) else None

    def forget(self, cluster: str) -> None:
        """A deleted cluster's requests and results go with it."""
        self.s.execute("DELETE FROM health_results WHERE cluster=?", (cluster,))
        self.s.execute("DELETE FROM health_requests WHERE cluster=?", (cluster,))

    def request(self, rid: str) -> Request | None:
        rows = self.s.execute(
            "SELECT id, cluster, state, checks, groups_, nodes, options, pid, created, ended, message "
            "FROM health_requests WHERE id=?",
            (rid,),
        )
        return _req(rows[0]) if rows else None

    def requests(self, cluster: str) -> list[Request]:
        rows = self.s.execute(
            "SELECT id, cluster, state, checks, groups_, nodes, options, pid, created, ended, message "
            "FROM health_requests WHERE cluster=? ORDER BY created",
            (cluster,),
        )
        return [_req(r) for r in rows]

    def active(self, cluster: str) -> Request | None:
        return next((r for r in self.requests(cluster) if r.state in ACTIVE), None)

    def set_state(self, rid: str, state: str, message: str = "", ended: bool = False) -> None:
        self.s.execute(
            "UPDATE health_requests SET state=?, message=?, ended=? WHERE id=?",
            (state, message, self.s.clock() if ended else None, rid),
        )

    def set_verdicts(self, rid: str, verdicts: dict[str, str], results: dict[str, str]) -> None:
        """Keep node -> final verdict (words) and result (Passed, Failed, Skipped, Error)
        with the request (shown by status as Verdicts and Results)."""
        r = self.request(rid)
        opts = {**(r.options if r else {}), "verdicts": verdicts, "results": results}
        self.s.execute("UPDATE health_requests SET options=? WHERE id=?", (json.dumps(opts), rid))

    def summary(self, cluster: str) -> list[tuple[str, str, int, float]]:
        """(check, state, number of results, seconds they took in all) of the cluster's
        results that ended (for metrics)."""
        rows = self.s.execute(
            "SELECT check_name, state, COUNT(*), COALESCE(SUM(ended - started), 0) FROM health_results "
            "WHERE cluster=? AND ended IS NOT NULL AND started IS NOT NULL GROUP BY check_name, state",
            (cluster,),
        )
        return [(r[0], r[1], int(r[2]), float(r[3])) for r in rows]

    def set_pid(self, rid: str, pid: int) -> None:
        self.s.execute("UPDATE health_requests SET pid=? WHERE id=?", (pid, rid))

    def result(self, rid: str, cluster: str, r: Result) -> int:
        # RETURNING, not a later SELECT MAX(id): checks of several nodes insert concurrently
        rows = self.s.execute(
            "INSERT INTO health_results (request, cluster, node, grp, check_name, attempt, state, "
            "started, ended, reasons, figures, output) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) RETURNING id",
            (
                rid,
                cluster,
                r.node,
                r.group,
                r.check,
                r.attempt,
                r.state,
                r.started,
                r.ended,
                json.dumps(r.reasons),
                json.dumps(r.figures),
                r.output,
            ),
        )
        return int(rows[0][0])

    def update(self, row_id: int, r: Result) -> None:
        self.s.execute(
            "UPDATE health_results SET state=?, started=?, ended=?, reasons=?, figures=?, output=? WHERE id=?",
            (r.state, r.started, r.ended, json.dumps(r.reasons), json.dumps(r.figures), r.output, row_id),
        )

    def results(self, rid: str) -> list[Result]:
        rows = self.s.execute(
            "SELECT node, grp, check_name, attempt, state, started, ended, reasons, figures, output "
            "FROM health_results WHERE request=? ORDER BY id",
            (rid,),
        )
        return [
            Result(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7]), json.loads(r[8]), r[9]) for r in rows
        ]


def output_dir(store: Store, cluster: str, rid: str) -> Path:
    d = store.cluster_dir(cluster) / "health" / rid
    d.mkdir(parents=True, exist_ok=True)
    return d


def _req(r: tuple[Any, ...]) -> Request:
    return Request(
        r[0],
        r[1],
        r[2],
        json.loads(r[3]),
        json.loads(r[4]),
        json.loads(r[5]),
        json.loads(r[6]),
        r[7],
        r[8],
        r[9],
        r[10],
    )
