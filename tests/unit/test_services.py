"""The cluster services against the fakes and on loopback: accounting's start order at
create and its health states, the watch that brings services back, a controller's reboot
waiting for accounting, JWT verification, the REST front (401 and nothing else for a bad
token), the metrics families (parsed with prometheus_client's text parser), `hp token`,
`hp api`, `hp metrics`, spec defaults and overrides, secrets never in logs."""

from __future__ import annotations

import http.client
import itertools
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fakes import spec_doc, world

from orchestrator.ci.logs import export_logs
from orchestrator.cluster.create import CreateOptions, create
from orchestrator.cluster.delete import delete
from orchestrator.cluster.describe import describe
from orchestrator.core.context import Cluster
from orchestrator.core.launcher import ACCOUNTING_QUOTA
from orchestrator.docker.views import ContainerSpec, ExecResult
from orchestrator.errors import BadInput, EngineError, OperationFailed
from orchestrator.naming import labels
from orchestrator.recovery import actions
from orchestrator.services import accounting, jwt
from orchestrator.services.endpoints import REST_RELAY
from orchestrator.services.front import Front
from orchestrator.services.metrics import registry
from orchestrator.services.servicewatch import ServiceWatch
from orchestrator.slurm.conf import render, slurmdbd_conf
from orchestrator.slurm.model import AccountingPing, parse_accounting_ping, parse_job_states, parse_sacct, parse_token
from orchestrator.spec.model import ACCOUNTING_DEFAULT, REST_DEFAULT, validate, with_overrides
from orchestrator.state.health_requests import Records


def make(w, name="lab", timeout=5.0, **top):
    spec = validate(spec_doc(name, **top), w.env.catalogue)
    create(w.env, spec, CreateOptions(timeout=timeout))
    return Cluster(w.env, name)


def calls(w, *ops):
    return [(op, n) for op, n in w.provider.calls if op in ops]


def legacy_accounting(w, c, database=False):
    """Make cluster `c` one of an older hp: slurmdbd (with MariaDB) in an accounting
    container of its own (hp-lab-slurmdbd; with `database`, MariaDB in hp-lab-mariadb
    too), its controller without slurmdbd.conf."""
    p = w.provider
    ctl = p.node("lab", "controller-1")
    for f in ("/etc/slurm/slurmdbd.conf", "/etc/slurm/hp-init.sql"):
        ctl.files.pop(f, None)
    roles = [("database", "mariadb")] if database else []
    for role, host in roles + [("accounting", "slurmdbd")]:
        spec = ContainerSpec(
            name=f"hp-lab-{host}",
            image=ctl.spec.image,
            hostname=host,
            labels=labels("lab", role),
            network=ctl.spec.network,
            restart_policy="unless-stopped",
        )
        p.start(p.create_container(spec))
    assert accounting.roles(c) == [r for r, _ in roles] + ["accounting"]


def entry_restarts(w, killed):
    """The controller's entry: a daemon killed in it (pkill) is started again, and
    slurmdbd says so in the container's log; `killed` gets what was killed."""

    def handler(ctr, cmd):
        if cmd[:2] == ["pkill", "-KILL"]:
            killed.append(cmd[-1])
            ctr.logs += "slurmdbd version 24.11.5 started\n"
        return ExecResult(0, "")

    w.provider.exec_handler = handler


# -- spec -----------------------------------------------------------------------------------
def test_defaults_overrides_and_bad_values(tmp_path):
    w = world(tmp_path)
    cat = w.env.catalogue
    spec = validate(spec_doc("lab"), cat)
    assert (spec.accounting, spec.rest) == (ACCOUNTING_DEFAULT, REST_DEFAULT) == (True, False)
    spec = with_overrides(spec_doc("lab"), cat, accounting=False, rest=True)
    assert (spec.accounting, spec.rest) == (False, True)
    with pytest.raises(BadInput) as e:
        validate(spec_doc("lab", Accounting={"Enabled": "yes"}, Rest={"On": True}), cat)
    text = str(e.value)
    assert "Accounting.Enabled" in text and "Rest.On: unknown key" in text and "Rest.Enabled: required" in text
    # a cluster recorded before the services existed has none
    stored = validate(spec_doc("lab"), cat, existing=True)
    assert (stored.accounting, stored.rest) == (False, False)


