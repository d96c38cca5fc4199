"""Where hp's state lives (HP_HOME: its database and each cluster's folder), and the two
facts the quickest command reads of it without opening the store (cli/quick.py: `hp
exec`): whether hosts are registered, and a cluster's status. Reads only: no schema,
nothing made (a dry run and `hp exec` make no state). Light on purpose: os and sqlite3;
paths as strings, and pathlib's Path (4 ms of `hp exec`) made only for callers that hold
one (the store, store.py, loads what writing needs)."""

from __future__ import annotations

import os
import sqlite3

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pathlib import Path

DB_NAME = "hp.db"


def home_dir() -> str:
    """HP_HOME, else $XDG_DATA_HOME/hp (default ~/.local/share/hp)."""
    env = os.environ.get("HP_HOME")
    if env:
        return env
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(xdg, "hp")


def hp_home() -> Path:
    from pathlib import Path

    return Path(home_dir())


def cluster_dir(home: str | os.PathLike[str], name: str) -> str:
    """A cluster's folder in hp's state under `home` (its keys, secrets, agent's files):
    there from its create until its delete."""
    return os.path.join(home, "clusters", name)


def cluster_folder(home: Path, name: str) -> Path:
    """cluster_dir, as a Path."""
    return type(home)(cluster_dir(home, name))


def peek(home: str | os.PathLike[str] | None, name: str | None = None) -> tuple[bool, str | None]:
    """(are hosts registered, cluster `name`'s recorded status or None), read in one
    read-only look; (False, None) when there is no database yet or it cannot be read."""
    db = os.path.join(home or home_dir(), DB_NAME)
    if not os.path.exists(db):
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
