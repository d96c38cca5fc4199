"""hp's own state in SQLite: cluster specs and statuses, events, node phase history,
scaling operations, small host-wide settings, registered hosts (the health checks'
requests and results: health_requests.py, on this store's database).

What exists (containers, networks, volumes) is read from Docker labels, never from
here; this file keeps what Docker can't: the spec, the phase history and events.

Bounds: each creation of a cluster name is an incarnation, and its events, phases and
operations belong to it (a new cluster that takes a deleted one's name starts empty).
`prune()` keeps the database bounded: at most EVENTS_PER_CLUSTER events and
PHASES_PER_NODE phase records per node, and nothing of a deleted cluster older than
DELETED_RETENTION_S.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import waits
from ..naming import DEFAULT_UID
from . import phases
from .home import DB_NAME, cluster_folder, hp_home
from .operations import LEGACY_DONE, Operation, OperationKind, OperationStatus, owner, supersedes
from .phases import NodePhase, Phase, Phases
from .transitions import ClusterStatus, cluster_edge, expected

SCHEMA = """
CREATE TABLE IF NOT EXISTS clusters (
  name TEXT PRIMARY KEY,
  spec TEXT NOT NULL,
  status TEXT NOT NULL,
  message TEXT NOT NULL DEFAULT '',
  created REAL NOT NULL,
  updated REAL NOT NULL,
  incarnation TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  cluster TEXT NOT NULL,
  time REAL NOT NULL,
  resource_type TEXT NOT NULL,
  level TEXT NOT NULL,
  group_name TEXT,
  node_id TEXT,
  node TEXT,
  description TEXT NOT NULL,
  incarnation TEXT NOT NULL DEFAULT '',
  operation INTEGER
);
CREATE INDEX IF NOT EXISTS events_cluster ON events(cluster, id);
CREATE TABLE IF NOT EXISTS node_status (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  cluster TEXT NOT NULL,
  node TEXT NOT NULL,
  status TEXT NOT NULL,
  message TEXT NOT NULL DEFAULT '',
  time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS node_status_node ON node_status(cluster, node, id);
CREATE TABLE IF NOT EXISTS operations (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  cluster TEXT NOT NULL,
  group_name TEXT NOT NULL,
  kind TEXT NOT NULL,
  target INTEGER,
  previous INTEGER,
  nodes TEXT NOT NULL DEFAULT '',
  status TEXT NOT NULL,
  message TEXT NOT NULL DEFAULT '',
  started REAL NOT NULL,
  ended REAL,
  request TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS operations_cluster ON operations(cluster, status);
CREATE TABLE IF NOT EXISTS kv (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS hosts (
  name TEXT PRIMARY KEY,
  url TEXT NOT NULL,
  doc TEXT NOT NULL,
  position INTEGER NOT NULL,
  added REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS node_hosts (
  cluster TEXT NOT NULL,
  node TEXT NOT NULL,
  host TEXT NOT NULL,
  time REAL NOT NULL,
  PRIMARY KEY (cluster, node)
);
"""
# Columns added after the first release: (table, column, declaration).
MIGRATIONS = (
    ("clusters", "incarnation", "TEXT NOT NULL DEFAULT ''"),
    ("events", "incarnation", "TEXT NOT NULL DEFAULT ''"),
    ("events", "operation", "INTEGER"),
    ("operations", "request", "TEXT NOT NULL DEFAULT ''"),
    ("operations", "pid", "INTEGER"),
)

EVENTS_PER_CLUSTER = 20_000
PHASES_PER_NODE = 200
DELETED_RETENTION_S = 7 * 86400.0
PAGE_MAX = 10_000


@dataclass
class ClusterRow:
    name: str
    spec: dict[str, Any]
    status: ClusterStatus
    message: str
    created: float
    updated: float
    incarnation: str = ""


@dataclass
class Event:
    id: int
    cluster: str
    time: float
    resource_type: str
    level: str
    group: str | None
    node_id: str | None
    node: str | None
    description: str
    operation: int | None = None  # the operation it was written under (state/operations.py's owner)

    def as_dict(self) -> dict[str, Any]:
        return {
            "EventId": self.id,
            "EventTime": iso(self.time),
            "ClusterName": self.cluster,
            "ResourceType": self.resource_type,
            "EventLevel": self.level,
            "InstanceGroupName": self.group,
            "NodeId": self.node_id,
            "SlurmNodeName": self.node,
            "Description": self.description,
            "OperationId": self.operation,
        }


Latest = Phases  # node -> its latest NodePhase


@dataclass
class HostRow:
    """A registered Docker host (`hp hosts add`). `doc` holds the options: cpus and
    memory_mib (capacity overrides), tls_dir, advertise_addr, mtu, draining."""

    name: str
    url: str
    doc: dict[str, Any]
    position: int
    added: float

    def opt(self, key: str, default: Any = None) -> Any:
        return self.doc.get(key, default)


def _user_key(cluster: str) -> str:
    return f"user:{cluster}"


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


class Store:
    Error = sqlite3.Error  # what the store raises when its database fails (callers need not import sqlite3)

    def __init__(self, home: Path | None = None, clock: Callable[[], float] = time.time):
        self.home = home or hp_home()
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = self.home / DB_NAME
        self.clock = clock
        self._lock = threading.RLock()
        fresh = not self.path.exists()
        self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
        if fresh:
            os.chmod(self.path, 0o600)
        if not self._prepare():  # the usual case prepares at once: no wait set up (tenacity's import)
            waits.until(self._prepare, what=f"opening {self.path} (database is locked)", every=0.1, timeout=30)
        self._file = os.stat(self.path).st_ino  # the file opened (see gone())

    def _prepare(self) -> bool:
        """WAL mode, the schema and its migrations; False while another process holds a lock
        that SQLite reports at once, busy handler or not (seen: `PRAGMA journal_mode=WAL`
        answering "database is locked" to a CLI call beside a busy agent). Each step is
        idempotent: a retry redoes what the last try did not finish."""
        try:
            if self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":  # kept by the file once set
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            self._migrate()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e):
                raise
            return False
        return True

    def _migrate(self) -> None:
        for table, col, decl in MIGRATIONS:
            cols = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if col not in cols:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {col} {decl}")
        # operations ended before OperationStatus: in its words (a write only where one is left)
        legacy = f"status IN ({','.join('?' * len(LEGACY_DONE))})"
        if self._db.execute(f"SELECT 1 FROM operations WHERE {legacy} LIMIT 1", LEGACY_DONE).fetchone():
            self._db.execute(
                f"UPDATE operations SET status=? WHERE {legacy}", (OperationStatus.DONE.value, *LEGACY_DONE)
            )

    def close(self) -> None:
        self._db.close()

    def gone(self) -> bool:
        """The database file opened is no longer at its path: its state folder was
        removed (or the file replaced). SQLite goes on reading and writing the unlinked
        file, so a long-lived reader (the agent) asks this to notice."""
        try:
            return os.stat(self.path).st_ino != self._file
        except FileNotFoundError:
            return True

    def _x(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """For modules that keep tables of their own in hp's database (e.g. health checks)."""
        return self._x(sql, args)

    def executescript(self, sql: str) -> None:
        with self._lock:
            self._db.executescript(sql)

    def transaction(self) -> _Tx:
        """A write transaction (BEGIN IMMEDIATE): `with store.transaction() as db: ...`."""
        return _Tx(self)

    # -- clusters -----------------------------------------------------------------------
    def add_cluster(self, name: str, spec: dict[str, Any], status: ClusterStatus, detail: str = "") -> bool:
        """Claim a name (a new incarnation) with its first status (through the gate) and
        that status's event (`detail`: what the event adds); False if a cluster of that
        name is recorded (nothing written)."""
        new, edge = cluster_edge(name, None, status)
        now = self.clock()
        try:
            with self.transaction() as db:
                db.execute(
                    "INSERT INTO clusters (name, spec, status, message, created, updated, incarnation) "
                    "VALUES (?,?,?,?,?,?,?)",
                    (name, json.dumps(spec), new.value, "", now, now, secrets.token_hex(6)),
                )
                self._note(db, name, edge.level, edge.event(name, "", detail))
            return True
        except sqlite3.IntegrityError:
            return False

    _COLS = "name, spec, status, message, created, updated, incarnation"

    def cluster(self, name: str) -> ClusterRow | None:
        rows = self._x(f"SELECT {self._COLS} FROM clusters WHERE name=?", (name,))
        return _cluster(rows[0]) if rows else None

    def clusters(self) -> list[ClusterRow]:
        return [_cluster(r) for r in self._x(f"SELECT {self._COLS} FROM clusters ORDER BY created")]

    def set_status(
        self,
        name: str,
        status: ClusterStatus,
        message: str = "",
        *,
        detail: str = "",
        expect: ClusterStatus | Iterable[ClusterStatus] | None = None,
    ) -> bool:
        """THE writer of a cluster's status: the gate (transitions.cluster_edge) decides in
        the write transaction that records it (InvalidTransition for an edge the table
        refuses), and the edge's event is written with it (`detail`: what the event adds).
        False, nothing written, when the cluster is not recorded or, with `expect`, when
        its status is not that or one of those (someone else changed it since it was read)."""
        with self.transaction() as db:
            rows = db.execute("SELECT status FROM clusters WHERE name=?", (name,)).fetchall()
            if not rows or not expected(rows[0][0], expect):
                return False
            new, edge = cluster_edge(name, rows[0][0], status)
            db.execute(
                "UPDATE clusters SET status=?, message=?, updated=? WHERE name=?",
                (new.value, message, self.clock(), name),
            )
            self._note(db, name, edge.level, edge.event(name, message, detail))
            return True

    def _note(self, db: sqlite3.Connection, cluster: str, level: str | None, text: str) -> None:
        """A status change's event (level None: the edge writes none), in the writer's transaction."""
        if level is not None:
            self.event(cluster, "Cluster", level, text, db=db)

    def update_spec(
        self,
        name: str,
        change: Callable[[dict[str, Any]], dict[str, Any]],
        node_phases: list[tuple[str, Phase, str]] = (),
    ) -> dict[str, Any]:
        """Read-modify-write of a cluster's spec in one write transaction, so that
        concurrent `hp scale` calls (any process) never lose each other's change; with
        `node_phases`, phase changes written in the same transaction (through the gate)."""
        with self.transaction() as db:
            rows = db.execute("SELECT spec FROM clusters WHERE name=?", (name,)).fetchall()
            if not rows:
                raise KeyError(name)
            new = change(json.loads(rows[0][0]))
            db.execute("UPDATE clusters SET spec=?, updated=? WHERE name=?", (json.dumps(new), self.clock(), name))
            for node, phase, message in node_phases:
                self._write_phase(db, name, node, phase, message)
            return new

    def remove_cluster(self, name: str) -> None:
        """Forget a deleted cluster's spec, phases and operations (its events stay, for
        DELETED_RETENTION_S, under its last incarnation)."""
        with self.transaction() as db:
            db.execute("DELETE FROM clusters WHERE name=?", (name,))
            db.execute("DELETE FROM node_status WHERE cluster=?", (name,))
            db.execute("DELETE FROM operations WHERE cluster=?", (name,))
            db.execute("DELETE FROM node_hosts WHERE cluster=?", (name,))
            db.execute("DELETE FROM kv WHERE key=?", (_user_key(name),))

    def cluster_dir(self, name: str) -> Path:
        d = cluster_folder(self.home, name)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return d

    # -- operations (state/operations.py): what was asked of the cluster, and how it went --
    _OP_COLS = "id, cluster, group_name, kind, status, target, previous, nodes, message, started, ended, request, pid"

    def add_operation(
        self,
        cluster: str,
        group: str,
        kind: OperationKind,
        target: int | None = None,
        previous: int | None = None,
        nodes: Iterable[str] = (),
        *,
        request: str = "",
        pid: int | None = None,
        db: sqlite3.Connection | None = None,
    ) -> int:
        """Record an operation (InProgress) and return its id. In the same transaction,
        the operations it supersedes (operations.supersedes) end Superseded, each with an
        event. `group`: "" for the cluster's own; `request`: what else records it (a
        health check's id); `pid`: the process doing it, when a command does it itself (hp
        reboot): one that dies first leaves it to `end_orphaned_operations`; `db`: inside a
        writer's transaction."""
        if db is None:
            with self.transaction() as tx:
                return self.add_operation(
                    cluster, group, kind, target, previous, nodes, request=request, pid=pid, db=tx
                )
        kind = OperationKind(kind)
        now = self.clock()
        row = db.execute(
            "INSERT INTO operations (cluster, group_name, kind, target, previous, nodes, status, started, request, pid)"
            f" VALUES (?,?,?,?,?,?,?,?,?,?) RETURNING {self._OP_COLS}",
            (
                cluster,
                group,
                kind.value,
                target,
                previous,
                ",".join(nodes),
                OperationStatus.IN_PROGRESS.value,
                now,
                request,
                pid,
            ),
        ).fetchone()
        new = _operation(row)
        for old in self._active_operations(db, cluster):
            if supersedes(new, old):
                text = f"Operation {old.id} ({old.kind} of instance group {old.group}) superseded by operation {new.id}"
                db.execute(
                    "UPDATE operations SET status=?, message=?, ended=? WHERE id=?",
                    (OperationStatus.SUPERSEDED.value, f"superseded by operation {new.id}", now, old.id),
                )
                self.event(cluster, "InstanceGroup", "Info", text, old.group, operation=old.id, db=db)
        return new.id

    @classmethod
    def _active_operations(cls, db: sqlite3.Connection, cluster: str) -> list[Operation]:
        rows = db.execute(
            f"SELECT {cls._OP_COLS} FROM operations WHERE cluster=? AND status=? ORDER BY id",
            (cluster, OperationStatus.IN_PROGRESS.value),
        ).fetchall()
        return [_operation(r) for r in rows]

    def operations(self, cluster: str, active_only: bool = True) -> list[Operation]:
        """The cluster's operations, oldest first: those in progress, or all of them."""
        if active_only:
            with self._lock:
                return self._active_operations(self._db, cluster)
        rows = self._x(f"SELECT {self._OP_COLS} FROM operations WHERE cluster=? ORDER BY id", (cluster,))
        return [_operation(r) for r in rows]

    def operation(self, cluster: str, op_id: int) -> Operation | None:
        rows = self._x(f"SELECT {self._OP_COLS} FROM operations WHERE cluster=? AND id=?", (cluster, op_id))
        return _operation(rows[0]) if rows else None

    def request_operation(self, request: str, db: sqlite3.Connection | None = None) -> int | None:
        """The operation that records `request` (a health check's id), if any."""
        sql, args = "SELECT id FROM operations WHERE request=? ORDER BY id DESC LIMIT 1", (request,)
        rows = db.execute(sql, args).fetchall() if db is not None else self._x(sql, args)
        return int(rows[0][0]) if rows else None

    def end_operation(
        self, op_id: int, status: OperationStatus, message: str = "", *, db: sqlite3.Connection | None = None
    ) -> bool:
        """End an operation in progress as `status` (Done or Failed); False, nothing
        written, when it had already ended (superseded meanwhile, or ended by another).
        `db`: inside a writer's transaction."""
        status = OperationStatus(status)
        if status in (OperationStatus.IN_PROGRESS, OperationStatus.SUPERSEDED):
            raise ValueError(f"an operation ends Done or Failed, not {status}")
        if db is None:
            with self.transaction() as tx:
                return self.end_operation(op_id, status, message, db=tx)
        cur = db.execute(
            "UPDATE operations SET status=?, message=?, ended=? WHERE id=? AND status=?",
            (status.value, message, self.clock(), op_id, OperationStatus.IN_PROGRESS.value),
        )
        return cur.rowcount == 1

    def end_orphaned_operations(self, cluster: str, alive: Callable[[int], bool]) -> list[int]:
        """End Failed, each with an event, the cluster's operations in progress whose process
        (`pid`, e.g. an `hp reboot` killed mid-way) is no longer `alive`: never left
        InProgress for good. Their ids."""
        ended = []
        for op in self.operations(cluster):
            if op.pid is None or alive(op.pid):
                continue
            why = f"its process (pid {op.pid}) ended before the operation did; see the nodes' events"
            with self.transaction() as db:
                if self.end_operation(op.id, OperationStatus.FAILED, why, db=db):
                    self.event(
                        cluster,
                        "Cluster",
                        "Error",
                        f"Operation {op.id} ({op.kind}) failed: {why}",
                        operation=op.id,
                        db=db,
                    )
                    ended.append(op.id)
        return ended

    def operation_events(self, cluster: str, op_id: int) -> list[Event]:
        rows = self._x(
            f"SELECT {self._EV_COLS} FROM events WHERE cluster=? AND operation=? ORDER BY id", (cluster, op_id)
        )
        return [Event(*r) for r in rows]

    # -- events -------------------------------------------------------------------------
    def event(
        self,
        cluster: str,
        resource_type: str,
        level: str,
        description: str,
        group: str | None = None,
        node_id: str | None = None,
        node: str | None = None,
        *,
        operation: int | None = None,
        db: sqlite3.Connection | None = None,
    ) -> None:
        """An event; on `db` when given (inside a writer's transaction: written with the
        change it tells of), else in a transaction of its own. It is written under
        `operation`, or else under the operation in progress it concerns (operations.owner)."""
        if db is None:
            with self._lock:  # re-entrant: a transaction open now is this thread's own writer's
                if self._db.in_transaction:
                    return self.event(
                        cluster,
                        resource_type,
                        level,
                        description,
                        group,
                        node_id,
                        node,
                        operation=operation,
                        db=self._db,
                    )
                with self.transaction() as tx:
                    return self.event(
                        cluster, resource_type, level, description, group, node_id, node, operation=operation, db=tx
                    )
        if operation is None:
            operation = owner(self._active_operations(db, cluster), group, node)
        db.execute(
            "INSERT INTO events (cluster, time, resource_type, level, group_name, node_id, node, description,"
            " operation, incarnation)"
            " VALUES (?,?,?,?,?,?,?,?,?, COALESCE((SELECT incarnation FROM clusters WHERE name=?), ''))",
            (cluster, self.clock(), resource_type, level, group, node_id, node, description, operation, cluster),
        )

    _EV_COLS = "id, cluster, time, resource_type, level, group_name, node_id, node, description, operation"

    def _incarnation(self, cluster: str) -> str | None:
        """The incarnation whose events `hp events NAME` shows: the live cluster's, else
        the last one recorded for the name."""
        row = self.cluster(cluster)
        if row is not None:
            return row.incarnation
        rows = self._x("SELECT incarnation FROM events WHERE cluster=? ORDER BY id DESC LIMIT 1", (cluster,))
        return rows[0][0] if rows else None

    def has_events(self, cluster: str) -> bool:
        return self._incarnation(cluster) is not None

    def events(self, cluster: str, after_id: int = 0, limit: int = 1000) -> list[Event]:
        """The incarnation's events after `after_id`, oldest first, at most `limit`: with
        after_id 0, the NEWEST `limit` ones (a page from the newest)."""
        inc = self._incarnation(cluster)
        if inc is None:
            return []
        limit = max(1, min(int(limit), PAGE_MAX))
        cols = self._EV_COLS
        if after_id:
            rows = self._x(
                f"SELECT {cols} FROM events WHERE cluster=? AND incarnation=? AND id>? ORDER BY id LIMIT ?",
                (cluster, inc, after_id, limit),
            )
        else:
            rows = self._x(
                f"SELECT {cols} FROM events WHERE cluster=? AND incarnation=? ORDER BY id DESC LIMIT ?",
                (cluster, inc, limit),
            )[::-1]
        return [Event(*r) for r in rows]

    def follow_events(
        self, cluster: str, after_id: int = 0, poll: float = 0.5, until: Callable[[], bool] = lambda: False
    ) -> Iterator[Event]:
        first = True
        while True:
            batch = self.events(cluster, after_id) if (after_id or first) else []
            first = False
            for e in batch:
                after_id = e.id
                yield e
            if until():
                return
            waits.pause(poll)

    # -- node phases (Ray-style: timeouts and retry counts derive from the history) ------
    @staticmethod
    def _latest_phase(db: sqlite3.Connection, cluster: str, node: str) -> tuple[str, str] | None:
        rows = db.execute(
            "SELECT status, message FROM node_status WHERE cluster=? AND node=? ORDER BY id DESC LIMIT 1",
            (cluster, node),
        ).fetchall()
        return (rows[0][0], rows[0][1]) if rows else None

    def _write_phase(self, db: sqlite3.Connection, cluster: str, node: str, phase: Phase | str, message: str) -> bool:
        """THE writer of a node's phase (inside a write transaction): no-op for the same
        phase and message, else the gate (phases.check) decides; InvalidTransition for
        an edge the table refuses or an unknown phase."""
        cur = self._latest_phase(db, cluster, node)
        new = phases.parse(phase)
        if cur is not None and new is not None and cur[0] == new.value and cur[1] == message:
            return False
        new = phases.check(node, cur[0] if cur else None, phase)
        db.execute(
            "INSERT INTO node_status (cluster, node, status, message, time) VALUES (?,?,?,?,?)",
            (cluster, node, new.value, message, self.clock()),
        )
        return True

    def set_phase(self, cluster: str, node: str, phase: Phase | str, message: str = "") -> bool:
        """Record a node's new phase (through the gate); False when nothing changed."""
        with self.transaction() as db:
            return self._write_phase(db, cluster, node, phase, message)

    def node_history(self, cluster: str, node: str) -> list[NodePhase]:
        """The node's recorded phases, oldest first."""
        return [
            NodePhase(Phase(r[0]), r[1], r[2])
            for r in self._x(
                "SELECT status, message, time FROM node_status WHERE cluster=? AND node=? ORDER BY id", (cluster, node)
            )
        ]

    def phase_counts(self, cluster: str) -> dict[tuple[str, str], int]:
        """(node, phase) -> how many times the node entered it (within the kept history)."""
        rows = self._x(
            "SELECT node, status, COUNT(*) FROM node_status WHERE cluster=? GROUP BY node, status", (cluster,)
        )
        return {(r[0], r[1]): int(r[2]) for r in rows}

    _LATEST = (
        "SELECT node, status, message, time FROM node_status WHERE id IN "
        "(SELECT MAX(id) FROM node_status WHERE cluster=? GROUP BY node)"
    )

    def snapshot(self, name: str) -> tuple[ClusterRow | None, Latest]:
        """A cluster's row and its nodes' latest phases, read in one transaction: a
        writer that changes both at once (delete-nodes: marks and a lower target) is
        seen whole or not at all."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                rows = self._db.execute(f"SELECT {self._COLS} FROM clusters WHERE name=?", (name,)).fetchall()
                latest = self._db.execute(self._LATEST, (name,)).fetchall()
            finally:
                self._db.execute("COMMIT")
        return (_cluster(rows[0]) if rows else None), _phases(latest)

    def latest_phases(self, cluster: str) -> Latest:
        return _phases(self._x(self._LATEST, (cluster,)))

    # -- key/value (small host-wide settings, e.g. capacity limits) ------------------------
    def get(self, key: str, default: str | None = None) -> str | None:
        rows = self._x("SELECT value FROM kv WHERE key=?", (key,))
        return rows[0][0] if rows else default

    def put(self, key: str, value: str | None) -> None:
        if value is None:
            self._x("DELETE FROM kv WHERE key=?", (key,))
        else:
            self._x("INSERT INTO kv VALUES (?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))

    def set_user_ids(self, cluster: str, uid: int, gid: int) -> None:
        """The uid and gid of the cluster's hpuser (naming.user_ids), fixed at its create."""
        self.put(_user_key(cluster), f"{uid}:{gid}")

    def user_ids(self, cluster: str) -> tuple[int, int]:
        """The uid and gid of the cluster's hpuser; the image's for a cluster made before
        they were recorded."""
        uid, _, gid = (self.get(_user_key(cluster)) or f"{DEFAULT_UID}:{DEFAULT_UID}").partition(":")
        return int(uid), int(gid)

    # -- registered hosts (multi-host) ----------------------------------------------------
    def add_host(self, name: str, url: str, doc: dict[str, Any]) -> bool:
        """Record a host after the last of the others; False if the name is taken."""
        try:
            with self.transaction() as db:
                pos = db.execute("SELECT COALESCE(MAX(position), 0) + 1 FROM hosts").fetchall()[0][0]
                db.execute(
                    "INSERT INTO hosts (name, url, doc, position, added) VALUES (?,?,?,?,?)",
                    (name, url, json.dumps(doc), pos, self.clock()),
                )
            return True
        except sqlite3.IntegrityError:
            return False

    def hosts(self) -> list[HostRow]:
        """Registered hosts, in the order they were added (the first holds controllers by default)."""
        rows = self._x("SELECT name, url, doc, position, added FROM hosts ORDER BY position")
        return [HostRow(r[0], r[1], json.loads(r[2]), r[3], r[4]) for r in rows]

    def update_host(self, name: str, **changes: Any) -> None:
        with self.transaction() as db:
            rows = db.execute("SELECT doc FROM hosts WHERE name=?", (name,)).fetchall()
            if not rows:
                raise KeyError(name)
            doc = json.loads(rows[0][0])
            for k, v in changes.items():
                if v is None:
                    doc.pop(k, None)
                else:
                    doc[k] = v
            db.execute("UPDATE hosts SET doc=? WHERE name=?", (json.dumps(doc), name))

    def remove_host(self, name: str) -> None:
        self._x("DELETE FROM hosts WHERE name=?", (name,))

    # -- where each node was placed (multi-host): the host its current container is on ----
    def set_node_host(self, cluster: str, node: str, host: str) -> None:
        self._x(
            "INSERT INTO node_hosts (cluster, node, host, time) VALUES (?,?,?,?) "
            "ON CONFLICT(cluster, node) DO UPDATE SET host=excluded.host, time=excluded.time",
            (cluster, node, host, self.clock()),
        )

    def node_hosts(self, cluster: str) -> dict[str, str]:
        """Node -> the host its latest container was created on."""
        return {r[0]: r[1] for r in self._x("SELECT node, host FROM node_hosts WHERE cluster=?", (cluster,))}

    def nodes_on_host(self, host: str) -> list[tuple[str, str]]:
        """(cluster, node) of every node whose latest container was placed on `host`."""
        return [(r[0], r[1]) for r in self._x("SELECT cluster, node FROM node_hosts WHERE host=?", (host,))]

    # -- retention ------------------------------------------------------------------------
    def prune(self) -> dict[str, int]:
        """Keep the database bounded (see the module's docstring); returns rows removed."""
        removed = {"events": 0, "node_status": 0}
        cutoff = self.clock() - DELETED_RETENTION_S
        with self.transaction() as db:
            live = {r[0]: r[1] for r in db.execute("SELECT name, incarnation FROM clusters")}
            # events of incarnations that are over (deleted, or replaced by a new one), once old
            cur = db.execute(
                "DELETE FROM events WHERE time < ? AND NOT EXISTS (SELECT 1 FROM clusters c WHERE "
                "c.name = events.cluster AND c.incarnation = events.incarnation)",
                (cutoff,),
            )
            removed["events"] += cur.rowcount
            for name, inc in live.items():
                cur = db.execute(
                    "DELETE FROM events WHERE cluster=? AND incarnation=? AND id <= (SELECT id FROM events WHERE "
                    "cluster=? AND incarnation=? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (name, inc, name, inc, EVENTS_PER_CLUSTER),
                )
                removed["events"] += cur.rowcount
            nodes = db.execute(
                "SELECT cluster, node FROM node_status GROUP BY cluster, node HAVING COUNT(*) > ?", (PHASES_PER_NODE,)
            ).fetchall()
            for cluster, node in nodes:
                cur = db.execute(
                    "DELETE FROM node_status WHERE cluster=? AND node=? AND id <= (SELECT id FROM node_status WHERE "
                    "cluster=? AND node=? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (cluster, node, cluster, node, PHASES_PER_NODE),
                )
                removed["node_status"] += cur.rowcount
            db.execute(
                "DELETE FROM operations WHERE status != ? AND ended < ?", (OperationStatus.IN_PROGRESS.value, cutoff)
            )
        return removed


class _Tx:
    """A write transaction (BEGIN IMMEDIATE) on the store's connection, under its lock."""

    def __init__(self, store: Store):
        self.s = store

    def __enter__(self) -> sqlite3.Connection:
        self.s._lock.acquire()
        try:
            self.s._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.s._lock.release()
            raise
        return self.s._db

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            self.s._db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.s._lock.release()


def _phases(rows: Iterable[tuple[Any, ...]]) -> Phases:
    return Phases({r[0]: NodePhase(Phase(r[1]), r[2], r[3]) for r in rows})


def _operation(r: tuple[Any, ...]) -> Operation:
    return Operation(
        id=int(r[0]),
        cluster=r[1],
        group=r[2],
        kind=OperationKind(r[3]),
        status=OperationStatus(r[4]),
        target=r[5],
        previous=r[6],
        nodes=tuple(n for n in r[7].split(",") if n),
        message=r[8],
        started=r[9],
        ended=r[10],
        request=r[11],
        pid=r[12],
    )


def _cluster(r: tuple[Any, ...]) -> ClusterRow:
    return ClusterRow(
        name=r[0],
        spec=json.loads(r[1]),
        status=ClusterStatus(r[2]),
        message=r[3],
        created=r[4],
        updated=r[5],
        incarnation=r[6],
    )