def test_slurm_conf_and_slurmdbd_conf(tmp_path):
    w = world(tmp_path)
    cat = w.env.catalogue
    on = render(validate(spec_doc("lab", Rest={"Enabled": True}), cat), cat)
    # slurmdbd runs in the controller's container: slurmctld and the nodes reach it there
    assert "AccountingStorageType=accounting_storage/slurmdbd" in on and "AccountingStorageHost=controller-1" in on
    assert "JobAcctGatherType=jobacct_gather/linux" in on and "AuthAltTypes=auth/jwt" in on
    off = render(validate(spec_doc("lab", Accounting={"Enabled": False}), cat), cat)
    assert "JobAcctGatherType=jobacct_gather/none" in off and "AccountingStorage" not in off and "jwt" not in off
    dbd = slurmdbd_conf(validate(spec_doc("lab", Rest={"Enabled": True}), cat), "pw123")
    assert "StoragePass=pw123" in dbd and "StorageHost=127.0.0.1" in dbd and "jwt_key=/etc/slurm/jwt.key" in dbd
    assert "DbdHost=controller-1" in dbd


def test_init_sql_renames_the_seed_cluster_and_its_tables_to_the_clusters_as_slurm_names_them():
    sql = accounting.init_sql("pw123", "Lab-2").decode()
    assert "IDENTIFIED BY 'pw123'" in sql and "${" not in sql
    # Slurm lower-cases the name; the seed's tables become `lab-2_...`, slurmdbd's record of them too
    assert "`slurm_acct_db`.`lab-2'" in sql and "CONCAT('\"lab-2'" in sql and "Lab-2" not in sql
    assert "LIKE 'hpseed\\_%'" in sql and "RENAME TABLE" in sql
    # the seed's cluster row and the tables' definitions name the cluster (its registration
    # then only updates the row, and slurmdbd finds the definitions current)
    assert "SET name = 'lab-2'" in sql and "WHERE name = 'hpseed'" in sql
    assert "REPLACE(definition, '\"hpseed_', '\"lab-2_')" in sql


# -- create -----------------------------------------------------------------------------------
def test_create_starts_accounting_in_the_controllers_container_and_the_nodes_with_it(tmp_path):
    # slurmdbd and MariaDB run in the controller's container, each daemon waiting in its
    # entry for the one it needs (images/node/hp-entry), not for hp; the nodes' containers
    # are made and started while the controller's starts, without waiting for it (their
    # starts are the longer path: docs/accounting.md)
    w = world(tmp_path)
    w.provider.fail_start = lambda ct: time.sleep(0.3) if "controller" in ct.spec.name else None  # a slow start
    c = make(w, Rest={"Enabled": True})
    order = calls(w, "create", "start")
    nodes = {f"hp-lab-{n}" for n in ("login-1", "cpu-1")}
    assert order.index(("create", "hp-lab-controller-1")) == 0  # its capacity before any node's
    ctl_started = order.index(("start", "hp-lab-controller-1"))
    assert all(order.index(("start", n)) < ctl_started for n in nodes)  # its start took 0.3 s
    assert not [n for _, n in order if "mariadb" in n or "slurmdbd" in n]  # no container of their own
    starts = [n for _, n in calls(w, "start")]
    assert starts.index("hp-lab-controller-1") < starts.index("hp-lab-slurmrestd")
    p = w.provider
    ctl = p.node("lab", "controller-1")
    assert {"/etc/slurm/slurmdbd.conf", "/etc/slurm/slurm.key", "/etc/slurm/jwt.key"} <= set(ctl.files)
    assert ctl.spec.volumes == {"hp-lab-slurmctld": "/var/spool/slurmctld", "hp-lab-db": "/var/lib/mysql"}
    itype = w.env.catalogue[c.spec.group("controller").InstanceType]
    assert ctl.spec.cpu_limit == itype.cpu_limit + ACCOUNTING_QUOTA[0]
    assert ctl.spec.memory_bytes == (itype.memory_mib + ACCOUNTING_QUOTA[1]) * 2**20
    rest = p.node("lab", "slurmrestd")
    assert set(rest.files) == {"/etc/slurm/slurm.conf"}
    assert ctl.files["/etc/slurm/jwt.key"] == accounting.jwt_key(c)
    for f in ("jwt.key", "db.password"):
        assert oct((c.dir / f).stat().st_mode & 0o777) == "0o600"
    pw = accounting.db_password(c)
    assert pw.encode() in ctl.files["/etc/slurm/slurmdbd.conf"] and pw.encode() in ctl.files["/etc/slurm/hp-init.sql"]
    stored = w.env.store.cluster("lab").spec
    assert stored["Accounting"] == {"Enabled": True} and stored["Rest"] == {"Enabled": True}  # fixed at create
    assert delete(w.env, "lab") == {"containers": 5, "networks": 1, "volumes": 3}


def test_without_accounting_the_controller_starts_at_once(tmp_path):
    w = world(tmp_path)
    c = make(w, Accounting={"Enabled": False})
    assert [n for _, n in calls(w, "create", "start")][:2] == ["hp-lab-controller-1", "hp-lab-controller-1"]
    assert not [n for _, n in calls(w, "create") if "mariadb" in n or "slurmdbd" in n]
    assert describe(w.env, "lab")["SlurmHealth"] == []
    ctl = w.provider.node("lab", "controller-1")
    assert "/etc/slurm/slurmdbd.conf" not in ctl.files and ctl.spec.volumes == {
        "hp-lab-slurmctld": "/var/spool/slurmctld"
    }
    assert ctl.spec.cpu_limit == w.env.catalogue[c.spec.group("controller").InstanceType].cpu_limit


