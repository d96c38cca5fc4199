"""Clusters across registered hosts, on fakes (tests/fakes.py multi_world: a
MultiHostProvider over three fake engines): the provider's routing, merged lists and
events, images made present by id, placement (spread, pack, Placement.Hosts, capacity per
host), create across hosts, and what happens when a host is lost and comes back. The
same behaviours run on real Docker-in-Docker hosts in tests/e2e/test_multihost.py."""

from __future__ import annotations

import threading

import pytest
from fakes import FakeProvider, multi_world, service_started, spec_doc, world

from orchestrator.cluster.create import CreateOptions, create
from orchestrator.cluster.delete import delete
from orchestrator.cluster.query import nodes
from orchestrator.cluster.reconciler import GroupReconciler
from orchestrator.core import capacity, placement
from orchestrator.core.context import Cluster
from orchestrator.core.launcher import Launcher
from orchestrator.docker import multihost as mh
from orchestrator.docker.multihost import HostUnavailable, MultiHostProvider
from orchestrator.docker.views import LOCAL_ENGINE, ContainerSpec, Event, ExecResult
from orchestrator.errors import (
    BadInput,
    EngineError,
    EngineUnavailable,
    InsufficientCapacity,
    ObjectMissing,
    OperationFailed,
)
from orchestrator.health.requests.decisions import implicated, interleave_hosts, ring_pairs
from orchestrator.hosts import engines as host_engines
from orchestrator.hosts import hostwatch
from orchestrator.hosts.hostwatch import HostWatch
from orchestrator.recovery import actions
from orchestrator.releases import DEFAULT, RELEASES
from orchestrator.runtime import Runtime
from orchestrator.spec.catalogue import load_catalogue
from orchestrator.spec.model import validate

HOST_RETRY_S = mh.RETRY_S  # the real one (the fixture below zeroes it)


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(actions, "POLL_S", 0.001)
    monkeypatch.setattr(mh, "RETRY_S", 0.0)


def make(w, name="lab", groups=None, **top):
    spec = validate(spec_doc(name, groups or [("cpu", "cpu.nano", 6)], **top), w.env.catalogue)
    return create(w.env, spec, CreateOptions(timeout=5))


def where(w, name="lab"):
    """node -> host of its container."""
    return {
        c.node: h
        for h, e in w.hosts.items()
        if e.up
        for c in (x.view() for x in e.containers_.values())
        if c.labels.get("io.hp.cluster") == name and c.node and c.role != "check"
    }


# -- the provider -----------------------------------------------------------------------
def spec(name, host="", image="img:1", **kw):
    return ContainerSpec(name=name, image=image, labels={"io.hp.managed": "1", "io.hp.cluster": "c"}, host=host, **kw)


def two():
    src = FakeProvider()
    src.images["img:1"] = "sha256:one"
    a, b = FakeProvider(name="a"), FakeProvider(name="b")
    return MultiHostProvider({"a": a, "b": b}, src), a, b, src


def test_routing_by_placement_and_by_container():
    p, a, b, _ = two()
    cid = p.create_container(spec("x", host="b"))
    assert b.containers_ and not a.containers_  # made where it was placed
    p.start(cid)
    assert b._get(cid).state == "running"
    assert p.inspect("x").host == "b" and p.exec("x", ["true"]).exit_code == 0
    # a check container goes to its node's host (network_of)
    p.create_container(spec("x-check", network_of=cid))
    assert len(b.containers_) == 2
    # lists are the union, each view naming its host
    p.create_container(spec("y", host="a"))
    assert sorted((c.name, c.host) for c in p.containers()) == [("x", "b"), ("x-check", "b"), ("y", "a")]
    with pytest.raises(ObjectMissing):
        p.inspect("nothing")
    p.remove_container("nothing")  # no error
    with pytest.raises(Exception, match="no registered host named 'zz'"):
        p.create_container(spec("z", host="zz"))


def test_images_come_by_id_from_the_local_engine_once_per_host():
    p, a, b, src = two()
    assert p.missing_images(["img:1"]) == {"a": ["img:1"], "b": ["img:1"]}
    said = []
    p.prepare_images(["img:1"], said.append)
    assert a.images["img:1"] == b.images["img:1"] == "sha256:one"
    assert p.missing_images(["img:1"]) == {}
    src.images["img:1"] = "sha256:rebuilt"  # a moved tag is streamed again
    assert p.missing_images(["img:1"]) == {"a": ["img:1"], "b": ["img:1"]}
    assert any("streaming img:1" in s for s in said)
    with pytest.raises(ObjectMissing, match="not built on the local engine"):
        p.missing_images(["nope:1"])


def test_a_container_placed_on_a_host_without_its_image_brings_it():
    p, a, _, _ = two()
    p.create_container(spec("x", host="a"))
    assert a.images["img:1"] == "sha256:one"


def test_registry_pull_when_named(monkeypatch):
    p, a, b, _ = two()
    p.registry = "reg.example:5000"
    pulled = []

    def pull(repo, tag, e=a):
        pulled.append((e.name, repo, tag))
        e.images[f"{repo}:{tag}"] = "sha256:one"

    a.pull = pull
    b.pull = lambda repo, tag: pull(repo, tag, b)
    p.prepare_images(["img:1"], lambda s: None)
    assert pulled == [("a", "reg.example:5000/img", "1"), ("b", "reg.example:5000/img", "1")]
    assert a.images["img:1"] == "sha256:one"  # tagged as hp names it


