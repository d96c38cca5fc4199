"""Where hp's state lives (HP_HOME: its database and each cluster's folder), and the two
facts the quickest command reads of it without opening the store (cli/quick.py: `hp
exec`): whether hosts are registered, and a cluster's status. Reads only: no schema,
nothing made (a dry run and `hp exec` make no state). Light on purpose: os, pathlib and
sqlite3, no more (the store, store.py, loads what writing needs)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

DB_NAME = "hp.db"


def hp_home() -> Path:
    env = os.environ.get("HP_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "hp"


def cluster_folder(home: Path, name: str) -> Path:
    """A cluster's folder in hp's state under `home` (its keys, secrets, agent's files):
    there from its create until its delete."""
    return home / "clusters" / name


def peek(home: Path | None, name: str | None = None) -> tuple[bool, str | None]:
    """(are hosts registered, cluster `name`'s recorded status or None), read in one
    read-only look; (False, None) when there is no database yet or it cannot be read."""
    db = (home or hp_home()) / DB_NAME
    if not db.exists():
        return False, None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            hosts = bool(con.execute("SELECT 1 FROM hosts LIMIT 1").fetchall())
            row = con.execute("SELECT status FROM clusters WHERE name = ?", (name,)).fetchone() if name else None
            return hosts, (row[0] if row else None)
        finally:
            con.close()
    except sqlite3.Error:
        return False, None


def hosts_registered(home: Path | None = None) -> bool:
    """Are hosts registered? Read without making hp's state (a dry run makes none)."""
    return peek(home)[0]
