"""orchestrator.gpu.discovery on the real H200 outputs (tests/fixtures/gpu-h200/) and
copies of them mutated in the test (each test says what it changed)."""

from __future__ import annotations

import json

import pytest
from gpu_fakes import fixture

from orchestrator.gpu.discovery import (
    DiscoveryError,
    GpuRecord,
    HostGpus,
    PcieLink,
    clock_event_names,
    device_nodes,
    driver_files,
    instance_types_for,
    parse_check_inventory,
    parse_nvidia_smi_list,
    parse_nvidia_smi_xml,
    short_model,
    type_sizes,
)

XML = fixture("nvidia-smi-q.xml")
UUID = "GPU-3fadaaaa-e57c-b9f1-78a9-3213b39f962c"


def test_real_h200_xml_parses():
    """The unedited nvidia-smi -q -x of the H200."""
    host = parse_nvidia_smi_xml(XML)
    assert host.driver_version == "580.159.04" and host.cuda_version == "13.0"
    (g,) = host.gpus
    assert (g.index, g.uuid, g.name, g.model) == (0, UUID, "NVIDIA H200", "h200")
    assert g.pci_bus_id == "00000000:00:06.0" and g.minor_number == 0 and g.memory_mib == 143771
    assert g.persistence_mode is True and g.compute_mode == "Default"
    assert g.pcie == PcieLink(gen=5, gen_max=5, width=16, width_max=16) and g.pcie.degraded == []
    assert g.ecc_enabled is True and g.ecc_pending_enabled is True
    assert (g.ecc_volatile_uncorrectable, g.ecc_volatile_correctable, g.ecc_aggregate_uncorrectable) == (0, 0, 0)
    assert g.remapped_rows_pending is False and g.remapped_rows_failure is False and g.remapped_rows_uncorrectable == 0
    assert g.retired_pages_pending is None  # N/A on H200: it uses row remapping
    assert g.clock_event_reasons == frozenset({"gpu_idle"})
    assert g.temperature_c == 38 and g.power_w == 82.21 and g.power_limit_w == 700.0 and g.mig_enabled is False


def test_xml_mutated_failures_are_read():
    """Changed in a copy: current width 16x -> 8x, current gen 5 -> 3, dram_uncorrectable 0 -> 2,
    remapped_row_pending No -> Yes, remapped_row_failure No -> Yes, HW thermal slowdown Active."""
    xml = (
        XML.replace("<current_link_width>16x</current_link_width>", "<current_link_width>8x</current_link_width>")
        .replace("<current_link_gen>5</current_link_gen>", "<current_link_gen>3</current_link_gen>")
        .replace("<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>2</dram_uncorrectable>", 1)
        .replace("<remapped_row_pending>No</remapped_row_pending>", "<remapped_row_pending>Yes</remapped_row_pending>")
        .replace("<remapped_row_failure>No</remapped_row_failure>", "<remapped_row_failure>Yes</remapped_row_failure>")
        .replace(
            "<clocks_event_reason_hw_thermal_slowdown>Not Active", "<clocks_event_reason_hw_thermal_slowdown>Active"
        )
    )
    xml = xml.replace(
        "<dram_correctable>0</dram_correctable>",
        "<dram_correctable>0</dram_correctable><some_new_counter>7</some_new_counter>",
        1,
    )  # a counter hp does not know: ignored
    (g,) = parse_nvidia_smi_xml(xml).gpus
    assert g.pcie.degraded == ["width x8 < x16", "gen 3 < 5"]
    assert g.ecc_volatile_uncorrectable == 2 and g.ecc_aggregate_uncorrectable == 0
    assert g.remapped_rows_pending and g.remapped_rows_failure
    assert g.clock_event_reasons == {"gpu_idle", "hw_thermal_slowdown"}


