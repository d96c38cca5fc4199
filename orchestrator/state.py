"""hp's own state in SQLite: cluster specs and statuses, events, node status history.

What exists (containers, networks, volumes) is read from Docker labels, never from
here; this file keeps what Docker can't: the spec, the status history and events.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

SCHEMA = """
CREATE TABLE IF NOT EXISTS clusters (
  name TEXT PRIMARY KEY,
  spec TEXT NOT NULL,
  status TEXT NOT NULL,
  message TEXT NOT NULL DEFAULT '',
  created REAL NOT NULL,
  updated REAL NOT NULL
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
  description TEXT NOT NULL
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
  ended REAL
);
CREATE INDEX IF NOT EXISTS operations_cluster ON operations(cluster, status);
CREATE TABLE IF NOT EXISTS kv (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
"""


def hp_home() -> Path:
    env = os.environ.get("HP_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "hp"


@dataclass
class ClusterRow:
    name: str
    spec: dict[str, Any]
    status: str
    message: str
    created: float
    updated: float


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
        }


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


class Store:
    def __init__(self, home: Path | None = None, clock: Callable[[], float] = time.time):
        self.home = home or hp_home()
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = self.home / "hp.db"
        self.clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def _x(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """For modules that keep tables of their own in hp's database (e.g. health checks)."""
        return self._x(sql, args)

    def executescript(self, sql: str) -> None:
        with self._lock:
            self._db.executescript(sql)

    # -- clusters -----------------------------------------------------------------------
    def add_cluster(self, name: str, spec: dict[str, Any], status: str) -> bool:
        """Claim a name; False if a cluster of that name is already recorded."""
        now = self.clock()
        try:
            self._x("INSERT INTO clusters VALUES (?,?,?,?,?,?)", (name, json.dumps(spec), status, "", now, now))
            return True
        except sqlite3.IntegrityError:
            return False

    def cluster(self, name: str) -> ClusterRow | None:
        rows = self._x("SELECT name, spec, status, message, created, updated FROM clusters WHERE name=?", (name,))
        return _cluster(rows[0]) if rows else None

    def clusters(self) -> list[ClusterRow]:
        return [_cluster(r) for r in self._x("SELECT name, spec, status, message, created, updated FROM clusters ORDER BY created")]

    def set_status(self, name: str, status: str, message: str = "") -> None:
        self._x("UPDATE clusters SET status=?, message=?, updated=? WHERE name=?", (status, message, self.clock(), name))

    def update_spec(self, name: str, change: Callable[[dict[str, Any]], dict[str, Any]],
                    node_statuses: list[tuple[str, str, str]] = ()) -> dict[str, Any]:
        """Read-modify-write of a cluster's spec in one write transaction, so that
        concurrent `hp scale` calls (any process) never lose each other's change."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = self._db.execute("SELECT spec FROM clusters WHERE name=?", (name,)).fetchall()
                if not rows:
                    raise KeyError(name)
                new = change(json.loads(rows[0][0]))
                self._db.execute("UPDATE clusters SET spec=?, updated=? WHERE name=?", (json.dumps(new), self.clock(), name))
                for node, status, message in node_statuses:  # e.g. nodes chosen for removal, with the new target
                    self._db.execute("INSERT INTO node_status (cluster, node, status, message, time) VALUES (?,?,?,?,?)",
                                     (name, node, status, message, self.clock()))
                self._db.execute("COMMIT")
                return new
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # -- operations (scaling): what is under way per group ------------------------------
    def add_operation(self, cluster: str, group: str, kind: str, target: int | None, previous: int | None,
                      nodes: list[str] | None = None) -> int:
        rows = self._x("INSERT INTO operations (cluster, group_name, kind, target, previous, nodes, status, started)"
                       " VALUES (?,?,?,?,?,?,?,?) RETURNING id",
                       (cluster, group, kind, target, previous, ",".join(nodes or []), "InProgress", self.clock()))
        return int(rows[0][0])

    def operations(self, cluster: str, active_only: bool = True) -> list[dict[str, Any]]:
        sql = ("SELECT id, group_name, kind, target, previous, nodes, status, message, started, ended FROM operations"
               " WHERE cluster=?" + (" AND status='InProgress'" if active_only else "") + " ORDER BY id")
        keys = ("id", "group", "kind", "target", "previous", "nodes", "status", "message", "started", "ended")
        return [dict(zip(keys, r)) for r in self._x(sql, (cluster,))]

    def end_operation(self, op_id: int, status: str, message: str = "") -> None:
        self._x("UPDATE operations SET status=?, message=?, ended=? WHERE id=?", (status, message, self.clock(), op_id))

    def remove_cluster(self, name: str) -> None:
        for t in ("clusters",):
            self._x(f"DELETE FROM {t} WHERE name=?", (name,))
        self._x("DELETE FROM node_status WHERE cluster=?", (name,))
        self._x("DELETE FROM operations WHERE cluster=?", (name,))

    def cluster_dir(self, name: str) -> Path:
        d = self.home / "clusters" / name
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return d

    # -- events -------------------------------------------------------------------------
    def event(self, cluster: str, resource_type: str, level: str, description: str,
              group: str | None = None, node_id: str | None = None, node: str | None = None) -> None:
        self._x("INSERT INTO events (cluster, time, resource_type, level, group_name, node_id, node, description)"
                " VALUES (?,?,?,?,?,?,?,?)", (cluster, self.clock(), resource_type, level, group, node_id, node, description))

    def events(self, cluster: str, after_id: int = 0, limit: int = 100000) -> list[Event]:
        rows = self._x("SELECT id, cluster, time, resource_type, level, group_name, node_id, node, description"
                       " FROM events WHERE cluster=? AND id>? ORDER BY id LIMIT ?", (cluster, after_id, limit))
        return [Event(*r) for r in rows]

    def follow_events(self, cluster: str, after_id: int = 0, poll: float = 0.5,
                      until: Callable[[], bool] = lambda: False) -> Iterator[Event]:
        while True:
            batch = self.events(cluster, after_id)
            for e in batch:
                after_id = e.id
                yield e
            if until():
                return
            time.sleep(poll)

    # -- node status history (Ray-style: timeouts and retry counts derive from it) --------
    def node_status(self, cluster: str, node: str, status: str, message: str = "") -> None:
        self._x("INSERT INTO node_status (cluster, node, status, message, time) VALUES (?,?,?,?,?)",
                (cluster, node, status, message, self.clock()))

    def node_history(self, cluster: str, node: str) -> list[tuple[str, str, float]]:
        return [(r[0], r[1], r[2]) for r in self._x(
            "SELECT status, message, time FROM node_status WHERE cluster=? AND node=? ORDER BY id", (cluster, node))]

    def snapshot(self, name: str) -> tuple[ClusterRow | None, dict[str, tuple[str, str, float]]]:
        """A cluster's row and its nodes' latest statuses, read in one transaction: a
        writer that changes both at once (delete-nodes: marks and a lower target) is
        seen whole or not at all."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                rows = self._db.execute("SELECT name, spec, status, message, created, updated FROM clusters WHERE name=?",
                                        (name,)).fetchall()
                latest = self._db.execute(
                    "SELECT node, status, message, time FROM node_status WHERE id IN "
                    "(SELECT MAX(id) FROM node_status WHERE cluster=? GROUP BY node)", (name,)).fetchall()
            finally:
                self._db.execute("COMMIT")
        return (_cluster(rows[0]) if rows else None), {r[0]: (r[1], r[2], r[3]) for r in latest}

    def latest_node_status(self, cluster: str) -> dict[str, tuple[str, str, float]]:
        rows = self._x("SELECT node, status, message, time FROM node_status WHERE id IN "
                       "(SELECT MAX(id) FROM node_status WHERE cluster=? GROUP BY node)", (cluster,))
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    # -- key/value (small host-wide settings, e.g. capacity limits) ------------------------
    def get(self, key: str, default: str | None = None) -> str | None:
        rows = self._x("SELECT value FROM kv WHERE key=?", (key,))
        return rows[0][0] if rows else default

    def put(self, key: str, value: str | None) -> None:
        if value is None:
            self._x("DELETE FROM kv WHERE key=?", (key,))
        else:
            self._x("INSERT INTO kv VALUES (?,?) ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))


def _cluster(r: tuple[Any, ...]) -> ClusterRow:
    return ClusterRow(name=r[0], spec=json.loads(r[1]), status=r[2], message=r[3], created=r[4], updated=r[5])