def test_a_database_that_exits_at_start_fails_the_create_and_rolls_back(tmp_path):
    w = world(tmp_path)

    def crash(c):  # the database cannot be set up: the controller's entry exits
        if c.spec.labels.get("io.hp.role") == "controller":
            c.state, c.exit_code, c.logs = "exited", 1, "mariadb-install-db: [ERROR] Aborting\n"

    w.provider.on_start.append(crash)
    with pytest.raises(
        OperationFailed, match=r"(?s)hp-lab-controller-1 exited \(1\) before slurmdbd was ready.*Aborting"
    ):
        make(w)
    assert w.provider.containers("lab") == [] and w.provider.volumes("lab") == []
    assert not (w.home / "clusters" / "lab" / "db.password").exists()


def test_a_controller_that_cannot_start_fails_the_create_and_the_nodes_made_meanwhile_go(tmp_path):
    w = world(tmp_path)
    w.provider.fail_start = lambda c: EngineError("port conflict", 500) if "controller" in c.spec.name else None
    with pytest.raises(OperationFailed, match="controller-1.*port conflict"):
        make(w)
    assert "hp-lab-login-1" in [n for _, n in calls(w, "create")]  # made while it started
    assert w.provider.containers("lab") == [] and w.provider.volumes("lab") == []
    assert w.env.store.cluster("lab").status == "Failed"


def test_a_database_that_never_answers_is_named_when_slurmdbd_waits_for_it(tmp_path):
    w = world(tmp_path)

    def silent(c):  # MariaDB runs, and never says it is ready (the entry keeps slurmdbd waiting)
        if c.spec.labels.get("io.hp.role") == "controller":
            c.logs = "mariadbd: [Note] InnoDB: Buffer pool(s) load completed\n"

    w.provider.on_start.append(silent)
    with pytest.raises(
        # the time is what was left of the create's 0.5 s when the wait began (less on a loaded host)
        OperationFailed,
        match=r"(?s)the database \(slurmdbd waits for it\) was not ready within 0\.[0-5]\d* s.*InnoDB",
    ):
        make(w, timeout=0.5)
    assert w.provider.containers("lab") == [] and w.provider.volumes("lab") == []


# -- health -----------------------------------------------------------------------------------
def test_health_states(tmp_path):
    w = world(tmp_path)
    c = make(w)
    h = accounting.health(c)
    assert h.healthy and h.as_dict() == {"Component": "Slurmdbd", "Status": "Healthy", "Message": h.message}
    w.provider.kill("hp-lab-controller-1")  # slurmdbd and its database with it
    h = accounting.health(c)
    assert (h.status, h.reason) == ("Unhealthy", "DaemonDown")
    assert h.message == "the controller's container is exited (exit 137)" and "Reason" in h.as_dict()
    w.provider.start("hp-lab-controller-1")
    # running but not answering: slurmdbd says its database is unreachable
    w.slurm.acct_ping = AccountingPing(False, True, False, "Unable to connect to database")
    assert accounting.health(c).reason == "DbUnreachable"
    # slurmdbd hung (no answer in 2 s): the database is asked itself
    w.slurm.acct_ping = AccountingPing(False, False, True, "")
    asked = []
    w.provider.exec_handler = lambda ctr, cmd: (
        asked.append(ctr.spec.name) or ExecResult(0 if "mariadb" in cmd else 1, "")
    )
    assert accounting.health(c).reason == "DaemonDown"
    assert asked == ["hp-lab-controller-1"]  # the client beside it, in the controller's container
    w.provider.exec_handler = lambda ctr, cmd: ExecResult(1, "")
    assert accounting.health(c).reason == "DbUnreachable"
    doc = describe(w.env, "lab")
    assert doc["SlurmHealth"][0]["Reason"] == "DbUnreachable" and doc["Accounting"] == {"Enabled": True}
    legacy_accounting(w, c)  # an older cluster's: its own container
    w.slurm.acct_ping = None
    w.provider.kill("hp-lab-slurmdbd")
    assert accounting.health(c).message == "slurmdbd's container is exited (exit 137)"


