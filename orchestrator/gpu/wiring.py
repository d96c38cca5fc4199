"""How a node container gets its GPUs: decided from the engine, overridable, pure.

Three modes (``HP_GPU_MODE=runtime|cdi|devices``, default ``auto``):

runtime
    The engine has the NVIDIA container toolkit (``nvidia`` in ``docker info``'s
    Runtimes). A DeviceRequest ``{"driver": "nvidia", "device_ids": [UUID...]}``
    (``docker run --gpus``): the toolkit's hook adds the device nodes, the driver's
    libraries and nvidia-smi, and masks ``/proc/driver/nvidia/gpus`` down to the
    node's GPUs (so Slurm's ``AutoDetect`` sees only them).
cdi
    The engine has CDI enabled (``CDISpecDirs`` in ``docker info``, Docker >= 25)
    and a spec for ``nvidia.com/gpu`` (``nvidia-ctk cdi generate``). A DeviceRequest
    ``{"driver": "cdi", "device_ids": ["nvidia.com/gpu=<UUID or index>"]}``
    (``docker run --device nvidia.com/gpu=...``). The generated spec mounts device
    nodes and libraries; it does not mask /proc/driver/nvidia, so gres.conf names
    the device files instead of auto-detecting.
devices
    No toolkit (the lent H200 host, most CI runners with a GPU): the GPUs' device
    nodes (``/dev/nvidiaN`` at its host minor number, ``/dev/nvidiactl``,
    ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``) as ``devices`` with ``rwm``, and
    the driver's user-space files (discovery.driver_files) bound read-only where
    the image's loader and PATH find them. ``/proc/driver/nvidia`` is the host's
    (Docker refuses mounts inside /proc), so it lists every host GPU: gres.conf
    must name the device files.

Device nodes keep their host path: NVML and libcuda open ``/dev/nvidia<minor>``
for the minor the driver reports, so a renamed node would be a different GPU.

:class:`GpuWiring` is plain data; :meth:`GpuWiring.host_config` gives the
docker-py ``create_host_config`` keyword arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..naming import L_GPU_MODE
from .discovery import DiscoveryError, DriverFiles, GpuRecord, device_nodes

MODES = ("runtime", "cdi", "devices")
ENV_MODE = "HP_GPU_MODE"
CDI_KIND = "nvidia.com/gpu"


class GpuWiringError(ValueError):
    """A node's GPUs cannot be given to it in the chosen (or forced) way."""


@dataclass(frozen=True)
class ModeChoice:
    mode: str
    why: str


def engine_runtimes(info: Mapping[str, Any]) -> list[str]:
    rt = info.get("Runtimes") or {}
    return sorted(rt) if isinstance(rt, Mapping) else []


def engine_cdi_dirs(info: Mapping[str, Any]) -> list[str]:
    dirs = info.get("CDISpecDirs") or []
    return [str(d) for d in dirs] if isinstance(dirs, list) else []


def choose_mode(
    info: Mapping[str, Any], env: Mapping[str, str] | None = None, cdi_devices: Sequence[str] | None = None
) -> ModeChoice:
    """The mode for this engine. `info` is ``docker info`` (docker-py
    ``client.info()``); `env` holds HP_GPU_MODE (the caller passes os.environ);
    `cdi_devices` are the CDI device names the host's specs declare, when the
    caller listed them (None: not looked at).

    auto: runtime when the engine lists an ``nvidia`` runtime, else CDI when CDI
    is enabled and (as far as known) a ``nvidia.com/gpu`` device is declared,
    else devices. A forced mode the engine cannot do raises GpuWiringError
    naming what the engine has.
    """
    want = (env or {}).get(ENV_MODE, "auto").strip().lower() or "auto"
    runtimes = engine_runtimes(info)
    cdi_dirs = engine_cdi_dirs(info)
    has_nvidia_cdi = cdi_devices is None or any(d.startswith(CDI_KIND + "=") for d in cdi_devices)
    if want not in (*MODES, "auto"):
        raise GpuWiringError(f"{ENV_MODE}={want!r}: must be one of auto, {', '.join(MODES)}")
    if want == "runtime":
        if "nvidia" not in runtimes:
            raise GpuWiringError(
                f"{ENV_MODE}=runtime, but the engine has no 'nvidia' runtime "
                f"(runtimes: {', '.join(runtimes) or 'none'}): install the NVIDIA container "
                f"toolkit, or use {ENV_MODE}=devices"
            )
        return ModeChoice("runtime", f"forced by {ENV_MODE}")
    if want == "cdi":
        if not cdi_dirs:
            raise GpuWiringError(
                f"{ENV_MODE}=cdi, but CDI is not enabled in the engine (no CDISpecDirs in "
                "docker info; Docker >= 25 with the 'cdi' feature)"
            )
        if not has_nvidia_cdi:
            raise GpuWiringError(
                f"{ENV_MODE}=cdi, but no {CDI_KIND} device in the CDI specs under "
                f"{', '.join(cdi_dirs)} (run nvidia-ctk cdi generate on the host)"
            )
        return ModeChoice("cdi", f"forced by {ENV_MODE}")
    if want == "devices":
        return ModeChoice("devices", f"forced by {ENV_MODE}")
    if "nvidia" in runtimes:
        return ModeChoice("runtime", "the engine has the nvidia runtime (NVIDIA container toolkit)")
    if cdi_dirs and has_nvidia_cdi and cdi_devices is not None:
        return ModeChoice("cdi", f"CDI is enabled ({', '.join(cdi_dirs)}) with {CDI_KIND} devices")
    why = "no nvidia runtime"
    if cdi_dirs:
        why += f" and no {CDI_KIND} devices known in the CDI specs"
    else:
        why += " and no CDI"
    return ModeChoice("devices", why + " in the engine: device nodes and the driver's files mounted read-only")


