import json

import pytest

from orchestrator.errors import BadInput
from orchestrator.spec.catalogue import load_catalogue
from orchestrator.spec.loader import load_spec_file
from orchestrator.spec.model import DEFAULT_SPEC, validate

CAT = load_catalogue()


def group(name, ntype, count=1, itype="cpu.small", parts=None, **kw):
    sc = {"NodeType": ntype}
    if parts is not None:
        sc["PartitionNames"] = parts
    return {"InstanceGroupName": name, "InstanceType": itype, "InstanceCount": count, "SlurmConfig": sc, **kw}


def spec(*groups, **top):
    return {"ClusterName": "lab", "InstanceGroups": list(groups), **top}


def problems(doc):
    with pytest.raises(BadInput) as e:
        validate(doc, CAT)
    return e.value.problems


def test_default_spec_is_valid_and_fits_two_cores():
    s = validate(DEFAULT_SPEC, CAT)
    assert s.controller.InstanceGroupName == "controller"
    assert s.login is not None
    assert sum(g.InstanceCount for g in s.compute) == 4 and len(s.compute) == 2
    assert sum(CAT[g.InstanceType].cpu_limit * g.InstanceCount for g in s.InstanceGroups) <= 2


def test_issue_example_reads():
    doc = {
        "ClusterName": "lab",
        "NodeRecovery": "Automatic",
        "NodeProvisioningMode": "Continuous",
        "InstanceGroups": [
            group("controller", "Controller"),
            group("login", "Login"),
            group("cpu", "Compute", 4, "cpu.medium", ["cpu"]),
        ],
    }
    s = validate(doc, CAT)
    assert s.continuous and s.compute[0].partition == "cpu"


def test_every_problem_is_reported_with_its_path():
    doc = spec(
        group("Login1", "Login"),
        group("login2", "Login"),
        group("c", "Controller", 0, itype="x.huge"),
        group("bad_name", "Compute", 1, parts=["p"]),
        group("w", "Compute", "two", parts=["q"]),
        Bogus=1,
    )
    doc["InstanceGroups"].append(
        {
            "InstanceGroupName": "ok2",
            "InstanceType": "cpu.small",
            "InstanceCount": 1,
            "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["z"]},
            "Extra": True,
        }
    )
    ps = problems(doc)
    text = "\n".join(ps)
    assert "Bogus: unknown key" in text
    assert "InstanceGroups[5].Extra: unknown key" in text
    assert "at most one group with SlurmConfig.NodeType Login" in text
    assert "InstanceGroups[2].InstanceType: unknown instance type 'x.huge'" in text
    assert "InstanceGroups[2].InstanceCount: a Controller group has exactly 1 instance, got 0" in text
    assert "InstanceGroups[3].InstanceGroupName 'bad_name' must match" in text
    assert "InstanceGroups[4].InstanceCount" in text and "valid integer" in text
    assert len(ps) == 7, ps


def test_no_controller_and_two_controllers():
    assert any(
        "exactly one group with SlurmConfig.NodeType Controller is required, found 0" in p
        for p in problems(spec(group("a", "Compute", 1, parts=["a"])))
    )
    assert any("found 2" in p for p in problems(spec(group("c1", "Controller"), group("c2", "Controller"))))


def test_compute_group_needs_exactly_one_partition_and_unique_names():
    ps = problems(
        spec(
            group("c", "Controller"),
            group("a", "Compute", 1, parts=[]),
            group("b", "Compute", 1, parts=["x", "y"]),
            group("d", "Compute", 1, parts=["dev"]),
            group("e", "Compute", 1, parts=["p"]),
            group("E", "Compute", 1, parts=["p"]),
        )
    )
    t = "\n".join(ps)
    assert t.count("a Compute group has exactly one partition") == 2
    assert "'dev' is the default partition" in t
    assert "partition 'p' is already used by group 'e'" in t
    assert "InstanceGroups[5].InstanceGroupName: 'E' is already used by InstanceGroups[4]" in t


def test_names_length_and_pattern():
    long = "a" * 64
    ps = problems(spec(group("c", "Controller"), group("-x", "Compute", 1, parts=["ok"]), ClusterName=long))
    t = "\n".join(ps)
    assert "longer than 63" in t and "'-x' must match" in t
    assert validate(spec(group("c", "Controller"), group("a--b9", "Compute", 1, parts=["p"])), CAT)