def test_parsers():
    up = parse_accounting_ping(0, "slurmdbd(primary) at slurmdbd is UP\n")
    assert up.up and not up.db_unreachable
    db = parse_accounting_ping(
        1, "error: Sending PersistInit msg: Unable to connect to database\nslurmdbd(primary) at slurmdbd is DOWN\n"
    )
    assert not db.up and db.db_unreachable and db.message.endswith("is DOWN")
    hung = parse_accounting_ping(124, "")
    assert hung.timed_out and not hung.up and not hung.db_unreachable
    assert [(j.job_id, j.state, j.exit_code) for j in parse_sacct("4|COMPLETED|0:0\n5|CANCELLED by 1000|0:15\n")] == [
        ("4", "COMPLETED", "0:0"),
        ("5", "CANCELLED", "0:15"),
    ]
    assert parse_token("SLURM_JWT=abc.def.ghi\n") == "abc.def.ghi"
    with pytest.raises(OperationFailed):
        parse_token("scontrol: error: JWT authentication is not enabled\n")
    assert parse_job_states("RUNNING|cpu\nPENDING|cpu\nRUNNING|cpu\n") == {("RUNNING", "cpu"): 2, ("PENDING", "cpu"): 1}


# -- bringing services back -----------------------------------------------------------------------
def test_watch_kills_a_hung_slurmdbd_or_database_in_the_controller_after_a_while(tmp_path, monkeypatch):
    monkeypatch.setattr("orchestrator.services.servicewatch.SETTLE_S", 0)
    w = world(tmp_path)
    make(w)
    killed: list[str] = []
    entry_restarts(w, killed)
    watch = ServiceWatch(w.env, "lab")
    w.slurm.acct_ping = AccountingPing(False, False, True, "")  # slurmdbd hung; the database answers
    watch.step(now=0.0)
    assert any("Unhealthy (DaemonDown)" in e.description for e in w.env.store.events("lab"))
    watch.step(now=10.0)
    assert killed == []  # not yet: it may be busy
    watch.step(now=40.0)
    assert killed == ["slurmdbd"] and not calls(w, "restart")  # the process, not the controller
    texts = [e.description for e in w.env.store.events("lab")]
    assert any("slurmdbd runs but does not answer: killing it" in t for t in texts)
    assert any("slurmdbd killed and started again" in t for t in texts)
    w.slurm.acct_ping = AccountingPing(False, True, False, "Unable to connect to database")  # MariaDB hung
    watch.step(now=50.0)
    watch.step(now=90.0)
    assert killed == ["slurmdbd", "mariadbd"]
    w.slurm.acct_ping = None
    watch.step(now=100.0)
    assert any("Healthy again" in e.description for e in w.env.store.events("lab"))


def test_a_hung_daemon_that_does_not_come_back_is_tried_again_later(tmp_path, monkeypatch):
    monkeypatch.setattr("orchestrator.services.servicewatch.SETTLE_S", 0)
    monkeypatch.setattr(accounting, "READY_TIMEOUT", 0.2)
    w = world(tmp_path)
    make(w)
    killed: list[str] = []
    w.provider.exec_handler = lambda ctr, cmd: (  # the daemon never says it started again
        ExecResult(0, "") if cmd[0] != "pkill" else killed.append(cmd[-1]) or ExecResult(0, "")
    )
    w.slurm.acct_ping = AccountingPing(False, False, True, "")
    watch = ServiceWatch(w.env, "lab")
    watch.step(now=0.0)
    watch.step(now=40.0)
    assert killed == ["slurmdbd"]
    assert any("bringing slurmdbd back failed" in e.description for e in w.env.store.events("lab"))
    watch.step(now=45.0)  # backing off
    assert killed == ["slurmdbd"]


def test_watch_brings_an_older_clusters_accounting_container_back(tmp_path, monkeypatch):
    monkeypatch.setattr("orchestrator.services.servicewatch.SETTLE_S", 0)
    w = world(tmp_path)
    c = make(w)
    legacy_accounting(w, c)
    w.provider.kill("hp-lab-slurmdbd")
    watch = ServiceWatch(w.env, "lab")
    watch.step(now=100.0)
    assert w.provider.node("lab", "slurmdbd").state == "running"
    texts = [e.description for e in w.env.store.events("lab")]
    assert any("slurmdbd (container exited, exit 137) down" in t for t in texts)
    assert any("slurmdbd restarted: back in" in t for t in texts)
    assert accounting.health(c).healthy
    # hung: its container restarted
    w.slurm.acct_ping = AccountingPing(False, False, True, "")
    watch.step(now=200.0)
    watch.step(now=240.0)
    assert calls(w, "restart")[-1:] == [("restart", "hp-lab-slurmdbd")]
    w.slurm.acct_ping = None
    # removed by someone: an old hp's, not made anew
    w.provider.remove_container("hp-lab-slurmdbd")
    assert accounting.roles(c) == [] and accounting.ensure_up(c) == []


