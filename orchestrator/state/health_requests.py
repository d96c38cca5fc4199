"""Deep health-check requests and their results, in hp's SQLite database (the store's
connection; tables made on first use, as the first releases made them).

`Records.set_state` is THE writer of a request's state (and `new_request` of its first):
the gate (transitions.request_edge) decides in the write transaction that records the
change, and the edge's event is written in it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .operations import OperationKind, OperationStatus
from .statuses import Attempt, CheckState
from .store import Store, iso
from .transitions import ACTIVE, RequestState, expected, request_edge

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

# how a request's end ends its operation (state/operations.py)
OPERATION_END = {
    RequestState.COMPLETED: OperationStatus.DONE,
    RequestState.FAILED: OperationStatus.FAILED,
    RequestState.CANCELLED: OperationStatus.FAILED,
}


@dataclass(frozen=True)
class Request:
    """A deep health-check request as recorded (Records.request, requests, active)."""

    id: str
    cluster: str
    state: RequestState
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
    attempt: Attempt
    state: CheckState
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
        """Record a request (Pending) and its event; None, nothing written, if the cluster
        already has an active one (one write transaction, so two racing CLIs can't both
        get in)."""
        rid = "hc-" + secrets.token_hex(4)
        new, edge = request_edge(rid, None, RequestState.PENDING)
        with self.s.transaction() as db:
            cur = db.execute(
                "INSERT INTO health_requests (id, cluster, state, checks, groups_, nodes, options, created) "
                "SELECT ?,?,?,?,?,?,?,? WHERE NOT EXISTS "
                "(SELECT 1 FROM health_requests WHERE cluster=? AND state IN (?,?))",
                (
                    rid,
                    cluster,
                    new.value,
                    json.dumps(checks),
                    json.dumps(groups),
                    json.dumps(nodes),
                    json.dumps(options),
                    self.s.clock(),
                    cluster,
                    *sorted(s.value for s in ACTIVE),
                ),
            )
            if cur.rowcount != 1:
                return None
            on_start = bool(options.get("on_start"))
            group = groups[0] if len(groups) == 1 else ""
            op = self.s.add_operation(cluster, group, OperationKind.HEALTH_CHECK, nodes=nodes, request=rid, db=db)
            text = edge.event(rid, "", requested(checks, groups, nodes, on_start))
            self.s.event(cluster, "Cluster", edge.level, text, groups[0] if on_start else None, operation=op, db=db)
        return rid

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

    def set_state(
        self,
        rid: str,
        state: RequestState,
        message: str = "",
        *,
        detail: str = "",
        level: str | None = None,
        expect: RequestState | Iterable[RequestState] | None = None,
    ) -> bool:
        """THE writer of a request's state: the gate decides in the write transaction that
        records it (InvalidTransition for an edge the table refuses), and the edge's event
        is written with it (`detail`: what the event adds; `level`: instead of the edge's).
        A state that is not active ends the request (its end time). False, nothing
        written, when the request is not recorded or, with `expect`, when its state is not
        that or one of those (someone else changed it since it was read)."""
        with self.s.transaction() as db:
            rows = db.execute("SELECT state, cluster FROM health_requests WHERE id=?", (rid,)).fetchall()
            if not rows or not expected(rows[0][0], expect):
                return False
            new, edge = request_edge(rid, rows[0][0], state)
            db.execute(
                "UPDATE health_requests SET state=?, message=?, ended=? WHERE id=?",
                (new.value, message, None if new in ACTIVE else self.s.clock(), rid),
            )
            op = self.s.request_operation(rid, db)
            if edge.level is not None:
                text = edge.event(rid, message, detail)
                self.s.event(rows[0][1], "Cluster", level or edge.level, text, operation=op, db=db)
            if op is not None and new not in ACTIVE:
                self.s.end_operation(op, OPERATION_END[new], message, db=db)
            return True

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
            Result(
                r[0], r[1], r[2], Attempt(r[3]), CheckState(r[4]), r[5], r[6], json.loads(r[7]), json.loads(r[8]), r[9]
            )
            for r in rows
        ]


def requested(checks: list[str], groups: list[str], nodes: list[str], on_start: bool) -> str:
    """What a new request's event (None -> Pending) says it checks, where."""
    if on_start:
        return f"(on start) of {', '.join(nodes)} in group {groups[0]}: {', '.join(checks)}"
    return f"requested: {', '.join(checks)} on {len(nodes)} node(s) of {', '.join(groups)}"


def output_dir(store: Store, cluster: str, rid: str) -> Path:
    d = store.cluster_dir(cluster) / "health" / rid
    d.mkdir(parents=True, exist_ok=True)
    return d


def _req(r: tuple[Any, ...]) -> Request:
    return Request(
        r[0],
        r[1],
        RequestState(r[2]),
        json.loads(r[3]),
        json.loads(r[4]),
        json.loads(r[5]),
        json.loads(r[6]),
        r[7],
        r[8],
        r[9],
        r[10],
    )