def test_xml_older_driver_layout():
    """Changed in a copy, to the layout of drivers before 535: clocks_event_reason(s) renamed to
    clocks_throttle_reason(s) (hw_power_brake_slowdown as hw_power_brake_slowdown), the volatile ECC block
    replaced by single_bit/double_bit totals (3 and 1), power readings under <power_readings> with
    <power_draw>, and pending_retirement Yes."""
    xml = XML.replace("clocks_event_reasons>", "clocks_throttle_reasons>").replace(
        "clocks_event_reason_", "clocks_throttle_reason_"
    )
    xml = xml.replace(
        "<clocks_throttle_reason_hw_power_brake_slowdown>Not Active",
        "<clocks_throttle_reason_hw_power_brake_slowdown>Active",
    )
    start = xml.index("<volatile>")
    end = xml.index("</volatile>") + len("</volatile>")
    xml = (
        xml[:start]
        + (
            "<volatile><single_bit><device_memory>3</device_memory><total>3</total></single_bit>"
            "<double_bit><device_memory>1</device_memory><total>1</total></double_bit>"
            "</volatile>"
        )
        + xml[end:]
    )
    xml = xml.replace("<gpu_power_readings>", "<power_readings>").replace("</gpu_power_readings>", "</power_readings>")
    xml = xml.replace("<instant_power_draw>82.21 W</instant_power_draw>", "<power_draw>90.5 W</power_draw>")
    xml = xml.replace("<current_power_limit>700.00 W</current_power_limit>", "<power_limit>650.00 W</power_limit>")
    xml = xml.replace("<pending_retirement>N/A</pending_retirement>", "<pending_retirement>Yes</pending_retirement>")
    (g,) = parse_nvidia_smi_xml(xml).gpus
    assert g.clock_event_reasons == {"gpu_idle", "hw_power_brake_slowdown"}
    assert (g.ecc_volatile_uncorrectable, g.ecc_volatile_correctable) == (1, 3)
    assert g.power_w == 90.5 and g.power_limit_w == 650.0 and g.retired_pages_pending is True


def test_xml_two_gpus_and_errors():
    """Changed in a copy: the <gpu> element duplicated (attached_gpus 2) with the second's uuid and
    minor number changed; then attached_gpus left at 1 with two <gpu> (an inconsistent report)."""
    gpu = XML[XML.index("<gpu id=") : XML.index("</gpu>") + len("</gpu>")]
    second = gpu.replace(UUID, "GPU-second").replace("<minor_number>0</minor_number>", "<minor_number>3</minor_number>")
    two = XML.replace(gpu, gpu + second).replace("<attached_gpus>1</attached_gpus>", "<attached_gpus>2</attached_gpus>")
    host = parse_nvidia_smi_xml(two)
    assert [g.index for g in host.gpus] == [0, 1] and host.gpus[1].minor_number == 3
    assert host.find("1").uuid == "GPU-second" and host.find(UUID).index == 0
    assert host.find("00000000:00:06.0").index == 0
    assert list(host.by_model()) == ["h200"] and len(host.by_model()["h200"]) == 2
    with pytest.raises(DiscoveryError, match="no GPU 'GPU-x'"):
        host.find("GPU-x")
    with pytest.raises(DiscoveryError, match="attached_gpus says 1"):
        parse_nvidia_smi_xml(XML.replace(gpu, gpu + second))
    with pytest.raises(DiscoveryError, match="not XML"):
        parse_nvidia_smi_xml("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    with pytest.raises(DiscoveryError, match="root element is <foo>"):
        parse_nvidia_smi_xml("<foo/>")


def test_xml_values_not_reported():
    """Changed in a copy: every value of the first <gpu> removed but product_name; a text that is not a
    number where one is expected (memory 'Unknown MiB'), and persistence mode 'Maybe'."""
    xml = (
        "<nvidia_smi_log><gpu id='00000000:01:00.0'><product_name>Tesla V100-SXM2-16GB</product_name>"
        "<persistence_mode>Maybe</persistence_mode><fb_memory_usage><total>Unknown MiB</total></fb_memory_usage>"
        "<ecc_errors><volatile><dram_uncorrectable>N/A</dram_uncorrectable></volatile></ecc_errors>"
        "</gpu></nvidia_smi_log>"
    )
    (g,) = parse_nvidia_smi_xml(xml).gpus
    assert g.model == "v100" and g.pci_bus_id == "00000000:01:00.0" and g.uuid == ""
    assert g.memory_mib is None and g.persistence_mode is None and g.ecc_volatile_uncorrectable is None
    assert g.clock_event_reasons == frozenset() and g.pcie == PcieLink() and g.power_w is None


def test_nvidia_smi_list_real_and_mig():
    """The real nvidia-smi -L line; then (added in the test) MIG lines under it, an empty output, and
    the error nvidia-smi prints when the driver does not answer."""
    (g,) = parse_nvidia_smi_list(fixture("nvidia-smi-L.txt"))
    assert (g.index, g.name, g.uuid, g.model, g.mig) == (0, "NVIDIA H200", UUID, "h200", ())
    mig = fixture("nvidia-smi-L.txt") + "  MIG 1g.18gb     Device  0: (UUID: MIG-aaaa-bbbb)\n"
    assert parse_nvidia_smi_list(mig)[0].mig == ("MIG-aaaa-bbbb",)
    assert parse_nvidia_smi_list("\n") == []
    with pytest.raises(DiscoveryError, match="couldn't communicate"):
        parse_nvidia_smi_list("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")


@pytest.mark.parametrize(
    "name, model",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GB10", "gb10"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA A10G", "a10g"),
        ("Tesla T4", "t4"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada-generation"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("", "unknown"),
        ("NVIDIA ", "unknown"),
    ],
)
def test_short_model(name, model):
    assert short_model(name) == model