def test_a_host_that_does_not_answer_is_skipped_and_named():
    p, a, b, _ = two()
    cid = p.create_container(spec("x", host="b"))
    p.create_container(spec("y", host="a"))
    b.up = False
    assert [c.name for c in p.containers()] == ["y"]
    assert "b" in p.unreachable()
    with pytest.raises(HostUnavailable, match="host b does not answer"):
        p.start(cid)
    with pytest.raises(EngineUnavailable):
        p.create_container(spec("z", host="b"))
    b.up = True
    assert p.check() == {}
    assert sorted(c.name for c in p.containers()) == ["x", "y"]
    a.up = b.up = False
    with pytest.raises(EngineUnavailable, match="no registered host answers"):
        p.ping()


def test_a_name_on_two_hosts_resolves_to_the_running_one():
    p, a, b, _ = two()
    old = p.create_container(spec("n", host="a"))
    new = p.create_container(spec("n", host="b"))
    p.start(new)
    p2 = MultiHostProvider({"a": a, "b": b}, p.source)  # a fresh process knows nothing yet
    assert p2.inspect("n").id == new
    assert p2.inspect(old).host == "a"


def test_events_are_merged_from_every_host():
    p, a, b, _ = two()
    a.events_ = [Event("die", "1", {"io.hp.managed": "1", "io.hp.cluster": "c"}, 1.0, 137, "a")]
    b.events_ = [Event("start", "2", {"io.hp.managed": "1", "io.hp.cluster": "c"}, 2.0, None, "b")]
    s = p.events("c")
    got = []

    def read():
        for ev in s:
            got.append((ev.action, ev.host))
            if len(got) == 2:
                break

    t = threading.Thread(target=read)
    t.start()
    t.join(3)
    s.close()
    assert sorted(got) == [("die", "a"), ("start", "b")]


# -- placement ---------------------------------------------------------------------------
CAT = load_catalogue()


def pools(n=3, cpus=8.0, mem=16384):
    return {f"h{i}": capacity.Pool(cpus, mem, []) for i in range(1, n + 1)}


def group(doc_groups, i=2, **placement_):
    doc = spec_doc("lab", doc_groups)
    if placement_:
        doc["InstanceGroups"][i]["Placement"] = placement_
    return validate(doc, CAT).InstanceGroups[i]


def test_spread_and_pack():
    load = placement.loads(pools(), [], CAT, "lab")
    g = group([("cpu", "cpu.nano", 6)])
    got = []
    for _ in range(6):
        h, _ = placement.place(CAT["cpu.nano"], g, ["h1", "h2", "h3"], load, {})
        load[h] = load[h].plus(CAT["cpu.nano"], [], g.InstanceGroupName)
        got.append(h)
    assert sorted(got) == ["h1", "h1", "h2", "h2", "h3", "h3"]
    packed = group([("cpu", "cpu.nano", 2)], Strategy="pack", Hosts=["h3", "h2"])
    load = placement.loads(pools(), [], CAT, "lab")
    assert placement.place(CAT["cpu.nano"], packed, ["h1", "h2", "h3"], load, {})[0] == "h3"
    ctl = validate(spec_doc("lab"), CAT).InstanceGroups[0]
    assert placement.strategy_of(ctl) == "pack" and placement.strategy_of(g) == "spread"


def test_insufficient_capacity_says_per_host_what_is_missing():
    load = placement.loads(pools(cpus=0.5), [], CAT, "lab")
    del load["h3"]
    g = group([("cpu", "cpu.large", 1)])
    with pytest.raises(InsufficientCapacity) as ei:
        placement.place(CAT["cpu.large"], g, ["h1", "h2", "h3"], load, {"h3": "unreachable (gone)"})
    msg = str(ei.value)
    assert "on any host" in msg and "h1: needs" in msg and "h2: needs" in msg and "h3: unreachable (gone)" in msg
    # one engine: the message of one host, as before
    one = {"": placement.HostLoad(capacity.Pool(0.5, 16384, []), capacity.usage([], CAT))}
    with pytest.raises(
        InsufficientCapacity, match=r"^InsufficientCapacity: no capacity for instance type cpu.large: needs"
    ):
        placement.place(CAT["cpu.large"], g, [""], one, {})


def test_placement_hosts_are_validated():
    doc = spec_doc("lab")
    doc["InstanceGroups"][2]["Placement"] = {"Hosts": ["h1", "h1", "bad_name"], "Strategy": "wide"}
    with pytest.raises(BadInput) as ei:
        validate(doc, CAT)
    text = str(ei.value)
    assert "named twice" in text and "bad_name" in text and "Strategy" in text


# -- a cluster across hosts ------------------------------------------------------------------
def test_create_spreads_compute_and_keeps_controller_login_and_home_on_the_first_host(tmp_path):
    w = multi_world(tmp_path)
    make(w)
    got = where(w)
    assert got["controller-1"] == got["login-1"] == "h1"
    assert sorted(v for n, v in got.items() if n.startswith("cpu")) == ["h1", "h1", "h2", "h2", "h3", "h3"]
    assert w.env.store.node_hosts("lab") == got
    fs = w.hosts["h1"]._get("hp-lab-home")
    assert fs.state == "running" and fs.spec.volumes == {"hp-lab-home": "/export"}
    assert "hp-lab-home" in w.hosts["h1"].volumes_ and "hp-lab-slurmctld" in w.hosts["h1"].volumes_
    net = w.hosts["h1"].networks_["hp-lab"]
    assert net.driver == "overlay"
    worker = w.node("lab", "cpu-1").spec
    assert worker.image.startswith("hp-node-mh:") and worker.volumes == {}
    assert worker.environment["HP_HOME_SERVER"] == "hp-lab-home" and worker.environment["HP_ROLE"] == "worker"
    assert "/dev/fuse:/dev/fuse:rwm" in worker.devices and "SYS_ADMIN" in worker.cap_add
    assert worker.labels["io.hp.host"] == w.host_of("lab", "cpu-1")
    assert w.node("lab", "login-1").spec.environment["HP_ROLE"] == "login"
    rows = {n["SlurmNodeName"]: n["Host"] for n in nodes(w.env, "lab")["ClusterNodeSummaries"]}
    assert rows == got
    # images went to every host, by id
    assert all(e.images.get(w.env.images(DEFAULT).refs()["worker"]) for e in w.hosts.values())