def test_a_service_that_does_not_come_back_is_retried_later(tmp_path, monkeypatch):
    monkeypatch.setattr("orchestrator.services.servicewatch.SETTLE_S", 0)
    w = world(tmp_path)
    make(w, Rest={"Enabled": True})
    w.provider.kill("hp-lab-slurmrestd")
    w.provider.fail_start = lambda c: EngineError("no", 500) if "slurmrestd" in c.spec.name else None
    watch = ServiceWatch(w.env, "lab")
    watch.step(now=0.0)
    assert any("could not bring slurmrestd" in e.description for e in w.env.store.events("lab"))
    n = len(w.env.store.events("lab"))
    watch.step(now=5.0)  # backing off
    assert len(w.env.store.events("lab")) == n
    w.provider.fail_start = lambda c: None
    watch.step(now=100.0)
    assert w.provider.node("lab", "slurmrestd").state == "running"


def test_a_legacy_database_container_is_kept_running_and_asked(tmp_path, monkeypatch):
    """A cluster made when the database had a container of its own (hp-<c>-mariadb):
    its death is DbUnreachable, the watch starts it again before slurmdbd, and a
    controller's reboot waits for it too; it is never made anew."""
    monkeypatch.setattr("orchestrator.services.servicewatch.SETTLE_S", 0)
    w = world(tmp_path)
    c = make(w)
    p = w.provider
    legacy_accounting(w, c, database=True)
    assert accounting.health(c).healthy
    p.kill("hp-lab-mariadb")
    h = accounting.health(c)
    assert (h.reason, h.message) == ("DbUnreachable", "the database's container is exited (exit 137)")
    ServiceWatch(w.env, "lab").step(now=100.0)
    assert p.node("lab", "mariadb").state == "running"
    assert any("mariadb restarted: back in" in e.description for e in w.env.store.events("lab"))
    p.kill("hp-lab-mariadb")
    p.kill("hp-lab-controller-1")
    p.calls.clear()
    assert actions.reboot(c, "controller-1", "container died", wait=5)
    assert [n for _, n in calls(w, "start")] == ["hp-lab-mariadb", "hp-lab-controller-1"]
    p.remove_container("hp-lab-mariadb")  # gone: not made anew (its image is an old hp's)
    assert accounting.roles(c) == ["accounting"] and accounting.ensure_up(c) == []


def test_a_controller_reboot_starts_its_container_alone(tmp_path):
    """Its entry starts MariaDB, slurmdbd, then slurmctld: hp waits for nothing first."""
    w = world(tmp_path)
    c = make(w)
    w.provider.kill("hp-lab-controller-1")
    w.provider.calls.clear()
    assert actions.reboot(c, "controller-1", "container died", wait=5)
    assert [n for _, n in calls(w, "start")] == ["hp-lab-controller-1"]
    assert not any("waits for accounting first" in e.description for e in w.env.store.events("lab"))
    assert accounting.health(c).healthy


def test_controller_reboot_brings_an_older_clusters_accounting_back_first(tmp_path):
    w = world(tmp_path)
    c = make(w)
    legacy_accounting(w, c)
    w.provider.kill("hp-lab-slurmdbd")
    w.provider.kill("hp-lab-controller-1")
    w.provider.calls.clear()
    assert actions.reboot(c, "controller-1", "container died", wait=5)
    starts = [n for _, n in calls(w, "start")]
    assert starts == ["hp-lab-slurmdbd", "hp-lab-controller-1"]
    assert any("waits for accounting first" in e.description for e in w.env.store.events("lab"))


def test_controller_reboot_fails_while_an_older_clusters_accounting_cannot_come_back(tmp_path):
    w = world(tmp_path)
    c = make(w)
    legacy_accounting(w, c)
    w.provider.kill("hp-lab-slurmdbd")
    w.provider.kill("hp-lab-controller-1")
    w.provider.fail_start = lambda ctr: EngineError("no", 500) if "slurmdbd" in ctr.spec.name else None
    assert not actions.reboot(c, "controller-1", "container died", wait=2)
    assert w.provider.node("lab", "controller-1").state == "exited"  # never started without slurmdbd


# -- JWT and the REST front ----------------------------------------------------------------------
KEY = b"k" * 32