def test_clock_event_names():
    assert clock_event_names(0) == frozenset()
    assert clock_event_names(0x1 | 0x8 | 0x80) == {"gpu_idle", "hw_slowdown", "hw_power_brake_slowdown"}
    assert clock_event_names(0x400 | 0x40) == {"hw_thermal_slowdown", "bit_0x400"}


def _gpus(model: str, n: int) -> list[GpuRecord]:
    return [GpuRecord(index=i, uuid=f"GPU-{i}", name=model, model=model) for i in range(n)]


def test_instance_types_one_h200():
    """The lent host: 1 x H200, 16 CPUs, 128 GiB."""
    (t,) = instance_types_for(parse_nvidia_smi_xml(XML).gpus, 16, 131072)
    assert (t.name, t.gpu_model, t.gpus, t.vcpus, t.cpu_limit, t.memory_mib) == ("h200.1x", "h200", 1, 16, 16.0, 117760)
    assert t.catalogue_entry() == {"VCpus": 16, "CpuLimit": 16.0, "MemoryMiB": 117760, "Gpus": 1, "GpuModel": "h200"}


def test_instance_types_eight_h100_and_mixed():
    types = instance_types_for(_gpus("h100", 8), 192, 2097152)
    assert [(t.name, t.gpus, t.vcpus, t.memory_mib) for t in types] == [
        ("h100.1x", 1, 24, 235520),
        ("h100.2x", 2, 48, 471040),
        ("h100.4x", 4, 96, 943104),
        ("h100.8x", 8, 192, 1887232),
    ]
    mixed = instance_types_for(_gpus("a100", 2) + _gpus("l4", 1), 3, 4096)
    assert [(t.name, t.vcpus, t.memory_mib) for t in mixed] == [
        ("a100.1x", 1, 1024),
        ("a100.2x", 2, 2048),
        ("l4.1x", 1, 1024),
    ]
    assert instance_types_for([], 8, 1024) == []
    with pytest.raises(DiscoveryError, match="cannot back GPU nodes"):
        instance_types_for(_gpus("h100", 1), 0, 1024)


def test_type_sizes():
    assert type_sizes(0) == [] and type_sizes(1) == [1] and type_sizes(8) == [1, 2, 4, 8]
    assert type_sizes(6) == [1, 2, 4, 6] and type_sizes(3) == [1, 2, 3]


def test_check_inventory():
    """A --discover document as hp_gpu_check.py prints it, with the H200's NVML values."""
    doc = {
        "tool": "hp_gpu_check",
        "software": {
            "status": "ok",
            "driver_version": "580.159.04",
            "cuda_driver_version": 13000,
            "gpus": [
                {
                    "index": 0,
                    "name": "NVIDIA H200",
                    "uuid": UUID,
                    "pci_bus_id": "00000000:00:06.0",
                    "minor_number": 0,
                    "memory_total_bytes": 150754820096,
                    "persistence_mode": True,
                    "compute_mode": "Default",
                },
                {
                    "index": 1,
                    "name": "NVIDIA H200",
                    "uuid": "GPU-b",
                    "minor_number": {"error": "x"},
                    "memory_total_bytes": {"error": "x"},
                    "persistence_mode": {"error": "x"},
                    "compute_mode": {"error": "x"},
                },
            ],
        },
    }
    host = parse_check_inventory(json.dumps(doc))
    assert host.driver_version == "580.159.04" and host.cuda_version == "13.0"
    assert host.gpus[0].memory_mib == 143771 and host.gpus[0].minor_number == 0 and host.gpus[0].model == "h200"
    assert host.gpus[1].minor_number is None and host.gpus[1].memory_mib is None
    assert host.gpus[1].persistence_mode is None and host.gpus[1].compute_mode is None
    assert parse_check_inventory({"software": {"status": "ok", "cuda_driver_version": 0}}).cuda_version is None
    for bad, match in (
        ("{", "not JSON"),
        ("[]", "not an object"),
        ("{}", "no 'software'"),
        ('{"software": {"status": "error", "why": "NVML did not initialise"}}', "did not initialise"),
        ('{"software": {"status": "error"}}', "no reason given"),
    ):
        with pytest.raises(DiscoveryError, match=match):
            parse_check_inventory(bad)