def test_create_refuses_unknown_hosts_and_encryption_without_hosts(tmp_path):
    w = multi_world(tmp_path)
    doc = spec_doc("lab")
    doc["InstanceGroups"][2]["Placement"] = {"Hosts": ["h9"]}
    with pytest.raises(BadInput, match=r"unknown host\(s\) h9 \(registered: h1, h2, h3\)"):
        create(w.env, validate(doc, w.env.catalogue), CreateOptions(timeout=5))
    assert w.env.store.cluster("lab") is None and not w.provider.containers()
    one = world(tmp_path / "one")
    with pytest.raises(BadInput, match="no host is registered"):
        create(one.env, validate(doc, one.env.catalogue), CreateOptions(timeout=5))
    with pytest.raises(BadInput, match="encrypt-network"):
        create(one.env, validate(spec_doc("lab"), one.env.catalogue), CreateOptions(encrypt_network=True))


def test_an_encrypted_network_that_carries_nothing_fails_the_create(tmp_path):
    w = multi_world(tmp_path)
    for e in w.hosts.values():
        e.run_handler = lambda spec: (
            __import__("orchestrator.docker.views", fromlist=["ExecResult"]).ExecResult(1, "100% packet loss")
            if spec.command and spec.command[0] == "ping"
            else ExecResult(0, __import__("fakes").probe_output())
        )
    spec_ = validate(spec_doc("lab"), w.env.catalogue)
    with pytest.raises(OperationFailed, match="carries no traffic from h2, h3 to h1"):
        create(w.env, spec_, CreateOptions(timeout=5, encrypt_network=True))
    assert w.hosts["h1"].overlay_options["encrypted"] is True
    assert not w.provider.containers("lab") and not w.provider.networks("lab")  # rolled back


def test_capacity_pool_of_a_type_is_the_sum_over_hosts(tmp_path):
    w = multi_world(tmp_path, cpus=1)  # 4 CPU (overcommit 4x) per host
    spec_ = validate(spec_doc("lab", [("cpu", "cpu.large", 13)]), w.env.catalogue)  # 4 per host fit, 12 in all
    with pytest.raises(BadInput, match=r"more than the hosts can ever run: \d+ \(h1: "):
        create(w.env, spec_, CreateOptions(timeout=5))


def test_delete_leaves_nothing_on_any_host(tmp_path):
    w = multi_world(tmp_path)
    make(w)
    delete(w.env, "lab")
    for e in w.hosts.values():
        assert not e.containers("lab") and not e.networks("lab") and not e.volumes("lab")


# -- a host is lost -----------------------------------------------------------------------------
def lose(w, host, monkeypatch):
    monkeypatch.setattr(hostwatch, "LOST_AFTER_S", 0.0)
    w.hosts[host].up = False


def run_watch(w, replaced=None):
    """One poll of a host watch on a runtime of its own (keys "node:<name>" on its workers),
    and what it offered done."""
    hw = HostWatch(w.env, "lab", replace=None if replaced is None else replaced)
    hw.keys = ()  # the polls are the test's
    rt = Runtime(w.env.store, "lab")
    rt.add(hw)
    rt.start()
    hw.poll()
    assert rt.idle(hw.kind, 10)
    rt.shutdown()  # the later polls run nothing in the background
    return hw


def test_nodes_of_a_lost_host_are_replaced_on_the_others_under_their_names(tmp_path, monkeypatch):
    w = multi_world(tmp_path)
    make(w)
    on3 = sorted(n for n, h in where(w).items() if h == "h3")
    assert on3
    lose(w, "h3", monkeypatch)
    hw = run_watch(w)
    got = where(w)
    assert all(got[n] in ("h1", "h2") for n in on3)
    ph = w.env.store.latest_phases("lab")
    assert all(ph[n].phase == "Running" for n in on3)
    assert all(w.env.store.node_hosts("lab")[n] != "h3" for n in on3)
    evs = [e.description for e in w.env.store.events("lab")]
    assert any(f"Instance {on3[0]} in cluster lab is lost with its host h3" in e for e in evs)
    # host 3 comes back: its stale copies are removed before anything starts them
    w.hosts["h3"].up = True
    hw.poll()
    assert not [c for c in w.hosts["h3"].containers_.values() if c.spec.labels.get("io.hp.node") in on3]
    assert any("stale copy on host h3 was removed" in e.description for e in w.env.store.events("lab"))


def test_without_automatic_recovery_lost_nodes_are_marked_and_come_back_with_their_host(tmp_path, monkeypatch):
    w = multi_world(tmp_path)
    make(w, NodeRecovery="None")
    on3 = sorted(n for n, h in where(w).items() if h == "h3")
    lose(w, "h3", monkeypatch)
    hw = run_watch(w)
    ph = w.env.store.latest_phases("lab")
    assert all(ph[n].phase == "Running" and "its host h3 does not answer" in ph[n].message for n in on3)
    rows = {n["SlurmNodeName"]: n for n in nodes(w.env, "lab")["ClusterNodeSummaries"]}
    assert rows[on3[0]]["InstanceStatus"]["Status"] == "Failure" and rows[on3[0]]["Host"] == "h3"
    # the reconciler does not launch them elsewhere: they are not missing
    c = Cluster(w.env, "lab")
    rec = GroupReconciler(
        c, "cpu", Launcher(c, w.env.images(DEFAULT).refs(w.env.node_image_defs())), clock=lambda: 1e11
    )
    rec.step({n.name: n for n in w.slurm.nodes()})
    assert sorted(n for n, h in where(w).items() if n.startswith("cpu")) == sorted(
        n for n in where(w) if n.startswith("cpu")
    )
    assert len([n for n in where(w) if n.startswith("cpu")]) == 4  # h3's two are not made again
    # back: killed with the host, they are started again
    for x in w.hosts["h3"].containers_.values():
        x.state = "exited"
    w.hosts["h3"].up = True
    hw.poll()
    assert all(w.hosts["h3"].node("lab", n).state == "running" for n in on3)