def test_jwt_sign_and_verify():
    now = 1_700_000_000
    tok = jwt.sign(KEY, "hpuser", 60, now=now)
    assert jwt.verify(KEY, tok, now=now + 1) is None and jwt.user_of(tok) == "hpuser"
    assert jwt.verify(KEY, tok, now=now + 61) == "token expired"
    assert jwt.verify(b"x" * 32, tok, now=now) == "invalid signature"  # forged: another key
    h, b, s = tok.split(".")
    body = json.loads(jwt._unb64(b))
    body["sun"] = "root"
    other = jwt._b64(json.dumps(body).encode()).decode()
    assert jwt.verify(KEY, f"{h}.{other}.{s}", now=now) == "invalid signature"  # tampered
    none = jwt._b64(b'{"alg":"none"}').decode()
    assert jwt.verify(KEY, f"{none}.{b}.", now=now) == "invalid signature"
    for bad in ("", "a.b", "a.b.c", "x" * 9000, "é.b.c", f"{h}.{jwt._b64(b'[1]').decode()}.{s}"):
        assert jwt.verify(KEY, bad, now=now) == "malformed token", bad
    noexp = jwt._b64(b'{"sun":"hpuser"}')
    sig = jwt._b64(__import__("hmac").new(KEY, h.encode() + b"." + noexp, "sha256").digest())
    assert jwt.verify(KEY, f"{h}.{noexp.decode()}.{sig.decode()}", now=now) == "malformed token"


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, bytes]] = []

    def log_message(self, *a):
        pass

    def _any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        _Upstream.seen.append((self.command, self.path, body))
        status = 500 if b"nope" in body else 200
        data = json.dumps(
            {"path": self.path, "errors": [{"error": "Invalid partition name specified"}] if status == 500 else []}
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _any


@pytest.fixture
def front():
    up = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    looked: list[bool] = []

    def upstream(again: bool) -> tuple[str, int]:
        looked.append(again)
        return "127.0.0.1", up.server_address[1]

    f = Front(0, lambda: KEY, upstream)
    f.serve_in_thread()
    _Upstream.seen.clear()
    yield f, looked
    f.shutdown()
    f.server_close()
    up.shutdown()
    up.server_close()


def req(port, method, path, token=None, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"X-SLURM-USER-NAME": "hpuser"}
    if token is not None:
        headers["X-SLURM-USER-TOKEN"] = token
    data = json.dumps(body).encode() if body is not None else None
    if data:
        headers["Content-Type"] = "application/json"
    c.request(method, path, body=data, headers=headers)
    r = c.getresponse()
    out = (r.status, json.loads(r.read() or b"null"), dict(r.getheaders()))
    c.close()
    return out


def test_front_refuses_bad_tokens_with_401_and_never_asks_slurmrestd(front):
    f, _ = front
    good = jwt.sign(KEY, "hpuser", 60)
    for tok, why in (
        (None, "missing X-SLURM-USER-TOKEN"),
        ("garbage", "malformed token"),
        (jwt.sign(KEY, "hpuser", -5), "token expired"),
        (jwt.sign(b"z" * 32, "hpuser", 60), "invalid signature"),
    ):
        status, doc, headers = req(f.port, "GET", "/slurm/v0.0.42/jobs", tok)
        assert status == 401 and doc["errors"][0]["error"] == why and doc["errors"][0]["error_number"] == 401
        assert "WWW-Authenticate" in headers
    # a good token, of another user than the one named
    status, doc, _ = req(f.port, "GET", "/slurm/v0.0.42/jobs", jwt.sign(KEY, "alice", 60))
    assert status == 401 and doc["errors"][0]["error"] == "the token is 'alice''s, not 'hpuser''s"
    assert _Upstream.seen == []
    status, doc, _ = req(f.port, "GET", "/slurm/v0.0.42/ping", good)
    assert status == 200 and doc["path"] == "/slurm/v0.0.42/ping"
    status, doc, _ = req(f.port, "POST", "/slurm/v0.0.42/job/submit", good, {"job": {"partition": "nope"}})
    assert status == 500 and doc["errors"][0]["error"] == "Invalid partition name specified"  # Slurm's, as it came
    status, _, _ = req(f.port, "DELETE", "/slurm/v0.0.42/job/7", good)
    assert status == 200 and [m for m, _, _ in _Upstream.seen] == ["GET", "POST", "DELETE"]


def test_front_through_a_tunnel_sends_one_whole_exchange_and_parses_the_answer(front):
    """With registered hosts the front reaches slurmrestd through an exec in its container:
    the request's bytes in (Connection: close), the response's bytes out."""
    f, looked = front
    host, port = f.upstream(False)
    sent: list[bytes] = []

    def relay(raw: bytes) -> bytes:  # what REST_RELAY does in the container, over a real socket
        sent.append(raw)
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
            return b"".join(iter(lambda: s.recv(65536), b""))

    f.tunnel = relay
    good = jwt.sign(KEY, "hpuser", 60)
    status, doc, _ = req(f.port, "POST", "/slurm/v0.0.42/job/submit", good, {"job": {"partition": "nope"}})
    assert status == 500 and doc["errors"][0]["error"] == "Invalid partition name specified"
    status, doc, _ = req(f.port, "GET", "/slurm/v0.0.42/ping", good)
    assert status == 200 and doc["path"] == "/slurm/v0.0.42/ping"
    head = sent[0].split(b"\r\n\r\n")[0].decode()
    assert head.startswith("POST /slurm/v0.0.42/job/submit HTTP/1.1") and "Connection: close" in head
    assert good in head and f"Content-Length: {len(json.dumps({'job': {'partition': 'nope'}}))}" in head
    f.tunnel = lambda raw: (_ for _ in ()).throw(ConnectionError("its container is gone"))
    status, doc, _ = req(f.port, "GET", "/slurm/v0.0.42/ping", good)
    assert status == 502 and "its container is gone" in doc["errors"][0]["error"]


def test_front_says_502_when_slurmrestd_is_gone(front):
    f, looked = front
    f.upstream = lambda again: ("127.0.0.1", 9)  # nothing listens on the discard port
    status, doc, _ = req(f.port, "GET", "/slurm/v0.0.42/ping", jwt.sign(KEY, "hpuser", 60))
    assert status == 502 and "does not answer" in doc["errors"][0]["error"]


# -- metrics ------------------------------------------------------------------------------------
def test_metrics_families_parse_and_count(tmp_path):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    w = world(tmp_path)
    c = make(w)
    w.slurm.job_states_ = {("RUNNING", "cpu"): 2, ("PENDING", "dev"): 1}
    w.env.store.set_phase("lab", "cpu-2", "Rebooting", "x")
    w.env.store.set_phase("lab", "cpu-2", "Running")
    fams = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(registry(c, Records(c.store).summary)).decode())
    }
    assert {
        "slurm_controller_up",
        "slurm_nodes",
        "slurm_jobs",
        "hp_nodes",
        "hp_node_launch_failures",
        "hp_node_reboots",
        "hp_node_replacements",
        "hp_health_check_results",
        "hp_health_check_duration_seconds",
        "hp_accounting_healthy",
        "hp_scrape_duration_seconds",
    } <= set(fams)

    def samples(name, **labels):
        return {
            tuple(sorted((k, v) for k, v in s.labels.items() if k != "cluster")): s.value
            for s in fams[name].samples
            if all(s.labels.get(k) == v for k, v in labels.items()) and not s.name.endswith("_created")
        }

    assert sum(samples("slurm_nodes").values()) == 2 and fams["slurm_nodes"].samples[0].labels["cluster"] == "lab"
    assert samples("slurm_jobs") == {
        (("partition", "cpu"), ("state", "running")): 2,
        (("partition", "dev"), ("state", "pending")): 1,
    }
    assert samples("hp_nodes", phase="Running")[(("group", "cpu"), ("phase", "Running"))] == 2
    assert samples("hp_node_reboots")[(("group", "cpu"),)] == 1
    assert samples("hp_accounting_healthy") == {(("reason", ""),): 1}
    w.slurm.up = False  # Slurm does not answer: said so, hp's own still served
    c2 = Cluster(w.env, "lab")
    fams = {
        f.name: f
        for f in text_string_to_metric_families(generate_latest(registry(c2, Records(c2.store).summary)).decode())
    }
    assert fams["slurm_controller_up"].samples[0].value == 0 and fams["hp_nodes"].samples