def test_negative_count_and_min_count():
    ps = problems(
        spec(
            group("c", "Controller"),
            group("a", "Compute", -1, parts=["a"]),
            group("b", "Compute", 2, parts=["b"], MinCount=3),
        )
    )
    assert any("must be >= 0, got -1" in p for p in ps)
    assert any("MinCount: must be between 0 and InstanceCount (2), got 3" in p for p in ps)


def test_wrong_types_and_enum_values():
    ps = problems(spec(group("c", "Controller"), NodeRecovery="Sometimes", InstanceGroups_=1))
    t = "\n".join(ps)
    assert "NodeRecovery" in t and "InstanceGroups_: unknown key" in t


def test_hyperpod_fields_are_accepted(tmp_path):
    (tmp_path / "on_create.sh").write_text("true\n")
    g = group(
        "c",
        "Controller",
        LifeCycleConfig={"SourceS3Uri": str(tmp_path), "OnCreate": "on_create.sh"},
        ExecutionRole="arn:aws:iam::1:role/x",
        ThreadsPerCore=1,
    )
    assert validate(spec(g, VpcConfig={"Subnets": []}), CAT)
    # an S3 folder cannot be read here (tests/unit/test_lifecycle.py: the rules)
    g["LifeCycleConfig"] = {"SourceS3Uri": "s3://x", "OnCreate": "on_create.sh"}
    assert any("an s3:// URI cannot be read" in p for p in problems(spec(g)))


def test_not_a_mapping_and_name_override(tmp_path):
    with pytest.raises(BadInput):
        validate([1, 2], CAT)
    s = validate(DEFAULT_SPEC, CAT, name="other")
    assert s.ClusterName == "other"
    p = tmp_path / "s.json"
    p.write_text(json.dumps(DEFAULT_SPEC))
    assert load_spec_file(p)["ClusterName"] == "hp"
    (tmp_path / "bad.yaml").write_text("a: [")
    with pytest.raises(BadInput):
        load_spec_file(tmp_path / "bad.yaml")
    with pytest.raises(BadInput):
        load_spec_file(tmp_path / "missing.yaml")


def test_catalogue_extension(tmp_path, monkeypatch):
    p = tmp_path / "types.yaml"
    p.write_text(
        "my.type: {VCpus: 3, CpuLimit: 0.1, MemoryMiB: 300}\ncpu.small: {VCpus: 2, CpuLimit: 0.2, MemoryMiB: 256}\n"
    )
    monkeypatch.setenv("HP_INSTANCE_TYPES", str(p))
    cat = load_catalogue()
    assert cat["my.type"].vcpus == 3 and cat["cpu.small"].memory_mib == 256
    from orchestrator.slurm.conf import slurmd_conf

    assert slurmd_conf(cat["my.type"], "grp") == "CPUs=3 RealMemory=300 Features=grp"
    p.write_text("broken: {VCpus: 1}\n")
    with pytest.raises(BadInput):
        load_catalogue()


# Values the engine judged by hand (Docker 20.10, create_container / inspect_image):
# valid ones answer "No such image", refused ones "invalid reference format".
ENGINE_ACCEPTS = [
    "hp-worker:abc",
    "hp-worker:does-not-exist",
    "localhost:5000/a/b:t",
    "localhost/a",
    "Foo.com/bar",
    "LOCALHOST:5000/a",
    "Foo:5000/a",
    "a__b",
    "a--b:T_.-",
    "x:" + "a" * 128,
    "a@sha256:" + "a" * 64,
    "a" * 64,
    "sha256:" + "0" * 64,
    "sha512:" + "0" * 128,
    "ubuntu:24.04",
]
ENGINE_REFUSES = [
    "",
    "a b",
    "UPPER:1",
    "Foo/bar",
    "a/B",
    "x:",
    "-x",
    "x:" + "a" * 129,
    "a" * 256,
    "a___b",
    "a..b",
    "a:-t",
    "a@sha256:" + "a" * 63,
    "a@md5:" + "0" * 32,
    "img:tag\n",
]


@pytest.mark.parametrize("ref", ENGINE_ACCEPTS)
def test_image_references_the_engine_takes_pass(ref):
    from orchestrator.spec.reference import reference_problem

    assert reference_problem(ref) is None
    validate(spec(group("c", "Controller", Image=ref)), CAT)