def test_losing_the_controllers_host_makes_the_cluster_degraded_until_it_returns(tmp_path, monkeypatch):
    w = multi_world(tmp_path)
    make(w)
    lose(w, "h1", monkeypatch)
    replaced = []
    hw = run_watch(w, replaced=lambda *a: replaced.append(a) or True)
    row = w.env.store.cluster("lab")
    assert row.status == "Degraded" and "the controller's host h1 does not answer" in row.message
    assert "one controller per cluster" in row.message and replaced == []
    for x in w.hosts["h1"].containers_.values():
        x.state = "exited"
    w.hosts["h1"].up = True
    hw.poll()
    assert w.hosts["h1"].node("lab", "controller-1").state == "running"
    assert w.hosts["h1"]._get("hp-lab-home").state == "running"
    assert w.env.store.cluster("lab").status == "InService"


def test_stale_copies_are_invisible_to_recovery_and_provisioning(tmp_path):
    w = multi_world(tmp_path)
    make(w)
    n = next(n for n, h in where(w).items() if h == "h3")
    stale = w.hosts["h3"].node("lab", n)
    w.env.store.set_node_host("lab", n, "h2")  # as after a replacement on h2
    w.hosts["h2"].images.update(w.source.images)
    w.hosts["h2"].create_container(stale.spec)
    c = Cluster(w.env, "lab")
    assert c.node_containers()[n].host == "h2"


def test_a_replacement_that_finds_no_capacity_keeps_retrying(tmp_path, monkeypatch):
    w = multi_world(tmp_path, cpus=1)
    make(w, groups=[("cpu", "cpu.nano", 6)], NodeProvisioningMode="Continuous")
    capacity.set_limit(w.env.store, "cpu.nano", 5)  # login + 4: after the loss, 2 cannot be placed
    on3 = sorted(n for n, h in where(w).items() if h == "h3")
    lose(w, "h3", monkeypatch)
    run_watch(w)
    ph = w.env.store.latest_phases("lab")
    failed = [n for n in on3 if ph[n].phase == "LaunchFailed"]
    assert failed and all("InsufficientCapacity" in ph[n].message for n in failed)
    capacity.set_limit(w.env.store, "cpu.nano", None)
    c = Cluster(w.env, "lab")
    rec = GroupReconciler(
        c, "cpu", Launcher(c, w.env.images(DEFAULT).refs(w.env.node_image_defs())), clock=lambda: 1e11
    )
    for _ in range(4):
        rec.step({n.name: n for n in w.slurm.nodes()})
    got = where(w)
    assert all(got.get(n) in ("h1", "h2") for n in on3)


# -- InstanceConnectivity across hosts --------------------------------------------------------
def test_ring_neighbours_are_on_different_hosts_and_a_cut_host_implicates_only_its_nodes():
    nodes_ = [("a1", "h1"), ("a2", "h1"), ("b1", "h2"), ("b2", "h2"), ("c1", "h3"), ("c2", "h3")]
    order = interleave_hosts(nodes_)
    assert order == ["a1", "b1", "c1", "a2", "b2", "c2"]
    pairs = ring_pairs(order)
    ok = {p: not ({"c1", "c2"} & set(p)) for p in pairs}
    assert implicated(order, ok) == {"c1", "c2"}
    assert interleave_hosts([("x", ""), ("y", "")]) == ["x", "y"]  # one engine: as before


def test_host_watch_does_nothing_on_one_engine(tmp_path):
    w = world(tmp_path)
    create(w.env, validate(spec_doc("lab"), w.env.catalogue), CreateOptions(timeout=5))
    HostWatch(w.env, "lab").poll()
    assert w.env.store.cluster("lab").status == "InService"
    assert Cluster(w.env, "lab").lost_nodes() == {} and Cluster(w.env, "lab").placements() == {}


# -- the registry and the swarm ---------------------------------------------------------------
class SwarmEngine(FakeProvider):
    """A fake engine with a swarm side, shared by URL (the registry makes new handles)."""

    swarm: dict = {}

    def __init__(self, url, arch="x86_64", joinable=True):
        super().__init__(name=url.rsplit("/", 1)[-1])
        # the machine's own name (the swarm's); `name` becomes the registered host's once
        # the registry makes a handle for it, as a real engine reports it on its containers
        self.url, self.joinable, self.machine = url, joinable, self.name
        self.info_ = __import__("dataclasses").replace(self.info_, arch=arch, name=self.machine)

    def info(self, refresh=False):
        self._check()
        st = SwarmEngine.swarm
        me = st.get("nodes", {}).get(self.machine)
        return __import__("dataclasses").replace(
            self.info_,
            swarm_state="active" if me else "inactive",
            swarm_node_id=me["id"] if me else "",
            swarm_manager=bool(me and me["role"] == "manager"),
            swarm_addr=f"10.0.0.{len(self.machine)}" if me else "",
        )

    def swarm_init(self, advertise):
        SwarmEngine.swarm = {"nodes": {self.machine: {"id": f"id-{self.machine}", "role": "manager"}}}

    def swarm_join(self, managers, token, advertise):
        if not self.joinable:
            raise __import__("orchestrator.errors", fromlist=["EngineError"]).EngineError("join refused", 500)
        SwarmEngine.swarm["nodes"][self.machine] = {"id": f"id-{self.machine}", "role": "worker"}

    def swarm_leave(self):
        SwarmEngine.swarm.get("nodes", {}).pop(self.machine, None)

    def swarm_tokens(self):
        return {"Worker": "tok-w", "Manager": "tok-m"}

    def swarm_nodes(self):
        return [
            {"id": n["id"], "hostname": h, "role": n["role"], "state": "ready", "addr": "", "availability": "active"}
            for h, n in SwarmEngine.swarm.get("nodes", {}).items()
        ]

    def swarm_set_role(self, node_id, role):
        for n in SwarmEngine.swarm["nodes"].values():
            if n["id"] == node_id:
                n["role"] = role

    def swarm_remove_node(self, node_id):
        pass