# -- CLI, logs ------------------------------------------------------------------------------------
def test_token_api_metrics_cli(tmp_path, monkeypatch, capsys):
    import orchestrator.cli.main as cli
    from orchestrator.cli import common

    w = world(tmp_path)
    make(w)
    make(w, "rl", Rest={"Enabled": True})
    monkeypatch.setattr(common, "env", lambda: w.env)
    monkeypatch.setattr("orchestrator.cli.services.env", lambda: w.env)
    monkeypatch.setattr("orchestrator.cli.cluster.env", lambda: w.env)

    def run(*args):
        monkeypatch.setattr("sys.argv", ["hp", *args])
        with pytest.raises(SystemExit) as e:
            cli.main()
        out = capsys.readouterr()
        return e.value.code, out.out, out.err

    code, out, err = run("describe", "lab")
    assert code == 0 and "slurmdbd: Healthy: slurmdbd answers" in out and "rest:" not in out
    w.provider.kill("hp-lab-controller-1")
    assert "slurmdbd: Unhealthy (DaemonDown): the controller's container is exited" in run("describe", "lab")[1]
    assert "rest: not served yet (hp api, hp token)" in run("describe", "rl")[1]
    code, out, err = run("token", "lab")
    assert code == 2 and "has no REST API" in err and out == ""
    assert run("api", "lab")[0] == 2
    code, out, _ = run("token", "rl", "--lifespan", "60")
    assert code == 0 and out.count(".") == 2 and w.slurm.tokens[-1] == ("hpuser", 60)
    assert run("token", "rl", "--lifespan", "0")[0] == 2
    code, out, _ = run("token", "rl", "--json")
    assert code == 0 and json.loads(out)["User"] == "hpuser"
    w.env.store.put("endpoint.rest:rl", "1")  # recorded, but nothing listens: the agent is not serving
    monkeypatch.setattr("orchestrator.waits.time.monotonic", itertools.count(0, 100).__next__)  # 15 s pass at once
    code, _, err = run("api", "rl")
    assert code == 1 and "does not serve its rest endpoint" in err


