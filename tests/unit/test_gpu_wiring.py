"""orchestrator.gpu.wiring: the mode chosen from docker info (and HP_GPU_MODE), and the
host config of each mode, for the real H200 (tests/fixtures/gpu-h200/nvidia-smi-q.xml)."""

from __future__ import annotations

import pytest
from gpu_fakes import fixture

from orchestrator.gpu.discovery import GpuRecord, driver_files, parse_nvidia_smi_xml
from orchestrator.gpu.wiring import GpuWiring, GpuWiringError, choose_mode, wire

H200 = parse_nvidia_smi_xml(fixture("nvidia-smi-q.xml")).gpus[0]
UUID = H200.uuid
# docker info of this lab's engine (dockerd 20.10, no toolkit), trimmed to what matters.
PLAIN = {"Runtimes": {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"}}, "DefaultRuntime": "runc"}
TOOLKIT = {"Runtimes": {"nvidia": {"path": "nvidia-container-runtime"}, "runc": {"path": "runc"}}}
CDI = {"Runtimes": {"runc": {}}, "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"]}
DRIVER = driver_files(
    listing=[
        "/usr/local/nvidia/bin/nvidia-smi",
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1",
    ]
)


def test_auto_mode():
    assert choose_mode(PLAIN).mode == "devices"
    assert "no CDI" in choose_mode(PLAIN).why
    assert choose_mode(TOOLKIT, {}).mode == "runtime"
    assert choose_mode(CDI, {}, cdi_devices=["nvidia.com/gpu=0", "nvidia.com/gpu=all"]).mode == "cdi"
    # CDI enabled but its devices not listed, or no nvidia.com/gpu among them: plain devices
    assert choose_mode(CDI).mode == "devices"
    assert "no nvidia.com/gpu devices known" in choose_mode(CDI, cdi_devices=["vendor.com/fpga=0"]).why
    assert choose_mode({"Runtimes": None, "CDISpecDirs": None}).mode == "devices"
    assert choose_mode({"Runtimes": ["nvidia"], "CDISpecDirs": "x"}).mode == "devices"  # malformed info


def test_forced_modes():
    assert choose_mode(PLAIN, {"HP_GPU_MODE": "devices"}).why == "forced by HP_GPU_MODE"
    assert choose_mode(TOOLKIT, {"HP_GPU_MODE": " Runtime "}).mode == "runtime"
    assert choose_mode(CDI, {"HP_GPU_MODE": "cdi"}).mode == "cdi"
    assert choose_mode(TOOLKIT, {"HP_GPU_MODE": ""}).mode == "runtime"
    with pytest.raises(GpuWiringError, match="no 'nvidia' runtime.*io.containerd.runc.v2, runc"):
        choose_mode(PLAIN, {"HP_GPU_MODE": "runtime"})
    with pytest.raises(GpuWiringError, match="CDI is not enabled"):
        choose_mode(PLAIN, {"HP_GPU_MODE": "cdi"})
    with pytest.raises(GpuWiringError, match="no nvidia.com/gpu device"):
        choose_mode(CDI, {"HP_GPU_MODE": "cdi"}, cdi_devices=[])
    with pytest.raises(GpuWiringError, match="must be one of auto, runtime, cdi, devices"):
        choose_mode(PLAIN, {"HP_GPU_MODE": "toolkit"})


def test_devices_mode_real_h200():
    """The lent host's way: four device nodes and the driver folder's files, read-only."""
    w = wire(
        "devices",
        [H200],
        driver=DRIVER,
        host_devices=["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"],
    )
    assert w.devices == (
        "/dev/nvidia0:/dev/nvidia0:rwm",
        "/dev/nvidiactl:/dev/nvidiactl:rwm",
        "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm",
        "/dev/nvidia-uvm-tools:/dev/nvidia-uvm-tools:rwm",
    )
    assert set(w.binds) == {
        "/usr/local/nvidia/lib64/libcuda.so.1:/usr/lib/x86_64-linux-gnu/libcuda.so.1:ro",
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1:/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1:ro",
        "/usr/local/nvidia/bin/nvidia-smi:/usr/bin/nvidia-smi:ro",
    }
    assert w.device_requests == () and w.proc_filtered is False and w.gpu_ids == (UUID,)
    assert w.device_files == ("/dev/nvidia0",) and w.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    hc = w.host_config()
    assert hc["devices"] == list(w.devices) and hc["binds"] == list(w.binds) and "device_requests" not in hc
    assert w.volumes()["/usr/local/nvidia/bin/nvidia-smi"] == {"bind": "/usr/bin/nvidia-smi", "mode": "ro"}
    assert w.labels() == {"io.hp.gpu-mode": "devices"}


def test_devices_mode_problems():
    """Changed in a copy of the H200 record: minor number unknown; driver files incomplete; a device node
    missing on the host."""
    no_minor = GpuRecord(index=0, uuid=UUID, name="NVIDIA H200", model="h200")
    with pytest.raises(GpuWiringError, match="minor number unknown"):
        wire("devices", [no_minor], driver=DRIVER)
    with pytest.raises(GpuWiringError, match="needs the driver's files"):
        wire("devices", [H200])
    with pytest.raises(GpuWiringError, match="missing libcuda, nvidia-smi"):
        wire("devices", [H200], driver=driver_files(listing=["/usr/local/nvidia/lib64/libnvidia-ml.so.1"]))
    with pytest.raises(GpuWiringError, match="missing GPU device node.*nvidia-uvm"):
        wire("devices", [H200], driver=DRIVER, host_devices=["/dev/nvidia0", "/dev/nvidiactl"])
    with pytest.raises(GpuWiringError, match="no GPUs"):
        wire("devices", [], driver=DRIVER)
    with pytest.raises(GpuWiringError, match="unknown GPU mode 'toolkit'"):
        wire("toolkit", [H200])


def test_runtime_and_cdi_modes():
    """Two GPUs: the real H200 and a copy at a lower PCI bus id (index 1, minor 1): ordered by bus id."""
    other = GpuRecord(
        index=1, uuid="GPU-other", name="NVIDIA H200", model="h200", pci_bus_id="00000000:00:05.0", minor_number=1
    )
    r = wire("runtime", [H200, other])
    assert r.device_requests == ({"driver": "nvidia", "device_ids": ["GPU-other", UUID], "capabilities": [["gpu"]]},)
    assert r.proc_filtered and r.env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert r.device_files == ("/dev/nvidia1", "/dev/nvidia0") and r.devices == () and r.binds == ()
    assert r.host_config() == {"device_requests": [dict(r.device_requests[0])]}
    c = wire("cdi", [H200, other], cdi_devices=[f"nvidia.com/gpu={UUID}", "nvidia.com/gpu=1"])
    assert c.device_requests[0] == {"driver": "cdi", "device_ids": ["nvidia.com/gpu=1", f"nvidia.com/gpu={UUID}"]}
    assert not c.proc_filtered
    assert wire("cdi", [H200]).device_requests[0]["device_ids"] == [f"nvidia.com/gpu={UUID}"]
    with pytest.raises(GpuWiringError, match="has no CDI device"):
        wire("cdi", [H200], cdi_devices=["nvidia.com/gpu=7"])


def test_docker_py_accepts_the_host_config():
    """What host_config() gives is what docker-py's create_host_config takes (no engine needed)."""
    docker = pytest.importorskip("docker")
    w = wire("runtime", [H200])
    hc = docker.types.HostConfig(version="1.41", **w.host_config())
    assert hc["DeviceRequests"][0]["Driver"] == "nvidia" and hc["DeviceRequests"][0]["DeviceIDs"] == [UUID]
    d = wire("devices", [H200], driver=DRIVER)
    hc = docker.types.HostConfig(version="1.41", **d.host_config())
    assert hc["Devices"][0] == {
        "PathOnHost": "/dev/nvidia0",
        "PathInContainer": "/dev/nvidia0",
        "CgroupPermissions": "rwm",
    }
    assert "/usr/local/nvidia/bin/nvidia-smi:/usr/bin/nvidia-smi:ro" in hc["Binds"]
    assert isinstance(d, GpuWiring)
