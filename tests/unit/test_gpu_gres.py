"""orchestrator.gpu.gres: Gres= for slurmd -Z --conf, the controller's gres.conf, GresTypes."""

from __future__ import annotations

import pytest
from gpu_fakes import fixture

from orchestrator.gpu.discovery import parse_nvidia_smi_xml
from orchestrator.gpu.gres import (
    GresError,
    GresNode,
    autodetect_choice,
    gres_conf,
    lines_changed,
    node_gres,
    node_lines,
    slurm_conf_lines,
    slurm_gpu_type,
    slurmd_conf_gres,
)
from orchestrator.gpu.wiring import wire

H200 = parse_nvidia_smi_xml(fixture("nvidia-smi-q.xml")).gpus[0]
# The plugin folder of hp's worker image (Debian 13 slurm-wlm 24.11.5), listed on 2026-12-01.
DEBIAN_PLUGINS = [
    f"/usr/lib/x86_64-linux-gnu/slurm-wlm/{p}.so" for p in ("gpu_generic", "gpu_nrt", "gpu_nvidia", "gres_gpu")
]


def test_gres_strings():
    assert slurm_gpu_type("h200") == "h200" and slurm_gpu_type("h100-pcie") == "h100_pcie"
    assert node_gres("h200", 1) == "gpu:h200:1" and slurmd_conf_gres("h100-nvl", 8) == "Gres=gpu:h100_nvl:8"
    assert slurm_conf_lines(True) == ["GresTypes=gpu"] and slurm_conf_lines(False) == []
    with pytest.raises(GresError, match="at least one GPU"):
        node_gres("h200", 0)
    with pytest.raises(GresError, match="empty Slurm GRES type"):
        slurm_gpu_type("--")


def test_autodetect_choice():
    """Debian's build has gpu_nvidia (24.11) but no gpu_nvml."""
    assert autodetect_choice(DEBIAN_PLUGINS, nvml_library=True) == "nvidia"
    assert autodetect_choice(DEBIAN_PLUGINS + ["gpu_nvml.so"], nvml_library=True) == "nvml"
    assert autodetect_choice(DEBIAN_PLUGINS + ["gpu_nvml.so"], nvml_library=False) == "nvidia"
    assert autodetect_choice(["gpu_generic.so"]) is None


def test_gres_conf_for_the_h200_node():
    """The lent one-GPU host, wired the no-toolkit way: explicit File= line, unless the node holds every
    GPU of the host (then AutoDetect=nvidia counts right)."""
    w = wire("runtime", [H200])  # any mode gives the device files in PCI order
    node = GresNode("gpu-1", H200.model, w.device_files)
    assert node.count == 1 and node.gres() == "gpu:h200:1"
    text = gres_conf([node], autodetect_choice(DEBIAN_PLUGINS), cluster="lab")
    assert text.splitlines()[0].startswith("# gres.conf of hp cluster lab")
    assert text.splitlines()[-1] == "NodeName=gpu-1 Name=gpu Type=h200 File=/dev/nvidia0"
    whole_host = GresNode("gpu-1", "h200", ("/dev/nvidia0",), proc_filtered=True)
    assert gres_conf([whole_host], "nvidia").splitlines()[-1] == "AutoDetect=nvidia"
    assert "AutoDetect" not in gres_conf([whole_host], None)


def test_gres_conf_many_nodes_sorted_and_ordered():
    a = GresNode("gpu-b-1", "h100", ("/dev/nvidia4", "/dev/nvidia5"))
    b = GresNode("gpu-a-1", "h100", ("/dev/nvidia1", "/dev/nvidia0"))
    lines = [ln for ln in gres_conf([a, b], "nvidia").splitlines() if not ln.startswith("#")]
    assert lines == [
        "NodeName=gpu-a-1 Name=gpu Type=h100 File=/dev/nvidia1",
        "NodeName=gpu-a-1 Name=gpu Type=h100 File=/dev/nvidia0",
        "NodeName=gpu-b-1 Name=gpu Type=h100 File=/dev/nvidia4",
        "NodeName=gpu-b-1 Name=gpu Type=h100 File=/dev/nvidia5",
    ]
    assert node_lines(a)[0] == "NodeName=gpu-b-1 Name=gpu Type=h100 File=/dev/nvidia4"
    with pytest.raises(GresError, match="listed twice: gpu-a-1"):
        gres_conf([b, b], None)
    with pytest.raises(GresError, match="AutoDetect='rsmi'"):
        gres_conf([a], "rsmi")


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"name": "bad name", "model": "h200", "device_files": ("/dev/nvidia0",)}, "cannot be a gres.conf NodeName"),
        ({"name": "n", "model": "h200", "device_files": ("/dev/nvidiactl",)}, "must be /dev/nvidiaN"),
        ({"name": "n", "model": "h200", "device_files": ()}, "got none"),
        ({"name": "n", "model": "h200", "device_files": ("/dev/nvidia0", "/dev/nvidia0")}, "listed twice"),
    ],
)
def test_gres_node_validation(kw, match):
    with pytest.raises(GresError, match=match):
        GresNode(**kw)


def test_lines_changed():
    old = gres_conf(
        [GresNode("gpu-1", "h200", ("/dev/nvidia0",)), GresNode("gpu-2", "h200", ("/dev/nvidia1",))],
        None,
        cluster="lab",
    )
    same = (
        "  NodeName=gpu-1   Name=gpu Type=h200 File=/dev/nvidia0 # comment\n\n"
        "NodeName=gpu-2 Name=gpu Type=h200 File=/dev/nvidia1\n"
    )
    assert not lines_changed(old, same)
    moved = gres_conf(
        [GresNode("gpu-1", "h200", ("/dev/nvidia0",)), GresNode("gpu-2", "h200", ("/dev/nvidia3",))], None
    )
    assert lines_changed(old, moved)
    assert not lines_changed(old, moved, node="gpu-1") and lines_changed(old, moved, node="gpu-2")
    assert lines_changed(None, moved) and not lines_changed("", "# only a comment\n")
    assert lines_changed(old, "AutoDetect=nvidia\n" + old, node="gpu-1")