def test_logs_never_hold_the_jwt_key_or_the_db_password(tmp_path):
    w = world(tmp_path)
    c = make(w, Rest={"Enabled": True})
    key, pw = accounting.jwt_key(c), accounting.db_password(c).encode()
    ctl = w.provider.node("lab", "controller-1")  # slurmdbd's, and MariaDB's
    ctl.files["/var/log/slurm/slurmdbd.log"] = b"connecting with " + pw + b" and " + key + b"\n"
    ctl.logs += f"password {pw.decode()}\n"
    out = tmp_path / "logs"
    doc = export_logs(w.env, "lab", out)
    assert "controller-1/slurmdbd.log" in doc["Files"]
    for f in out.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert pw not in data and key not in data, f
    assert b"<hp: secret removed>" in (out / "controller-1" / "slurmdbd.log").read_bytes()
    doc = json.dumps(describe(w.env, "lab"))
    assert pw.decode() not in doc and "jwt" not in doc.lower()
    assert all(pw.decode() not in e.description for e in w.env.store.events("lab"))
    delete(w.env, "lab")
    assert not (w.home / "clusters" / "lab").exists()


def test_endpoints_serve_on_recorded_ports_and_survive_a_restart(tmp_path, monkeypatch, capsys):
    import socket
    import urllib.request

    import orchestrator.cli.main as cli
    from orchestrator.services.endpoints import Endpoints
    from orchestrator.services.ports import url, wait_url

    w = world(tmp_path)
    c = make(w, Rest={"Enabled": True})
    ep = Endpoints(w.env, "lab", Records(w.env.store).summary)
    ep.start()
    try:
        murl, rurl = wait_url(w.env.store, "lab", "metrics"), wait_url(w.env.store, "lab", "rest")
        assert murl.startswith("http://127.0.0.1:") and murl.endswith("/metrics")
        with urllib.request.urlopen(murl, timeout=5) as r:
            assert b"slurm_nodes{" in r.read()
        port = int(rurl.rsplit(":", 1)[1])
        # a good token, but slurmrestd's container has no address on the cluster's network: 502, said so
        token = jwt.sign(accounting.jwt_key(c), "hpuser", 60)
        status, doc, _ = req(port, "GET", "/slurm/v0.0.42/ping", token)
        assert status == 502 and "no address on network hp-lab" in doc["errors"][0]["error"]
        # slurmrestd is asked at its address on the cluster's network, port 6820 (published nowhere)
        w.provider.node("lab", "slurmrestd").address = "127.0.0.1"
        assert ep.upstream(True) == ("127.0.0.1", accounting.REST_PORT)
        # with registered hosts the overlay is out of reach: an exec in slurmrestd's container relays
        answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
        w.provider.exec_handler = lambda c, cmd: ExecResult(0, answer if cmd == REST_RELAY else "")
        assert ep.tunnel(b"GET /slurm/v0.0.42/ping HTTP/1.1\r\n\r\n") == answer.encode()
        assert ("exec", " ".join(REST_RELAY)) in w.provider.calls
        w.provider.exec_handler = lambda c, cmd: ExecResult(1, "")
        with pytest.raises(ConnectionError, match="slurmrestd does not answer in its container"):
            ep.tunnel(b"GET / HTTP/1.1\r\n\r\n")
        w.provider.exec_handler = None
        monkeypatch.setattr("orchestrator.cli.services.env", lambda: w.env)
        monkeypatch.setattr("sys.argv", ["hp", "api", "lab"])
        with pytest.raises(SystemExit) as e:
            cli.main()
        assert e.value.code == 0 and capsys.readouterr().out.strip() == rurl
        monkeypatch.setattr("sys.argv", ["hp", "metrics", "lab", "--json"])
        with pytest.raises(SystemExit) as e:
            cli.main()
        assert e.value.code == 0 and json.loads(capsys.readouterr().out) == {"ClusterName": "lab", "Url": murl}
    finally:
        ep.close()
    ep = Endpoints(w.env, "lab", Records(w.env.store).summary)  # the agent again: the same URLs
    ep.start()
    ep.close()
    assert (url(w.env.store, "lab", "metrics"), url(w.env.store, "lab", "rest")) == (murl, rurl)
    # the recorded port taken by another program meanwhile: another one, recorded
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may have connections in TIME_WAIT
    blocker.bind(("127.0.0.1", int(murl.split(":")[2].split("/")[0])))
    blocker.listen()
    try:
        ep = Endpoints(w.env, "lab", Records(w.env.store).summary)
        ep.start()
        ep.close()
        assert url(w.env.store, "lab", "metrics") != murl
    finally:
        blocker.close()
    delete(w.env, "lab")
    assert url(w.env.store, "lab", "metrics") is None