@pytest.fixture
def fleet(monkeypatch, tmp_path):
    from orchestrator.docker import engine as engine_mod
    from orchestrator.state.store import Store

    SwarmEngine.swarm = {}
    engines = {
        "unix:///h/1": SwarmEngine("unix:///h/1"),
        "unix:///h/2": SwarmEngine("unix:///h/2"),
        "unix:///h/3": SwarmEngine("unix:///h/3"),
        "unix:///h/arm": SwarmEngine("unix:///h/arm", arch="aarch64"),
        "unix:///h/nojoin": SwarmEngine("unix:///h/nojoin", joinable=False),
        "unix:///h/dead": SwarmEngine("unix:///h/dead"),
    }
    engines["unix:///h/dead"].up = False
    local = FakeProvider()
    local.images[RELEASES[DEFAULT].pulled_base] = "sha256:base"

    def factory(url=None, *a, name=None, **k):
        if url and name:
            engines[url].name = name
        return engines[url] if url else local

    monkeypatch.setattr(engine_mod, "DockerEngine", factory)
    return Store(tmp_path / "home"), engines


def test_hosts_form_a_swarm_with_an_odd_number_of_managers(fleet):
    from orchestrator.hosts import registry

    store, _ = fleet
    registry.add(store, "h1", "unix:///h/1")
    assert registry.swarm_mode(store) == "created"
    registry.add(store, "h2", "unix:///h/2", cpus=8, memory_mib=8192)
    roles = {h: n["role"] for h, n in SwarmEngine.swarm["nodes"].items()}
    assert roles == {"1": "manager", "2": "worker"}  # two managers would lose quorum with either
    registry.add(store, "h3", "unix:///h/3")
    roles = {h: n["role"] for h, n in SwarmEngine.swarm["nodes"].items()}
    assert roles == {"1": "manager", "2": "manager", "3": "manager"}
    assert [r.name for r in store.hosts()] == ["h1", "h2", "h3"] and store.hosts()[1].opt("cpus") == 8
    doc = registry.listing(store)
    import json
    from pathlib import Path

    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "hosts-list.schema.json").read_text())
    jsonschema.validate(json.loads(json.dumps(doc)), schema)  # what hp hosts list --json prints
    assert [h["SwarmRole"] for h in doc["Hosts"]] == ["manager"] * 3 and all(h["Reachable"] for h in doc["Hosts"])
    assert doc["Hosts"][1]["Cpus"] == 8  # the override
    p = host_engines.provider_for(store)
    assert isinstance(p, MultiHostProvider) and list(p.engines()) == ["h1", "h2", "h3"]


def test_bad_hosts_are_refused_with_nothing_recorded(fleet):
    from orchestrator.hosts import registry

    store, _ = fleet
    registry.add(store, "h1", "unix:///h/1")
    with pytest.raises(EngineUnavailable, match="cannot reach the Docker engine of host hx at unix:///h/dead"):
        registry.add(store, "hx", "unix:///h/dead")
    with pytest.raises(BadInput, match="host arm is aarch64, h1 is x86_64"):
        registry.add(store, "arm", "unix:///h/arm")
    with pytest.raises(OperationFailed, match="cannot join the swarm of h1: join refused"):
        registry.add(store, "nj", "unix:///h/nojoin")
    assert "nojoin" not in SwarmEngine.swarm["nodes"]
    with pytest.raises(BadInput) as ei:
        registry.add(store, "bad_name", "http://x", cpus=0)
    assert len(ei.value.problems) == 3
    with pytest.raises(BadInput, match="already registered"):
        registry.add(store, "h1", "unix:///h/2")
    assert [r.name for r in store.hosts()] == ["h1"]


def test_removing_a_host_is_refused_while_a_controller_or_nodes_live_there(fleet, tmp_path):
    from orchestrator.core.context import Env
    from orchestrator.hosts import registry

    store, engines = fleet
    registry.add(store, "h1", "unix:///h/1")
    registry.add(store, "h2", "unix:///h/2")
    registry.add(store, "h3", "unix:///h/3")
    w = multi_world(tmp_path / "w")
    env = Env(
        provider=host_engines.provider_for(store), store=store, slurm_factory=lambda p, c: w.slurm, agents=w.agents
    )
    for e in engines.values():
        e.on_start.append(w.slurm.register)
        e.on_start.append(service_started(e))
    env.images(DEFAULT).build(env.node_image_defs(), log=lambda s: None)
    spec_ = validate(spec_doc("lab", [("cpu", "cpu.nano", 3)]), env.catalogue)
    create(env, spec_, CreateOptions(timeout=5))
    with pytest.raises(BadInput, match="holds the controller of cluster"):
        registry.remove(env, "h1")
    with pytest.raises(BadInput, match=r"host h3 holds 1 node\(s\) \(lab/cpu-"):
        registry.remove(env, "h3")
    doc = registry.remove(env, "h3", drain=True)
    assert len(doc["Moved"]) == 1 and [r.name for r in store.hosts()] == ["h1", "h2"]
    assert "3" not in SwarmEngine.swarm["nodes"]
    moved = doc["Moved"][0].split("/")[1]
    assert store.node_hosts("lab")[moved] in ("h1", "h2")