@pytest.mark.parametrize("ref", ENGINE_REFUSES)
def test_image_references_the_engine_refuses_are_refused_with_the_group(ref):
    ps = problems(spec(group("c", "Controller"), group("w", "Compute", parts=["p"], Image=ref)))
    assert (
        len(ps) == 1
        and ps[0].startswith("InstanceGroups[1].Image: ")
        and "an image reference" in ps[0].replace("a valid", "an")
    ), ps


def test_bad_image_is_reported_with_every_other_problem():
    ps = problems(spec(group("c", "Controller", Image="Bad Image"), group("w", "Compute", -1, parts=["p"])))
    assert any("InstanceGroups[0].Image" in p for p in ps) and any("InstanceGroups[1].InstanceCount" in p for p in ps)


def test_stored_spec_with_a_bad_image_stays_readable():
    validate(spec(group("c", "Controller", Image="Bad Image")), CAT, existing=True)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ("VCpus: 0, CpuLimit: 0.1, MemoryMiB: 300", "VCpus must be at least 1"),
        ("VCpus: 1, CpuLimit: 0, MemoryMiB: 300", "CpuLimit must be at least 0.01"),
        ("VCpus: 1, CpuLimit: .nan, MemoryMiB: 300", "CpuLimit must be at least 0.01"),
        ("VCpus: 1, CpuLimit: 0.1, MemoryMiB: 5", "MemoryMiB must be at least 6"),
        ("VCpus: 1, CpuLimit: 0.1, MemoryMiB: 300, Gpus: -1", "Gpus must be 0 or more"),
    ],
)
def test_instance_types_docker_or_slurm_would_refuse(tmp_path, monkeypatch, fields, needle):
    p = tmp_path / "types.yaml"
    p.write_text(f"bad.type: {{{fields}}}\nok.type: {{VCpus: 1, CpuLimit: 0.01, MemoryMiB: 6}}\n")
    monkeypatch.setenv("HP_INSTANCE_TYPES", str(p))
    with pytest.raises(BadInput) as e:
        load_catalogue()
    assert len(e.value.problems) == 1 and "bad.type" in e.value.problems[0] and needle in e.value.problems[0]


def test_slurm_version_chooses_the_release_and_is_fixed_at_create(tmp_path):
    from orchestrator import releases
    from orchestrator.releases import SlurmRelease
    from orchestrator.spec.model import with_overrides

    cat = load_catalogue()
    assert validate(dict(DEFAULT_SPEC), cat).release is releases.DEFAULT
    spec = validate({**DEFAULT_SPEC, "SlurmVersion": "26.05"}, cat)
    assert spec.release is SlurmRelease.V26_05 and spec.with_services_fixed().SlurmVersion is SlurmRelease.V26_05
    assert validate(dict(DEFAULT_SPEC), cat).with_services_fixed().SlurmVersion is releases.DEFAULT  # recorded
    # a stored spec of a cluster made before the choice ran 24.11, whatever the default is now
    assert validate(dict(DEFAULT_SPEC), cat, existing=True).release is releases.BEFORE_CHOICE
    assert with_overrides(dict(DEFAULT_SPEC), cat, slurm="26.05").release is SlurmRelease.V26_05
    # YAML: a quoted release reads; 26.05 unquoted is a number, named as such
    f = tmp_path / "s.yaml"
    f.write_text('ClusterName: a\nSlurmVersion: "26.05"\nInstanceGroups: []\n')
    assert load_spec_file(f)["SlurmVersion"] == "26.05"
    with pytest.raises(BadInput) as ei:
        validate({**DEFAULT_SPEC, "SlurmVersion": 26.05}, cat)
    assert ei.value.problems == [
        'SlurmVersion: Slurm release 26.05 is not one hp has (24.11, 26.05) (a YAML number: quote it, "26.05")'
    ]
    with pytest.raises(BadInput) as ei:  # with the other problems, the command line's too
        with_overrides({**DEFAULT_SPEC, "SlurmVersion": "25.11", "Foo": 1}, cat, slurm="2")
    assert ei.value.problems[0] == "--slurm: Slurm release '2' is not one hp has (24.11, 26.05)"
    assert "SlurmVersion: Slurm release '25.11' is not one hp has (24.11, 26.05)" in ei.value.problems
    assert "Foo: unknown key" in ei.value.problems
