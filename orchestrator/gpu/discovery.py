"""GPU discovery on a Docker host, as pure functions over tool output.

Inputs (the core gets them by running a short-lived helper container on the
engine's host, so that a remote engine is described, not the machine hp runs on):

* ``nvidia-smi -q -x``  -> :func:`parse_nvidia_smi_xml`  (full per-GPU report)
* ``nvidia-smi -L``     -> :func:`parse_nvidia_smi_list` (index, name, UUID)
* ``hp_gpu_check.py --discover`` (NVML through nvidia-ml-py, in hp's GPU check
  image) -> :func:`parse_check_inventory`
* ``ldconfig -p`` (e.g. ``ldconfig -p -r /host`` with the host's root mounted
  read-only) or a listing of the driver's folder (``/usr/local/nvidia`` on hosts
  that ship the driver there) -> :func:`driver_files`

Outputs: typed :class:`GpuRecord` per GPU, :func:`instance_types_for` (types named
after what was found, ``h200.1x``, ``h100.8x`` and the divisors), and the device
nodes and driver files to mount on a host without the NVIDIA container toolkit.

Real outputs of one H200 are under tests/fixtures/gpu-h200/.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class DiscoveryError(ValueError):
    """The text is not the expected tool's output, or a GPU cannot be used."""


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------

# Product name (nvidia-smi / NVML) -> hp's short model name. First match wins, so
# the more specific forms come first. Short names are lower case, [a-z0-9-]; Slurm's
# GRES Type is the same with "-" as "_" (gres.slurm_gpu_type), which is a substring
# of what Slurm's AutoDetect reports ("NVIDIA H100 PCIe" -> "nvidia_h100_pcie").
MODEL_RULES: tuple[tuple[str, str], ...] = (
    (r"\bGH200\b", "gh200"),
    (r"\bGB200\b", "gb200"),
    (r"\bGB10\b", "gb10"),
    (r"\bB200\b", "b200"),
    (r"\bB100\b", "b100"),
    (r"\bH200\b.*\bNVL\b", "h200-nvl"),
    (r"\bH200\b", "h200"),
    (r"\bH100\b.*\bNVL\b", "h100-nvl"),
    (r"\bH100\b.*\bPCIe\b", "h100-pcie"),
    (r"\bH100\b", "h100"),
    (r"\bH800\b", "h800"),
    (r"\bA100\b.*\bPCIe\b", "a100-pcie"),
    (r"\bA100\b", "a100"),
    (r"\bA800\b", "a800"),
    (r"\bL40S\b", "l40s"),
    (r"\bL40\b", "l40"),
    (r"\bL4\b", "l4"),
    (r"\bA10G\b", "a10g"),
    (r"\bA10\b", "a10"),
    (r"\bT4\b", "t4"),
    (r"\bV100\b", "v100"),
)
KNOWN_MODELS: frozenset[str] = frozenset(m for _, m in MODEL_RULES)
_VENDOR_WORDS = re.compile(r"^(NVIDIA|Tesla|GeForce|Quadro)\b\s*", re.I)


def short_model(product_name: str) -> str:
    """hp's short model name for an NVIDIA product name.

    >>> short_model("NVIDIA H200"), short_model("NVIDIA H100 80GB HBM3")
    ('h200', 'h100')
    >>> short_model("NVIDIA A100-SXM4-80GB"), short_model("NVIDIA H100 PCIe")
    ('a100', 'h100-pcie')

    An unknown product becomes a slug of its name without the vendor words
    ("NVIDIA RTX 6000 Ada Generation" -> "rtx-6000-ada-generation").
    """
    for pattern, model in MODEL_RULES:
        if re.search(pattern, product_name):
            return model
    name = product_name.strip()
    while (m := _VENDOR_WORDS.match(name)) is not None:
        name = name[m.end() :]
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug[:40].strip("-") or "unknown"


# --------------------------------------------------------------------------
# Clock event reasons (NVML nvmlClocksEventReasons / nvidia-smi clocks_event_reasons)
# --------------------------------------------------------------------------