def test_overlay_mtu_and_hosts_registered(tmp_path, monkeypatch):
    from orchestrator.hosts import registry
    from orchestrator.state.home import hosts_registered
    from orchestrator.state.store import HostRow, Store

    rows = [HostRow("a", "unix:///a", {"mtu": 1400}, 1, 0.0), HostRow("b", "unix:///b", {}, 2, 0.0)]
    monkeypatch.delenv("HP_OVERLAY_MTU", raising=False)
    assert host_engines.overlay_mtu(rows) == 1350  # VXLAN's 50 bytes below the smallest NIC
    assert host_engines.overlay_mtu(rows[1:]) is None
    monkeypatch.setenv("HP_OVERLAY_MTU", "1300")
    assert host_engines.overlay_mtu(rows) == 1300
    assert [registry.managers_wanted(n) for n in range(1, 6)] == [1, 1, 3, 3, 3]
    assert not hosts_registered(tmp_path / "none")  # reads, makes nothing
    assert not (tmp_path / "none").exists()
    st = Store(tmp_path / "h")
    assert not hosts_registered(tmp_path / "h")
    st.add_host("a", "unix:///a", {})
    assert hosts_registered(tmp_path / "h")


def test_scaling_bound_is_the_sum_over_hosts(tmp_path):
    from orchestrator.cluster.scaling import scale

    w = multi_world(tmp_path, cpus=1)  # cpu.large: 4 per host
    make(w, groups=[("cpu", "cpu.large", 3)])
    with pytest.raises(BadInput, match=r"more than the hosts can ever run: 12 \(h1: 4"):
        scale(w.env, "lab", "cpu", 13)


@pytest.mark.parametrize("moved", [False, True], ids=["phase", "phase-and-host"])
def test_hp_nodes_lists_a_lost_node_while_the_watcher_records_its_replacement(tmp_path, monkeypatch, moved):
    """The view judges every node from one reading of the phases and placements, read
    in the reverse of the replacement's writing order: a node read as Running whose host
    is gone, and recorded Replacing (and placed on another host, its container not made
    yet) by the watcher while the containers are listed, is still listed as lost."""
    w = multi_world(tmp_path)
    make(w)
    on3 = sorted(n for n, h in where(w).items() if h == "h3")
    assert on3
    w.hosts["h3"].up = False
    real = Cluster.node_containers

    def listing_then_recorded(self):
        got = real(self)
        for n in on3:  # the host watcher records the replacement meanwhile
            w.env.store.set_phase("lab", n, "Replacing", "replacing: its host h3 does not answer")
            if moved:
                w.env.store.set_node_host("lab", n, "h1")
        return got

    monkeypatch.setattr(Cluster, "node_containers", listing_then_recorded)
    rows = {n["SlurmNodeName"]: n for n in nodes(w.env, "lab")["ClusterNodeSummaries"]}
    assert all(n in rows and rows[n]["Host"] == "h3" for n in on3), sorted(rows)
    assert {rows[n]["InstanceStatus"]["Status"] for n in on3} == {"Failure"}


@pytest.mark.parametrize("moved", [False, True], ids=["phase", "phase-and-host"])
def test_the_reconciler_does_not_launch_a_lost_node_recorded_replacing_during_its_pass(tmp_path, monkeypatch, moved):
    """The reconciler judges a pass from its one snapshot: a node read as Running whose
    host is gone, recorded Replacing by the host watcher while the containers are listed,
    is not taken for missing (launching it too would make a second copy on another host)."""
    w = multi_world(tmp_path)
    make(w)
    on3 = sorted(n for n, h in where(w).items() if h == "h3" and n.startswith("cpu"))
    assert on3
    w.hosts["h3"].up = False
    c = Cluster(w.env, "lab")
    real = c.p.containers

    once = []

    def listing_then_recorded(*a, **kw):
        got = real(*a, **kw)
        if not once:  # the host watcher records the replacement meanwhile
            once.append(1)
            for n in on3:
                w.env.store.set_phase("lab", n, "Replacing", "replacing: its host h3 does not answer")
                if moved:
                    w.env.store.set_node_host("lab", n, "h1")
        return got

    monkeypatch.setattr(c.p, "containers", listing_then_recorded)
    rec = GroupReconciler(
        c, "cpu", Launcher(c, w.env.images(DEFAULT).refs(w.env.node_image_defs())), clock=lambda: 1e11
    )
    rec.step({n.name: n for n in w.slurm.nodes()})
    assert not [n for n, h in where(w).items() if n in on3], where(w)  # none launched elsewhere
    assert {w.env.store.latest_phases("lab")[n].phase for n in on3} == {"Replacing"}  # left to the watcher


# -- a host that does not answer costs a command at most HP_HOST_PING_TIMEOUT ------------------
@pytest.fixture
def silent_engine(tmp_path):
    """A real DockerEngine on a unix socket that accepts connections and never answers
    (a frozen engine; the kernel queues the connection), and how many it accepted."""
    import socket

    from orchestrator.docker.engine import DockerEngine

    path = tmp_path / "silent.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen(64)
    yield DockerEngine(f"unix://{path}", name="silent", answer_timeout=0.5)  # as engines.engine_for makes them
    s.close()


def test_a_host_that_accepts_and_never_answers_costs_one_ping_timeout(silent_engine, monkeypatch):
    import time

    monkeypatch.setattr(mh, "PING_TIMEOUT_S", 0.5)
    monkeypatch.setattr(mh, "RETRY_S", 30.0)
    a = FakeProvider(name="a")
    a.images["img:1"] = "sha256:one"
    a.create_container(spec("y"))
    p = MultiHostProvider({"a": a, "b": silent_engine}, FakeProvider())
    t0 = time.monotonic()
    assert [c.name for c in p.containers()] == ["y"]  # docker-py alone would wait 60 s on b
    p.networks()
    p.volumes()
    with pytest.raises(HostUnavailable, match="host b does not answer: .*server API version"):
        p.engine("b") and p._call("b", lambda e: e.containers())
    took = time.monotonic() - t0
    assert took < 1.5, took  # one ping of b, at the first call; none after
    assert list(p.unreachable()) == ["b"]