@dataclass(frozen=True)
class GpuWiring:
    """What the Docker layer adds to a node container's host config.

    devices: "host:container:rwm" device mappings.
    binds: "host:container:ro" bind mounts.
    device_requests: DeviceRequest keyword mappings (docker-py accepts them as
        dicts: ``DeviceRequest(**d)``).
    env: environment for the container.
    proc_filtered: the container's /proc/driver/nvidia/gpus lists only its own
        GPUs, so Slurm's AutoDetect=nvidia would count right (runtime mode only).
    """

    mode: str
    gpu_ids: tuple[str, ...]
    devices: tuple[str, ...] = ()
    binds: tuple[str, ...] = ()
    device_requests: tuple[Mapping[str, Any], ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    proc_filtered: bool = False
    device_files: tuple[str, ...] = ()

    def host_config(self) -> dict[str, Any]:
        """Keyword arguments for docker-py's ``APIClient.create_host_config``
        (merged by the caller with its own binds and devices)."""
        out: dict[str, Any] = {}
        if self.devices:
            out["devices"] = list(self.devices)
        if self.binds:
            out["binds"] = list(self.binds)
        if self.device_requests:
            out["device_requests"] = [dict(d) for d in self.device_requests]
        return out

    def volumes(self) -> dict[str, dict[str, str]]:
        """The binds in ``containers.run(volumes=...)`` form."""
        out = {}
        for b in self.binds:
            host, ctr, mode = b.rsplit(":", 2)
            out[host] = {"bind": ctr, "mode": mode}
        return out

    def labels(self) -> dict[str, str]:
        return {L_GPU_MODE: self.mode}


def _cdi_name(g: GpuRecord, cdi_devices: Sequence[str] | None) -> str:
    by_uuid = f"{CDI_KIND}={g.uuid}"
    by_index = f"{CDI_KIND}={g.index}"
    if cdi_devices is None or by_uuid in cdi_devices:
        return by_uuid
    if by_index in cdi_devices:
        return by_index
    raise GpuWiringError(f"GPU {g.index} ({g.uuid}) has no CDI device (declared: {', '.join(cdi_devices) or 'none'})")


def wire(
    mode: str,
    gpus: Sequence[GpuRecord],
    *,
    driver: DriverFiles | None = None,
    host_devices: Sequence[str] | None = None,
    cdi_devices: Sequence[str] | None = None,
) -> GpuWiring:
    """The wiring of a node that gets `gpus` (from discovery) in `mode`.

    devices mode needs `driver` (discovery.driver_files) with libnvidia-ml,
    libcuda and nvidia-smi, and every GPU's minor number; `host_devices` (the
    host's /dev/nvidia* entries), when given, is checked for the nodes needed.
    GPUs are ordered by PCI bus id (Slurm numbers them so, and
    CUDA_DEVICE_ORDER=PCI_BUS_ID makes CUDA agree).
    """
    if mode not in MODES:
        raise GpuWiringError(f"unknown GPU mode {mode!r} (known: {', '.join(MODES)})")
    if not gpus:
        raise GpuWiringError("no GPUs to wire")
    ordered = sorted(gpus, key=lambda g: (g.pci_bus_id.lower(), g.index))
    ids = tuple(g.uuid or str(g.index) for g in ordered)
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if mode == "runtime":
        return GpuWiring(
            mode,
            ids,
            device_requests=({"driver": "nvidia", "device_ids": list(ids), "capabilities": [["gpu"]]},),
            env={**env, "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
            proc_filtered=True,
            device_files=tuple(f"/dev/nvidia{g.minor_number}" for g in ordered if g.minor_number is not None),
        )
    if mode == "cdi":
        names = [_cdi_name(g, cdi_devices) for g in ordered]
        return GpuWiring(
            mode,
            ids,
            device_requests=({"driver": "cdi", "device_ids": names},),
            env=env,
            device_files=tuple(f"/dev/nvidia{g.minor_number}" for g in ordered if g.minor_number is not None),
        )
    no_minor = [str(g.index) for g in ordered if g.minor_number is None]
    if no_minor:
        raise GpuWiringError(f"GPU(s) {', '.join(no_minor)}: minor number unknown, cannot name /dev/nvidiaN")
    if driver is None:
        raise GpuWiringError("devices mode needs the driver's files (discovery.driver_files): none given")
    if driver.missing:
        raise GpuWiringError(
            "devices mode: the host's NVIDIA driver files are incomplete, missing "
            + ", ".join(driver.missing)
            + f" (searched by {driver.source}; set the driver folder or install the driver)"
        )
    try:
        nodes = device_nodes([g.minor_number for g in ordered if g.minor_number is not None], host_devices)
    except DiscoveryError as e:
        raise GpuWiringError(str(e)) from None
    return GpuWiring(
        mode,
        ids,
        devices=tuple(f"{d}:{d}:rwm" for d in nodes),
        binds=tuple(f"{f.host_path}:{f.container_path}:ro" for f in driver.files),
        env=env,
        device_files=tuple(f"/dev/nvidia{g.minor_number}" for g in ordered),
    )
