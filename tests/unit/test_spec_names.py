"""Name limits found with real clusters (issue 9, item 3; see orchestrator/spec/names.py):
each case that failed on a real cluster is refused at validation, each that worked is
still accepted."""

from __future__ import annotations

import pytest

from orchestrator.errors import BadInput
from orchestrator.naming import container_name, node_name
from orchestrator.spec import names as N
from orchestrator.spec.catalogue import load_catalogue
from orchestrator.spec.model import validate

CAT = load_catalogue()


def g(name, ntype, count=1, part=None):
    sc = {"NodeType": ntype, **({"PartitionNames": [part]} if part else {})}
    return {"InstanceGroupName": name, "InstanceType": "cpu.small", "InstanceCount": count, "SlurmConfig": sc}


def spec(cluster="lab", compute="cpu", controller="controller", login="login", part="p"):
    return {
        "ClusterName": cluster,
        "InstanceGroups": [g(controller, "Controller"), g(login, "Login"), g(compute, "Compute", 1, part)],
    }


def problems(doc, **kw):
    try:
        validate(doc, CAT, **kw)
    except BadInput as e:
        return e.problems
    return []


def test_constants():
    assert N.CLUSTER_NAME_MAX == 40  # 40 + len("_assoc_usage_month_table") == 64
    assert len("x" * N.CLUSTER_NAME_MAX + "_" + N.SLURMDBD_LONGEST_CLUSTER_TABLE) == N.MYSQL_IDENTIFIER_MAX
    assert len("wckey_usage_month_table") <= len(N.SLURMDBD_LONGEST_CLUSTER_TABLE)
    assert N.max_group_name_len("lab") == 63 - len("hp-lab--65536") == 50
    assert N.max_group_name_len("lab", max_index=9) == 63 - len("hp-lab--9") == 54


def test_the_measured_boundary_container_name_63_works_64_does_not():
    """Measured: cluster in1, group of 54 -> container 'hp-in1-<54>-1' (63) joined; 55
    (64) never joined (configless fetch timed out). With indexes up to 9 the rule
    agrees exactly; the default checks indexes up to 65536."""
    assert len(container_name("in1", node_name("g" * 54, 1))) == 63
    assert N.group_name_problems("in1", "g" * 54, max_index=9) == []
    assert N.group_name_problems("in1", "g" * 55, max_index=9)
    # w53x10 joined 10 nodes; w54x10 joined 9, not the 10th (its container name has 64)
    assert N.group_name_problems("in1", "g" * 53, max_index=10) == []
    assert N.group_name_problems("in1", "g" * 54, max_index=10)
    # cl56 (cluster of 56, group 'w') worked, cl57 did not
    assert N.group_name_problems("i" * 56, "w", max_index=9) == []
    assert N.cluster_name_problems("i" * 57, accounting=False, max_index=9)


def test_long_group_is_refused_with_the_reason_and_the_limit():
    p = problems(spec(compute="g" * 51))
    assert len(p) == 1
    assert p[0].startswith("InstanceGroups[2].InstanceGroupName 'ggggggggg")
    assert "too long for cluster 'lab': its nodes' container names reach 64 characters" in p[0]
    assert "for node 65536), at most 63: Docker's DNS cannot answer for a longer container name" in p[0]
    assert p[0].endswith("In this cluster a group name has at most 50 characters")
    assert problems(spec(compute="g" * 50)) == []


@pytest.mark.parametrize("field", ["controller", "login", "compute"])
def test_every_group_kind_is_held_to_it(field):
    """The login node failed like a worker (sackd's fetch); the controller passed at 64
    but is held to the same rule: it is a node like the others (reboot, replace)."""
    assert problems(spec(**{field: "x" * 51}))
    assert not problems(spec(**{field: "x" * 50}))


def test_hostname_limit_cannot_be_reached_before_the_dns_one():
    # the measured 65-char hostname failure ('sethostname: invalid argument') is inside the container rule
    for c in ("a", "lab"):
        longest = N.max_group_name_len(c)
        names = N.derived_names(c, "g" * longest, N.SLURM_MAX_NODE_COUNT)
        assert all(len(n) <= lim for n, lim, _ in names.values())
        assert len(names["hostname"][0]) < N.HOST_NAME_MAX


def test_cluster_name_limits():
    assert problems(spec(cluster="c" * 40)) == []
    p = problems(spec(cluster="c" * 41))
    assert p == [
        "ClusterName 'ccccccccccccccccccccccccccccccccccccccccc' has 41 characters, at most 40: Slurm's accounting "
        "tables are named '<cluster>_assoc_usage_month_table' and MySQL names are at most 64 characters"
    ]
    # without accounting, the container rule still holds: 'hp-' + 53 + '-g-65536' is 64
    assert N.cluster_name_problems("c" * 52, accounting=False) == []
    p = N.cluster_name_problems("c" * 53, accounting=False)
    assert p == [
        "ClusterName '" + "c" * 53 + "' is too long: hp's container names 'hp-" + "c" * 53 + "-<group>-<index>' "
        "would exceed 63 characters, the longest name Docker's DNS can answer for"
    ]


def test_group_lengths_scale_with_the_cluster_name():
    assert problems(spec(cluster="c" * 40, compute="g" * 13)) == []
    p = problems(spec(cluster="c" * 40, compute="g" * 14))
    assert len(p) == 1 and "at most 13 characters" in p[0]


@pytest.mark.parametrize("part", ["default", "DEFAULT", "Default"])
def test_partition_default_is_refused(part):
    """Measured: PartitionNames [DEFAULT] or [default] -> InService, but sinfo shows no
    such partition (slurm.conf took it for PartitionName=DEFAULT)."""
    p = problems(spec(part=part))
    assert p == [
        f"InstanceGroups[2].SlurmConfig.PartitionNames[0]: {part!r} is a slurm.conf keyword "
        "(PartitionName=DEFAULT sets defaults, it makes no partition); pick another name"
    ]


def test_dev_is_still_refused_but_other_cases_work():
    assert problems(spec(part="dev")) == [
        "InstanceGroups[2].SlurmConfig.PartitionNames[0]: 'dev' is the default "
        "partition every compute node is in; pick another name"
    ]
    for ok in ("DEV", "ALL", "CPU", "456"):  # measured: each a working partition
        assert problems(spec(part=ok)) == [], ok


@pytest.mark.parametrize(
    "doc",
    [
        spec(cluster="inUPPER"),
        spec(controller="CTL", login="LOGIN", compute="CPU", part="CPU"),
        spec(controller="1", login="2", compute="123", part="456"),
        spec(compute="default"),
        spec(compute="all"),
        spec(compute="c--d"),
        spec(controller="c" * 50),
    ],
)
def test_names_that_worked_on_real_clusters_still_pass(doc):
    assert problems(doc) == []


def test_stored_specs_of_existing_clusters_are_still_read():
    """A cluster created before these limits must stay readable (and deletable)."""
    old = spec(cluster="c" * 45, part="default")
    assert problems(old)
    assert problems(old, existing=True) == []


def test_case_collision_across_clusters():
    assert N.cluster_name_conflict("Lab", ["lab", "other"]) == (
        "cluster 'lab' exists and Slurm lower-cases cluster names: 'Lab' and 'lab' would both be 'lab' in Slurm's "
        "accounting"
    )
    assert N.cluster_name_conflict("lab", ["lab"]) is None  # the same cluster (the name-in-use check says so)
    assert N.cluster_name_conflict("lab2", ["lab"]) is None
    assert N.slurm_cluster_name("inUPPER") == "inupper"  # measured: ClusterName = inupper in scontrol show config