def test_a_command_slowed_by_its_machine_still_pays_one_ping_timeout(silent_engine, monkeypatch):
    """Clean-clone runs of 2026-12-07: hp nodes / describe took the floor + two ping timeouts
    with a host just killed, on a machine busy enough that the command outlived the old 1 s
    retry (second ping)."""
    import time

    monkeypatch.setattr(mh, "PING_TIMEOUT_S", 0.5)
    monkeypatch.setattr(mh, "RETRY_S", HOST_RETRY_S)
    now = [0.0]
    a = FakeProvider(name="a")
    a.images["img:1"] = "sha256:one"
    a.create_container(spec("y"))
    p = MultiHostProvider({"a": a, "b": silent_engine}, FakeProvider(), clock=lambda: now[0])
    t0 = time.monotonic()
    assert [c.name for c in p.containers()] == ["y"]
    now[0] += 5.0  # the rest of the command, on a loaded machine
    assert [c.name for c in p.containers()] == ["y"]
    p.networks()
    took = time.monotonic() - t0
    assert took < 0.9, took  # one ping of b
    assert list(p.unreachable()) == ["b"]


def test_a_host_the_watcher_recorded_lost_is_not_even_pinged(tmp_path, monkeypatch):
    from orchestrator.state.store import Store

    store = Store(tmp_path / "home")
    store.add_host("h1", "unix:///nowhere/1.sock", {})
    store.add_host("h2", "unix:///nowhere/2.sock", {})
    host_engines.record_lost(store, "h2", "connection refused", since=100.0, now=1000.0)
    rows = store.hosts()
    assert host_engines.lost_hosts(rows, now=1005.0) == {
        "h2": "connection refused (lost since 1970-01-01T00:01:40.000Z)"
    }
    assert host_engines.lost_hosts(rows, now=1000.0 + host_engines.LOST_TRUST_S) == {}  # a stale record: pinged again
    host_engines.record_lost(store, "nohost", "x")  # a host removed meanwhile: nothing to record
    a, b = FakeProvider(name="a"), FakeProvider(name="b")
    calls = []
    b.ping = lambda timeout=None: calls.append("ping")  # type: ignore[method-assign]
    p = MultiHostProvider({"h1": a, "h2": b}, FakeProvider(), lost={"h2": "connection refused"})
    p.containers()
    assert calls == [] and p.unreachable() == {"h2": "connection refused"}
    assert p.check() == {} and calls == ["ping"]  # the watcher's own check pings every host


def test_the_watcher_records_a_lost_host_while_it_is_lost(tmp_path, monkeypatch):

    w = multi_world(tmp_path)
    for h in w.hosts:
        w.env.store.add_host(h, f"unix:///{h}.sock", {})
    make(w)
    lose(w, "h3", monkeypatch)
    hw = run_watch(w)
    rows = w.env.store.hosts()
    assert set(host_engines.lost_hosts(rows)) == {"h3"}
    w.hosts["h3"].up = True
    hw.poll()
    assert host_engines.lost_hosts(w.env.store.hosts()) == {}
    assert all(r.opt(host_engines.LOST_KEY) is None for r in w.env.store.hosts())


def test_hp_nodes_and_describe_name_the_unreachable_host(tmp_path, monkeypatch):
    from orchestrator.cluster.describe import describe
    from orchestrator.cluster.exec import exec_target

    w = multi_world(tmp_path)
    make(w)
    on3 = sorted(n for n, h in where(w).items() if h == "h3")
    w.hosts["h3"].up = False
    w.env.provider.check()
    doc = nodes(w.env, "lab")
    assert set(doc["UnreachableHosts"]) == {"h3"}
    assert set(describe(w.env, "lab")["UnreachableHosts"]) == {"h3"}
    with pytest.raises(OperationFailed, match=f"node {on3[0]} of cluster 'lab' is on host h3, which is unreachable"):
        exec_target(w.env, "lab", on3[0])


# -- a host that cannot run the nodes ------------------------------------------------------------
NO_FUSE = 'start hp-probe: error gathering device information while adding custom device "/dev/fuse": no such file'


def no_fuse(spec):
    if spec.labels.get("io.hp.role") == "probe":
        raise EngineError(NO_FUSE, 500)
    return ExecResult(0, "")


def test_the_probe_names_each_need_and_its_fix():
    from orchestrator.core import hostprobe

    e = FakeProvider()
    e.images["base:1"] = "sha256:b"
    e.run_handler = no_fuse
    (p,) = hostprobe.problems(e, "base:1", None)
    assert "cannot hand containers /dev/fuse" in p and "modprobe fuse" in p and "--device /dev/fuse" in p
    s = e.runs[-1]
    assert s.devices == ["/dev/fuse:/dev/fuse:rwm"] and s.cap_add == ["SYS_ADMIN"] and s.network == "host"
    for code, out, want in (
        (0, "ok", None),
        (3, "/dev/fuse is not a character device in the container", "modprobe fuse"),
        (4, "mount: permission denied", "cannot mount there (mount: permission denied)"),
        (5, "no TCP connection to the swarm manager 10.0.0.1:2377", "open TCP 2377 and 7946"),
        (9, "odd", "the probe container exited 9: odd"),
    ):
        e.run_handler = lambda spec, code=code, out=out: ExecResult(code, out)
        got = hostprobe.problems(e, "base:1", "10.0.0.1")
        assert (got == []) if want is None else (want in got[0]), (code, got)
    assert e.runs[-1].environment == {"HP_MANAGER": "10.0.0.1", "HP_PORTS": "2377 7946"}
    e.run_handler = lambda spec: (_ for _ in ()).throw(EngineError("boom"))
    assert hostprobe.problems(e, "base:1", None) == ["a probe container does not run there (boom)"]


