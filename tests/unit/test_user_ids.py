"""Issue 46 item 2: a cluster's hpuser has the uid and gid of whoever ran `hp create` (the
user who ran sudo, under sudo), so what its jobs write in a mounted folder is theirs: the
rule (naming.user_ids), its record (the store) and every node's environment (the launcher),
against the fakes; tests/e2e/test_userwork.py runs hp as a user of the host and a job."""

from __future__ import annotations

import os

import pytest

from orchestrator.naming import DEFAULT_UID, user_ids
from tests.unit.test_cli import Hp, make
from tests.unit.test_cli import hp as hp  # noqa: F401 (the fixture)


@pytest.mark.parametrize(
    ("environ", "uid", "gid", "want"),
    [
        ({}, 1001, 1001, (1001, 1001)),  # a user with Docker access
        ({}, 1001, 118, (1001, DEFAULT_UID)),  # a CI runner whose own group is the docker group
        ({"SUDO_UID": "1002", "SUDO_GID": "1003"}, 0, 0, (1002, 1003)),  # sudo hp create
        ({"SUDO_UID": "1002", "SUDO_GID": "1003"}, 1001, 1001, (1001, 1001)),  # sudo to a user: that user
        ({}, 0, 0, (DEFAULT_UID, DEFAULT_UID)),  # root itself
        ({"SUDO_UID": "0", "SUDO_GID": "0"}, 0, 0, (DEFAULT_UID, DEFAULT_UID)),
        ({"SUDO_UID": "x", "SUDO_GID": ""}, 0, 0, (DEFAULT_UID, DEFAULT_UID)),
        ({}, 999, 999, (DEFAULT_UID, DEFAULT_UID)),  # a system account (the image has its own there)
        ({}, 64030, 64030, (DEFAULT_UID, DEFAULT_UID)),  # slurm's, in the image
        ({}, 65534, 65534, (DEFAULT_UID, DEFAULT_UID)),  # nobody
        ({}, 59999, 1000, (59999, 1000)),
    ],
)
def test_the_rule(environ: dict[str, str], uid: int, gid: int, want: tuple[int, int]) -> None:
    assert user_ids(environ, uid, gid) == want


def test_recorded_at_create_given_to_every_node_and_forgotten_at_delete(hp: Hp, monkeypatch) -> None:
    make(hp, "old")  # root, no sudo: the image's own ids
    monkeypatch.setattr(os, "getuid", lambda: 1001)
    monkeypatch.setattr(os, "getgid", lambda: 1002)
    make(hp)
    store = hp.w.env.store
    assert store.user_ids("lab") == (1001, 1002) and store.user_ids("old") == (1000, 1000)
    nodes = [c for c in hp.w.provider.containers_.values() if c.spec.labels.get("io.hp.cluster") == "lab"]
    nodes = [c for c in nodes if c.spec.labels.get("io.hp.role") in ("controller", "login", "worker")]
    assert nodes and all(
        (c.spec.environment["HP_USER_UID"], c.spec.environment["HP_USER_GID"]) == ("1001", "1002") for c in nodes
    )
    assert hp("delete", "lab").code == 0
    assert store.get("user:lab") is None and store.user_ids("lab") == (1000, 1000)
