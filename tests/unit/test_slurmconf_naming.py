from orchestrator.catalogue import load_catalogue
from orchestrator.naming import container_name, labels, node_id, node_name
from orchestrator.slurmconf import max_node_count, render
from orchestrator.spec import DEFAULT_SPEC, validate

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
    doc = {"ClusterName": "big", "InstanceGroups": [
        {"InstanceGroupName": "c", "InstanceType": "cpu.small", "InstanceCount": 1, "SlurmConfig": {"NodeType": "Controller"}},
        {"InstanceGroupName": "g", "InstanceType": "gpu.8x", "InstanceCount": 100,
         "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["gpu"]}}]}
    s = validate(doc, CAT)
    assert max_node_count(s) == 400
    assert "GresTypes=gpu" in conf_lines(doc)
    assert CAT["gpu.8x"].slurmd_conf("g") == "CPUs=32 RealMemory=65536 Features=g Gres=gpu:8"


def test_naming():
    assert node_name("CPU-A", 3) == "cpu-a-3"
    assert container_name("lab", "cpu-a-3") == "hp-lab-cpu-a-3"
    assert node_id("0123456789abcdef0123456789") == "i-0123456789abcdef0"
    l = labels("lab", "worker", "cpu", "cpu-1", 1, "cpu.small")
    assert l["io.hp.cluster"] == "lab" and l["io.hp.role"] == "worker" and l["io.hp.node"] == "cpu-1"
    assert l["io.hp.managed"] == "1" and l["io.hp.instance-type"] == "cpu.small"