def test_hosts_add_refuses_a_host_without_dev_fuse_with_nothing_recorded(fleet):
    from orchestrator.hosts import registry

    store, engines = fleet
    registry.add(store, "h1", "unix:///h/1")
    engines["unix:///h/2"].run_handler = no_fuse
    with pytest.raises(BadInput, match="host h2 cannot run hp's nodes: its engine cannot hand containers /dev/fuse"):
        registry.add(store, "h2", "unix:///h/2")
    assert [r.name for r in store.hosts()] == ["h1"] and "2" not in SwarmEngine.swarm["nodes"]
    assert engines["unix:///h/2"].images[RELEASES[DEFAULT].pulled_base]  # the probe's image, streamed to it
    probe_run = engines["unix:///h/2"].runs[-1]
    assert probe_run.environment["HP_MANAGER"] == "10.0.0.1"  # h1's swarm address: its ports are probed
    engines["unix:///h/2"].run_handler = lambda spec: ExecResult(0, "ok")
    registry.add(store, "h2", "unix:///h/2")  # given the device: accepted
    assert [r.name for r in store.hosts()] == ["h1", "h2"]


def test_create_refuses_a_host_that_lost_dev_fuse_before_anything_is_streamed(tmp_path):
    w = multi_world(tmp_path)
    w.hosts["h2"].run_handler = no_fuse
    before = {h: dict(e.images) for h, e in w.hosts.items()}
    with pytest.raises(
        BadInput, match="host h2 cannot run hp's nodes now: its engine cannot hand containers /dev/fuse"
    ):
        make(w)
    assert w.env.store.cluster("lab") is None  # no state written
    for h, e in w.hosts.items():
        assert not [c for c in e.containers_.values() if c.spec.labels.get("io.hp.cluster") == "lab"]
        assert set(e.images) - set(before[h]) <= {RELEASES[DEFAULT].pulled_base}, h  # at most the probe's base image
    assert w.env.provider.networks("lab") == [] and w.env.provider.volumes("lab") == []


def test_mounts_are_refused_with_hosts_and_bound_on_one_engine(tmp_path):
    src = tmp_path / "checkout"
    src.mkdir()
    doc = spec_doc("lab", Mounts=[{"Source": str(src)}, {"Source": str(src), "Target": "/data", "ReadOnly": True}])
    w = multi_world(tmp_path / "multi")
    with pytest.raises(BadInput, match="Mounts: a host folder is on this machine only"):
        create(w.env, validate(doc, w.env.catalogue), CreateOptions(timeout=5))
    assert w.env.store.cluster("lab") is None and not w.provider.containers()
    one = world(tmp_path / "one")
    create(one.env, validate(doc, one.env.catalogue), CreateOptions(timeout=5))
    binds = [f"{src}:{src}:rw", f"{src}:/data:ro"]

    def node(n):
        return one.provider._get(f"hp-lab-{n}").spec

    assert node("login-1").binds == binds and node("cpu-1").binds == binds
    assert node("controller-1").binds == []
    assert node("login-1").environment["HP_ROLE"] == "login"


def test_node_packages_with_hosts_derive_the_home_mounting_image_and_send_it_to_every_host(tmp_path):
    w = multi_world(tmp_path)
    make(w, NodePackages=["jq"])
    worker, login = w.node("lab", "cpu-1").spec, w.node("lab", "login-1").spec
    assert worker.image.startswith("hp-node-mh-pkgs:") and login.image == worker.image
    assert w.node("lab", "controller-1").spec.image == w.env.images(DEFAULT).refs()["controller"]
    assert all(e.images.get(worker.image) for e in w.hosts.values())


def test_the_local_engine_has_a_name_and_images_come_from_the_providers_image_source(tmp_path):
    one = FakeProvider(4, 8192)
    assert list(one.engines()) == [LOCAL_ENGINE] and one.image_source() is one
    assert not world(tmp_path / "one").env.provider.places_nodes
    w = multi_world(tmp_path)
    assert LOCAL_ENGINE not in w.provider.engines() and w.env.provider.places_nodes
    assert w.provider.image_source() is w.source  # built and kept on the local engine, streamed to hosts
    for h in w.hosts.values():
        h.up = False
    w.provider.image_source().ping()  # the hosts' engines are not asked
    with pytest.raises(EngineUnavailable):
        w.provider.ping()


def test_every_provider_answers_the_runtimes_part_of_a_cluster(tmp_path):
    """What differs between one engine and several hosts is asked of the provider (no
    branch on which it is): each implementation has every member of the Protocol."""
    from orchestrator.docker.engine import DockerEngine
    from orchestrator.docker.provider import Provider

    members = {n for n in vars(Provider) if not n.startswith("_")} | set(Provider.__annotations__)
    for cls in (DockerEngine, MultiHostProvider, FakeProvider):
        assert not [m for m in members if not hasattr(cls, m)], cls.__name__
    one, w = world(tmp_path / "one").provider, multi_world(tmp_path)
    assert (one.places_nodes, one.reaches_addresses, one.cluster_images()) == (False, True, ())
    assert (w.provider.places_nodes, w.provider.reaches_addresses) == (True, False)
    assert [one.node_image(r) for r in ("controller", "login", "worker")] == ["controller", "login", "worker"]
    assert [w.provider.node_image(r) for r in ("controller", "login", "worker")] == ["controller", "node-mh", "node-mh"]
    assert set(w.provider.cluster_images()) == {"node-mh", "fileserver"}