CLOCK_EVENT_BITS: Mapping[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks_setting",
}


def clock_event_names(mask: int) -> frozenset[str]:
    """Names of the reasons set in an NVML clocks-event-reasons bitmask; bits
    NVML may add later show as ``bit_0x...``."""
    names = {name for bit, name in CLOCK_EVENT_BITS.items() if mask & bit}
    known = sum(CLOCK_EVENT_BITS)
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.add(f"bit_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return frozenset(names)


# --------------------------------------------------------------------------
# GPU records
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class PcieLink:
    """PCIe link generation and width, current and the maximum the link can
    train to (``max_link_gen``: the lower of what the GPU and the slot support)."""

    gen: int | None = None
    gen_max: int | None = None
    width: int | None = None
    width_max: int | None = None

    @property
    def degraded(self) -> list[str]:
        """What is below the maximum, e.g. ["width x8 < x16"]."""
        out = []
        if self.width is not None and self.width_max is not None and self.width < self.width_max:
            out.append(f"width x{self.width} < x{self.width_max}")
        if self.gen is not None and self.gen_max is not None and self.gen < self.gen_max:
            out.append(f"gen {self.gen} < {self.gen_max}")
        return out


@dataclass(frozen=True)
class GpuRecord:
    """One GPU as discovered. None means the tool did not report it (N/A, Not
    Supported, or an older report format without it).

    index: nvidia-smi / NVML index (PCI bus order).
    minor_number: N of /dev/nvidiaN (not necessarily the index).
    model: hp's short model name (short_model).
    ecc_volatile_uncorrectable / _correctable: errors since the driver loaded.
    ecc_aggregate_uncorrectable: lifetime count (inforom).
    remapped_rows_pending / _failure: row remapping (A100 and later).
    retired_pages_pending: page retirement (before A100; None where unsupported).
    clock_event_reasons: active reasons, names as in CLOCK_EVENT_BITS.
    """

    index: int
    uuid: str
    name: str
    model: str
    pci_bus_id: str = ""
    minor_number: int | None = None
    memory_mib: int | None = None
    persistence_mode: bool | None = None
    compute_mode: str | None = None
    pcie: PcieLink = field(default_factory=PcieLink)
    ecc_enabled: bool | None = None
    ecc_pending_enabled: bool | None = None
    ecc_volatile_uncorrectable: int | None = None
    ecc_volatile_correctable: int | None = None
    ecc_aggregate_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    remapped_rows_uncorrectable: int | None = None
    retired_pages_pending: bool | None = None
    clock_event_reasons: frozenset[str] = frozenset()
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    mig_enabled: bool | None = None


@dataclass(frozen=True)
class HostGpus:
    """Every GPU of one host, with the driver's versions."""

    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[GpuRecord, ...]

    def by_model(self) -> dict[str, list[GpuRecord]]:
        out: dict[str, list[GpuRecord]] = {}
        for g in sorted(self.gpus, key=lambda g: g.index):
            out.setdefault(g.model, []).append(g)
        return out

    def find(self, gpu_id: str) -> GpuRecord:
        """A GPU by index ("0"), UUID ("GPU-...") or PCI bus id, the ids hp's
        capacity pool and Docker's DeviceRequest use."""
        for g in self.gpus:
            if gpu_id in (str(g.index), g.uuid) or (g.pci_bus_id and gpu_id.lower() == g.pci_bus_id.lower()):
                return g
        raise DiscoveryError(
            f"no GPU {gpu_id!r} on this host (have: " + ", ".join(f"{g.index} {g.uuid}" for g in self.gpus) + ")"
        )


_NA = {
    "n/a",
    "[n/a]",
    "not supported",
    "[not supported]",
    "unknown error",
    "[unknown error]",
    "requested functionality has been deprecated",
    "not available",
    "[insufficient permissions]",
    "insufficient permissions",
    "none",
    "",
}
_TRUE = {"enabled", "yes", "active", "true"}
_FALSE = {"disabled", "no", "not active", "false"}


def _text(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    node = el.find(path)
    if node is None or node.text is None:
        return None
    text = node.text.strip()
    return None if text.lower() in _NA else text


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    m = re.match(r"\s*(-?\d+)", text)
    return int(m.group(1)) if m else None


def _float(text: str | None) -> float | None:
    if text is None:
        return None
    m = re.match(r"\s*(-?\d+(?:\.\d+)?)", text)
    return float(m.group(1)) if m else None


def _bool(text: str | None) -> bool | None:
    if text is None:
        return None
    t = text.lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    return None


def _ecc_counts(volatile: ET.Element | None) -> tuple[int | None, int | None]:
    """(uncorrectable, correctable) of an ecc_errors/volatile (or aggregate)
    element, across report formats: Hopper drivers list sram_uncorrectable_parity,
    sram_uncorrectable_secded and dram_uncorrectable; A100-era ones sram_/dram_
    (un)correctable; older ones single_bit/total and double_bit/total."""
    if volatile is None:
        return None, None
    dbe = _int(_text(volatile, "double_bit/total"))
    sbe = _int(_text(volatile, "single_bit/total"))
    if dbe is not None or sbe is not None:
        return dbe, sbe
    unc: int | None = None
    cor: int | None = None
    for child in volatile:
        value = _int(_text(volatile, child.tag))
        if value is None:
            continue
        if "uncorrectable" in child.tag:
            unc = (unc or 0) + value
        elif "correctable" in child.tag:
            cor = (cor or 0) + value
    return unc, cor


def _clock_reasons(gpu: ET.Element) -> frozenset[str]:
    for container, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        el = gpu.find(container)
        if el is None:
            continue
        active = set()
        for child in el:
            if _bool(_text(el, child.tag)):
                name = child.tag[len(prefix) :] if child.tag.startswith(prefix) else child.tag
                active.add("hw_power_brake_slowdown" if name == "hw_power_brake" else name)
        return frozenset(active)
    return frozenset()


def _gpu_from_xml(gpu: ET.Element, position: int) -> GpuRecord:
    name = _text(gpu, "product_name") or "unknown"
    link = gpu.find("pci/pci_gpu_link_info")
    pcie = PcieLink(
        gen=_int(_text(link, "pcie_gen/current_link_gen")),
        gen_max=_int(_text(link, "pcie_gen/max_link_gen")),
        width=_int(_text(link, "link_widths/current_link_width")),
        width_max=_int(_text(link, "link_widths/max_link_width")),
    )
    unc, cor = _ecc_counts(gpu.find("ecc_errors/volatile"))
    agg_unc, _ = _ecc_counts(gpu.find("ecc_errors/aggregate"))
    retired = _text(gpu, "retired_pages/pending_retirement") or _text(gpu, "retired_pages/pending_blacklist")
    power = gpu.find("gpu_power_readings")
    if power is None:
        power = gpu.find("power_readings")
    minor = _int(_text(gpu, "minor_number"))
    return GpuRecord(
        index=position,
        uuid=_text(gpu, "uuid") or "",
        name=name,
        model=short_model(name),
        pci_bus_id=_text(gpu, "pci/pci_bus_id") or gpu.get("id", ""),
        minor_number=minor,
        memory_mib=_int(_text(gpu, "fb_memory_usage/total")),
        persistence_mode=_bool(_text(gpu, "persistence_mode")),
        compute_mode=_text(gpu, "compute_mode"),
        pcie=pcie,
        ecc_enabled=_bool(_text(gpu, "ecc_mode/current_ecc")),
        ecc_pending_enabled=_bool(_text(gpu, "ecc_mode/pending_ecc")),
        ecc_volatile_uncorrectable=unc,
        ecc_volatile_correctable=cor,
        ecc_aggregate_uncorrectable=agg_unc,
        remapped_rows_pending=_bool(_text(gpu, "remapped_rows/remapped_row_pending")),
        remapped_rows_failure=_bool(_text(gpu, "remapped_rows/remapped_row_failure")),
        remapped_rows_uncorrectable=_int(_text(gpu, "remapped_rows/remapped_row_unc")),
        retired_pages_pending=_bool(retired),
        clock_event_reasons=_clock_reasons(gpu),
        temperature_c=_int(_text(gpu, "temperature/gpu_temp")),
        power_w=_float(_text(power, "instant_power_draw") or _text(power, "power_draw")),
        power_limit_w=_float(_text(power, "current_power_limit") or _text(power, "power_limit")),
        mig_enabled=_bool(_text(gpu, "mig_mode/current_mig")),
    )


def parse_nvidia_smi_xml(text: str) -> HostGpus:
    """Parse ``nvidia-smi -q -x``. GPUs are numbered in document order, which
    is nvidia-smi's index order (PCI bus id). Raises DiscoveryError when the
    text is not an ``nvidia_smi_log`` document."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as e:
        raise DiscoveryError(f"nvidia-smi -q -x: not XML: {e}") from None
    if root.tag != "nvidia_smi_log":
        raise DiscoveryError(f"nvidia-smi -q -x: root element is <{root.tag}>, not <nvidia_smi_log>")
    gpus = tuple(_gpu_from_xml(g, i) for i, g in enumerate(root.findall("gpu")))
    attached = _int(_text(root, "attached_gpus"))
    if attached is not None and attached != len(gpus):
        raise DiscoveryError(f"nvidia-smi -q -x: attached_gpus says {attached}, the report has {len(gpus)} <gpu>")
    return HostGpus(driver_version=_text(root, "driver_version"), cuda_version=_text(root, "cuda_version"), gpus=gpus)


@dataclass(frozen=True)
class ListedGpu:
    """One ``nvidia-smi -L`` line; mig: the MIG device UUIDs listed under it."""

    index: int
    name: str
    uuid: str
    model: str
    mig: tuple[str, ...] = ()


_LIST_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9A-Fa-f-]+)\)\s*$")
_LIST_MIG = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)]+)\)\s*$")


def parse_nvidia_smi_list(text: str) -> list[ListedGpu]:
    """Parse ``nvidia-smi -L``. Lines that are neither a GPU nor a MIG device
    (an error such as "No devices were found", "NVIDIA-SMI has failed ...")
    raise DiscoveryError, quoting the line: a driver that does not answer must
    not read as zero GPUs. Empty text is zero GPUs."""
    out: list[ListedGpu] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if m := _LIST_GPU.match(line):
            out.append(ListedGpu(int(m.group(1)), m.group(2), m.group(3), short_model(m.group(2))))
        elif (m := _LIST_MIG.match(line)) and out:
            last = out[-1]
            out[-1] = ListedGpu(last.index, last.name, last.uuid, last.model, last.mig + (m.group(1),))
        else:
            raise DiscoveryError(f"nvidia-smi -L: unexpected line: {line.strip()[:200]}")
    return out


def parse_check_inventory(doc: Mapping[str, Any] | str) -> HostGpus:
    """GPUs from the ``software`` part of hp_gpu_check.py's JSON (``--discover``
    prints only that part). Raises DiscoveryError when NVML did not answer."""
    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except json.JSONDecodeError as e:
            raise DiscoveryError(f"hp_gpu_check --discover: not JSON: {e}") from None
    if not isinstance(doc, Mapping):
        raise DiscoveryError("hp_gpu_check --discover: JSON is not an object")
    sw = doc.get("software")
    if not isinstance(sw, Mapping):
        raise DiscoveryError("hp_gpu_check --discover: no 'software' part")
    if sw.get("status") != "ok":
        raise DiscoveryError(f"hp_gpu_check --discover: NVML did not answer: {sw.get('why') or 'no reason given'}")
    gpus = []
    for g in sw.get("gpus") or []:
        name = str(g.get("name") or "unknown")
        mib = g.get("memory_total_bytes")
        gpus.append(
            GpuRecord(
                index=int(g["index"]),
                uuid=str(g.get("uuid") or ""),
                name=name,
                model=short_model(name),
                pci_bus_id=str(g.get("pci_bus_id") or ""),
                minor_number=g.get("minor_number") if isinstance(g.get("minor_number"), int) else None,
                memory_mib=int(mib) // 2**20 if isinstance(mib, int) else None,
                persistence_mode=g.get("persistence_mode") if isinstance(g.get("persistence_mode"), bool) else None,
                compute_mode=g.get("compute_mode") if isinstance(g.get("compute_mode"), str) else None,
            )
        )
    return HostGpus(
        driver_version=sw.get("driver_version"),
        cuda_version=_cuda_version(sw.get("cuda_driver_version")),
        gpus=tuple(gpus),
    )


def _cuda_version(v: Any) -> str | None:
    """NVML's CUDA driver version 13000 -> "13.0"."""
    if isinstance(v, int) and v > 0:
        return f"{v // 1000}.{(v % 1000) // 10}"
    return None


# --------------------------------------------------------------------------
# Instance types named after what is found
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuInstanceType:
    """An instance type backed by `gpus` GPUs of one model, in the catalogue's
    shape (catalogue_entry) plus the model it needs."""

    name: str
    gpu_model: str
    gpus: int
    vcpus: int
    cpu_limit: float
    memory_mib: int

    def catalogue_entry(self) -> dict[str, Any]:
        """The instance-types.yaml mapping for this type (GpuModel is extra:
        the catalogue ignores keys it does not know)."""
        return {
            "VCpus": self.vcpus,
            "CpuLimit": self.cpu_limit,
            "MemoryMiB": self.memory_mib,
            "Gpus": self.gpus,
            "GpuModel": self.gpu_model,
        }


def type_sizes(n: int) -> list[int]:
    """GPU counts offered for a host with n GPUs of a model: the powers of two
    up to n, and n itself (8 -> 1, 2, 4, 8; 6 -> 1, 2, 4, 6)."""
    if n <= 0:
        return []
    sizes = [1 << i for i in range(n.bit_length()) if (1 << i) <= n]
    if sizes[-1] != n:
        sizes.append(n)
    return sizes


def instance_types_for(
    gpus: Sequence[GpuRecord], host_cpus: float, host_memory_mib: int, *, memory_share: float = 0.9
) -> list[GpuInstanceType]:
    """Instance types for the GPUs found on a host, named ``<model>.<N>x``.

    Each GPU carries an equal share of the host: a type with k of the host's n
    GPUs (all models together) gets k/n of its CPUs (at least 1; the CPU limit is
    a cgroup ceiling, like the CPU types) and k/n of ``memory_share`` of its
    memory (the rest stays for the controller, login node and the host), in
    whole GiB. One H200 on a 16-CPU, 128 GiB host: ``h200.1x`` with 16 CPUs and
    115 GiB. Eight H100: ``h100.1x``, ``h100.2x``, ``h100.4x``, ``h100.8x``.
    """
    total = len(gpus)
    if total == 0:
        return []
    if host_cpus <= 0 or host_memory_mib <= 0:
        raise DiscoveryError(f"host with {host_cpus} CPUs and {host_memory_mib} MiB cannot back GPU nodes")
    by_model: dict[str, int] = {}
    for g in gpus:
        by_model[g.model] = by_model.get(g.model, 0) + 1
    out = []
    for model in sorted(by_model):
        for k in type_sizes(by_model[model]):
            cpus = max(1, math.floor(host_cpus * k / total))
            mem = max(1024, math.floor(host_memory_mib * memory_share * k / total / 1024) * 1024)
            out.append(GpuInstanceType(f"{model}.{k}x", model, k, cpus, float(cpus), mem))
    return out


# --------------------------------------------------------------------------
# No-toolkit mode: device nodes and driver files
# --------------------------------------------------------------------------

CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
REQUIRED_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm")

# The driver's user-space libraries a container needs (libnvidia-container's
# "utility" and "compute" sets), by name without the .so version.
DRIVER_LIBRARIES: Mapping[str, str] = {
    "libnvidia-ml": "NVML: nvidia-smi, nvidia-ml-py, DCGM, Slurm AutoDetect=nvml",
    "libcuda": "the CUDA driver API: every CUDA program",
    "libnvidia-ptxjitcompiler": "PTX JIT: CUDA code shipped as PTX only",
    "libnvidia-nvvm": "NVVM JIT and JIT LTO (CUDA >= 11.4 link-time optimisation)",
    "libnvidia-gpucomp": "shared compiler backend of the JIT libraries (drivers >= 545)",
    "libcudadebugger": "cuda-gdb support",
    "libnvidia-allocator": "GPU memory allocator used by some CUDA libraries",
    "libnvidia-cfg": "nvidia-smi configuration queries",
    "libnvidia-opencl": "OpenCL",
    "libnvidia-pkcs11": "nvidia-smi confidential-computing attestation",
    "libnvidia-pkcs11-openssl3": "nvidia-smi confidential-computing attestation (OpenSSL 3)",
    "libnvidia-fatbinaryloader": "fat binary loader (drivers <= 440)",
    "libnvidia-compiler": "OpenCL compiler (older drivers)",
}
REQUIRED_LIBRARIES = ("libnvidia-ml", "libcuda")
DRIVER_BINARIES: Mapping[str, str] = {
    "nvidia-smi": "the driver's management tool",
    "nvidia-debugdump": "GPU state dumps for bug reports",
    "nvidia-cuda-mps-control": "CUDA MPS",
    "nvidia-cuda-mps-server": "CUDA MPS",
}
REQUIRED_BINARIES = ("nvidia-smi",)
_TRIPLET = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
_SO_VERSION = re.compile(r"\.so(\.[0-9.]+)?$")


def _lib_base(name: str) -> str | None:
    """'libcuda.so.580.159.04' -> 'libcuda'; None for a name that is not a .so."""
    m = _SO_VERSION.search(name)
    return name[: m.start()] if m else None


@dataclass(frozen=True)
class DriverFile:
    """A driver file on the host and where a container gets it (read-only).

    Libraries go to the image's standard multiarch library folder and binaries
    to /usr/bin, so that the dynamic loader and PATH find them in every process
    of the node, including Slurm job steps whose environment comes from the
    login node (an LD_LIBRARY_PATH or PATH set on the node container would not
    reach them)."""

    host_path: str
    container_path: str
    kind: str  # "lib" or "bin"
    base: str  # "libcuda", "nvidia-smi"


@dataclass(frozen=True)
class DriverFiles:
    files: tuple[DriverFile, ...]
    source: str  # "ldconfig", "listing"

    @property
    def missing(self) -> list[str]:
        """Required files not found (libnvidia-ml, libcuda, nvidia-smi)."""
        have = {f.base for f in self.files}
        return [x for x in (*REQUIRED_LIBRARIES, *REQUIRED_BINARIES) if x not in have]

    def versions(self) -> dict[str, set[str]]:
        """Driver versions seen in versioned file names (libcuda.so.580.159.04)
        per library: two versions, or one that differs from the loaded kernel
        module, make NVML fail with "Driver/library version mismatch"."""
        out: dict[str, set[str]] = {}
        for f in self.files:
            m = re.search(r"\.so\.(\d+\.\d+(?:\.\d+)?)$", f.host_path)
            if f.kind == "lib" and m:
                out.setdefault(f.base, set()).add(m.group(1))
        return out

    def version_problems(self, driver_version: str | None) -> list[str]:
        probs = []
        for base, vers in sorted(self.versions().items()):
            if len(vers) > 1:
                probs.append(f"{base}: several driver versions on the host ({', '.join(sorted(vers))})")
            elif driver_version and vers != {driver_version}:
                probs.append(f"{base} is version {next(iter(vers))}, the loaded driver is {driver_version}")
        return probs


_LDCONFIG = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")


def _arch_of(flags: str) -> str | None:
    f = flags.lower()
    if "x86-64" in f:
        return "x86_64"
    if "aarch64" in f:
        return "aarch64"
    return None  # 32-bit (libc6 alone) or another ABI


def driver_files(
    *, ldconfig: str | None = None, listing: Iterable[str] = (), binaries: Iterable[str] = (), machine: str = "x86_64"
) -> DriverFiles:
    """The driver's files to bind read-only into a node container.

    ldconfig: ``ldconfig -p`` text; only 64-bit entries of `machine` are kept.
    listing: absolute paths of files under the driver's folder (e.g. every file
        of /usr/local/nvidia/lib64 and /usr/local/nvidia/bin); 32-bit folders
        (lib/, lib32/, i386-linux-gnu/) are skipped when lib64 has the name.
    binaries: absolute paths of driver binaries found on the host's PATH
        (``command -v nvidia-smi``), for the ldconfig case.
    Libraries are known by name (DRIVER_LIBRARIES), each soname once; the
    container path is /usr/lib/<multiarch>/<name>, binaries /usr/bin/<name>.
    """
    if machine not in _TRIPLET:
        raise DiscoveryError(f"unsupported machine {machine!r} (supported: {', '.join(sorted(_TRIPLET))})")
    libdir = f"/usr/lib/{_TRIPLET[machine]}"
    chosen: dict[str, DriverFile] = {}
    source = "listing"
    if ldconfig is not None:
        source = "ldconfig"
        for line in ldconfig.splitlines():
            m = _LDCONFIG.match(line)
            if not m:
                continue
            name, flags, path = m.groups()
            base = _lib_base(name)
            if base not in DRIVER_LIBRARIES or _arch_of(flags) != machine or name in chosen:
                continue
            chosen[name] = DriverFile(path, f"{libdir}/{name}", "lib", base)
    ranked: list[tuple[int, str]] = []
    for path in listing:
        parts = path.split("/")
        rank = 1 if any(p in ("lib", "lib32", "i386-linux-gnu") for p in parts[:-1]) else 0
        ranked.append((rank, path))
    for _rank, path in sorted(ranked):
        name = path.rsplit("/", 1)[-1]
        base = _lib_base(name)
        if base in DRIVER_LIBRARIES:
            if name not in chosen and _rank == 0:
                chosen[name] = DriverFile(path, f"{libdir}/{name}", "lib", base)
        elif name in DRIVER_BINARIES and name not in chosen:
            chosen[name] = DriverFile(path, f"/usr/bin/{name}", "bin", name)
    for path in binaries:
        name = path.rsplit("/", 1)[-1]
        if name in DRIVER_BINARIES and name not in chosen:
            chosen[name] = DriverFile(path, f"/usr/bin/{name}", "bin", name)
    files = tuple(sorted(chosen.values(), key=lambda f: (f.kind, f.container_path)))
    return DriverFiles(files, source)


def device_nodes(minors: Iterable[int], present: Iterable[str] | None = None) -> list[str]:
    """Device nodes for GPUs with these minor numbers: /dev/nvidiaN each, plus
    /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia-uvm-tools (the last is
    optional: CUDA profilers use it). With `present` (the host's /dev/nvidia*
    entries) a missing required node raises DiscoveryError saying how to make it
    (nvidia-uvm nodes appear once the module is loaded: ``nvidia-modprobe -u -c=0``
    on the host)."""
    wanted = [f"/dev/nvidia{m}" for m in sorted(set(minors))] + list(CONTROL_DEVICES)
    if present is None:
        return wanted
    have = set(present)
    missing = [d for d in wanted if d not in have and d != "/dev/nvidia-uvm-tools"]
    if missing:
        hint = (
            " (load nvidia-uvm and make its nodes on the host: nvidia-modprobe -u -c=0)"
            if any("uvm" in d for d in missing)
            else ""
        )
        raise DiscoveryError("missing GPU device node(s) on the host: " + ", ".join(missing) + hint)
    return [d for d in wanted if d in have]