# HANDWRITTEN: no ldconfig -p of a host with the driver was available; the layout is that of
# Ubuntu's nvidia driver 580 packages (64-bit and 32-bit entries, soname and dev links).
LDCONFIG = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6) => /usr/lib/i386-linux-gnu/libnvidia-ml.so.1
\tlibnvidia-ml.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
\tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so
\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1
\tlibnvidia-nvvm.so.4 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4
\tlibnvidia-gpucomp.so.580.159.04 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-gpucomp.so.580.159.04
\tlibnvidia-egl-wayland.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-egl-wayland.so.1
\tlibc.so.6 (libc6,x86-64, OS ABI: Linux 3.2.0) => /lib/x86_64-linux-gnu/libc.so.6
\tlibcuda.so.1 (libc6,AArch64) => /usr/lib/aarch64-linux-gnu/libcuda.so.1
"""


def test_driver_files_from_ldconfig():
    d = driver_files(ldconfig=LDCONFIG, binaries=["/usr/bin/nvidia-smi", "/usr/bin/ls"])
    assert d.source == "ldconfig" and d.missing == []
    got = {(f.host_path, f.container_path, f.kind) for f in d.files}
    assert ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "lib") in got
    assert ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", "bin") in got
    assert not any(
        "i386" in f.host_path or "aarch64" in f.host_path or "wayland" in f.host_path or "libc.so" in f.host_path
        for f in d.files
    )
    assert {f.base for f in d.files} == {
        "libnvidia-ml",
        "libcuda",
        "libnvidia-ptxjitcompiler",
        "libnvidia-nvvm",
        "libnvidia-gpucomp",
        "nvidia-smi",
    }
    assert d.versions() == {"libnvidia-gpucomp": {"580.159.04"}}
    assert d.version_problems("580.159.04") == []
    assert d.version_problems("570.86.15") == [
        "libnvidia-gpucomp is version 580.159.04, the loaded driver is 570.86.15"
    ]
    arm = driver_files(ldconfig=LDCONFIG, machine="aarch64")
    assert [f.container_path for f in arm.files] == ["/usr/lib/aarch64-linux-gnu/libcuda.so.1"]
    assert arm.missing == ["libnvidia-ml", "nvidia-smi"]
    with pytest.raises(DiscoveryError, match="unsupported machine"):
        driver_files(ldconfig="", machine="riscv64")


def test_driver_files_from_folder_listing():
    """The lent H200 host's layout (../shared/gpu-device/README.md): the driver under
    /usr/local/nvidia with bin/ and lib64/ (and, added here, a 32-bit lib/ and two driver versions of
    libnvidia-ml to show the mismatch report)."""
    listing = [
        "/usr/local/nvidia/bin/nvidia-smi",
        "/usr/local/nvidia/bin/nvidia-debugdump",
        "/usr/local/nvidia/bin/nvidia-settings",
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
        "/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04",
        "/usr/local/nvidia/lib64/libnvidia-ml.so.570.86.15",
        "/usr/local/nvidia/lib64/libcuda.so.1",
        "/usr/local/nvidia/lib/libcuda.so.1",
        "/usr/local/nvidia/lib/libnvidia-opencl.so.1",
        "/usr/local/nvidia/lib64/README",
    ]
    d = driver_files(listing=listing)
    assert d.source == "listing" and d.missing == []
    paths = {f.host_path: f.container_path for f in d.files}
    assert paths["/usr/local/nvidia/lib64/libcuda.so.1"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert paths["/usr/local/nvidia/bin/nvidia-debugdump"] == "/usr/bin/nvidia-debugdump"
    assert "/usr/local/nvidia/lib/libcuda.so.1" not in paths
    assert "/usr/local/nvidia/lib/libnvidia-opencl.so.1" not in paths
    assert "/usr/local/nvidia/bin/nvidia-settings" not in paths
    assert d.version_problems(None) == ["libnvidia-ml: several driver versions on the host (570.86.15, 580.159.04)"]
    assert driver_files(listing=["/opt/x/libcuda.so.1"]).missing == ["libnvidia-ml", "nvidia-smi"]


def test_device_nodes():
    assert device_nodes([3, 0, 3]) == [
        "/dev/nvidia0",
        "/dev/nvidia3",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    present = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]  # no uvm-tools: optional
    assert device_nodes([0], present) == ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    with pytest.raises(DiscoveryError, match=r"/dev/nvidia1\b.*nvidia-modprobe") as e:
        device_nodes([1], ["/dev/nvidia0", "/dev/nvidiactl"])
    assert "/dev/nvidia-uvm" in str(e.value)
    with pytest.raises(DiscoveryError) as e:
        device_nodes([1], ["/dev/nvidiactl", "/dev/nvidia-uvm"])
    assert "nvidia-modprobe" not in str(e.value)


def test_host_gpus_empty():
    assert HostGpus(None, None, ()).by_model() == {}
