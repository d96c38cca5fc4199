from orchestrator.naming import container_name, labels, node_id, node_name, split_node
from orchestrator.slurm.conf import render, slurmd_conf
from orchestrator.spec.catalogue import load_catalogue
from orchestrator.spec.model import DEFAULT_SPEC, validate

CAT = load_catalogue()


def conf_lines(doc):
    return [l for l in render(validate(doc, CAT), CAT).splitlines() if l and not l.startswith("#")]


def test_render_default():
    lines = conf_lines(DEFAULT_SPEC)
    assert "ClusterName=hp" in lines
    assert "SlurmctldHost=controller-1" in lines
    assert "SlurmctldParameters=enable_configless" in lines
    assert "AuthType=auth/slurm" in lines and "CredType=cred/slurm" in lines
    assert "Nodeset=ns_cpu-a Feature=cpu-a" in lines
    assert any(l.startswith("PartitionName=dev Nodes=ALL Default=YES") for l in lines)
    assert any(l.startswith("PartitionName=cpu-b Nodes=ns_cpu-b ") for l in lines)
    assert "MaxNodeCount=128" in lines
    assert not any(l.startswith("GresTypes") for l in lines)


def test_max_node_count_has_headroom_and_gpu_gres():
    doc = {
        "ClusterName": "big",
        "InstanceGroups": [
            {
                "InstanceGroupName": "c",
                "InstanceType": "cpu.small",
                "InstanceCount": 1,
                "SlurmConfig": {"NodeType": "Controller"},
            },
            {
                "InstanceGroupName": "g",
                "InstanceType": "gpu.8x",
                "InstanceCount": 100,
                "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["gpu"]},
            },
        ],
    }
    s = validate(doc, CAT)
    assert s.max_nodes == 400
    assert "GresTypes=gpu" in conf_lines(doc)
    assert slurmd_conf(CAT["gpu.8x"], "g") == "CPUs=32 RealMemory=65536 Features=g Gres=gpu:8"
    assert slurmd_conf(CAT["cpu.nano"], "g", "hp:health:on-start:pending").endswith(
        " State=DRAIN Reason=hp:health:on-start:pending"
    )
    # recorded with the spec, MaxNodeCount stays what the cluster was made with
    assert validate({**doc, "MaxNodeCount": 500}, CAT).max_nodes == 500


def test_naming():
    assert node_name("CPU-A", 3) == "cpu-a-3"
    assert container_name("lab", "cpu-a-3") == "hp-lab-cpu-a-3"
    assert node_id("0123456789abcdef0123456789") == "i-0123456789abcdef0"
    assert split_node("cpu-a-3") == ("cpu-a", 3) and split_node("x") == ("x", 0)
    l = labels("lab", "worker", "cpu", "cpu-1", 1, "cpu.small")
    assert l["io.hp.cluster"] == "lab" and l["io.hp.role"] == "worker" and l["io.hp.node"] == "cpu-1"
    assert l["io.hp.managed"] == "1" and l["io.hp.instance-type"] == "cpu.small"
