"""What GPUs a Docker host has, found through the Provider only (so that a remote
engine is described, not the machine hp runs on), cached per engine in hp's store.

Step 1, always: a short container of hp's base image, with the host's /dev, /etc,
/usr/bin and /usr/local (and $HP_NVIDIA_DRIVER_DIR, and the engine's CDI spec folders)
mounted read-only under /host, prints the host's /dev/nvidia* entries, the driver's
libraries from the host's loader cache (``ldconfig -p -C /host/etc/ld.so.cache``),
its binaries, a listing of the driver's folder (``/usr/local/nvidia`` or
$HP_NVIDIA_DRIVER_DIR) and the CDI specs (PROBE_SCRIPT; parsed by parse_probe).

Step 2, only when step 1 found a /dev/nvidiaN: a container given every GPU the way
nodes get theirs (wiring.choose_mode: the NVIDIA runtime, CDI, or the device nodes
plus the driver's files read-only) runs ``nvidia-smi -q -x``; discovery.py parses it.

The result (HostGpuInfo) is cached in the store's key-value table for
HP_GPU_DISCOVERY_TTL seconds (default 120); when the engine fails during a refresh,
the last result is used. ``HP_GPUS=id[:model],...`` replaces discovery (tests, and
hosts whose GPUs hp cannot see): those GPUs are capacity only, never wired.
"""

from __future__ import annotations

import calendar
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..docker.images import base_refs
from ..docker.provider import Provider
from ..docker.views import ContainerSpec
from ..errors import TRANSIENT
from ..naming import L_MANAGED, L_ROLE
from ..state.store import Store
from .discovery import (
    DiscoveryError,
    DriverFile,
    DriverFiles,
    GpuInstanceType,
    GpuRecord,
    driver_files,
    instance_types_for,
    parse_nvidia_smi_xml,
)
from .wiring import CDI_KIND, GpuWiring, GpuWiringError, choose_mode, wire

log = logging.getLogger("hp.gpu")

ENV_GPUS = "HP_GPUS"
ENV_DRIVER_DIR = "HP_NVIDIA_DRIVER_DIR"
ENV_TTL = "HP_GPU_DISCOVERY_TTL"
DEFAULT_TTL = 120.0
DEFAULT_DRIVER_DIR = "/usr/local/nvidia"
KEY = "gpu.discovery:"  # + engine name
PROBE_TIMEOUT = 60.0
PROBE_ROLE = "gpu-probe"
BINARY_DIRS = ("/usr/bin", "/usr/local/bin")
_DEVICE = re.compile(r"^/dev/nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)$")
_GPU_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")

# Step 1. Arguments: $1 the driver folder as seen in the container ("" for none).
PROBE_SCRIPT = r"""
echo "==machine=="; uname -m
echo "==devices=="; for f in /host/dev/nvidia*; do [ -e "$f" ] && echo "${f#/host}"; done
echo "==ldconfig=="
[ -f /host/etc/ld.so.cache ] && ldconfig -p -C /host/etc/ld.so.cache 2>/dev/null | grep -E 'lib(nvidia|cuda)' || true
echo "==bins=="
for d in /host/usr/bin /host/usr/local/bin; do
  for f in "$d"/nvidia-smi "$d"/nvidia-debugdump "$d"/nvidia-cuda-mps-control "$d"/nvidia-cuda-mps-server; do
    [ -e "$f" ] && echo "${f#/host}"
  done
done
echo "==listing=="
[ -n "$1" ] && [ -d "$1" ] && find "$1" -maxdepth 3 \( -type f -o -type l \) 2>/dev/null | sort
for f in /host/cdi/*/*.yaml /host/cdi/*/*.yml /host/cdi/*/*.json; do
  [ -f "$f" ] && { echo "==cdi $f=="; head -c 262144 "$f"; echo; }
done
echo "==end=="
"""


class ProbeError(DiscoveryError):
    """The probe's output is not what PROBE_SCRIPT prints."""


@dataclass(frozen=True)
class Probe:
    """What step 1 found (host paths)."""

    machine: str
    devices: tuple[str, ...]
    ldconfig: str
    binaries: tuple[str, ...]
    listing: tuple[str, ...]
    cdi_devices: tuple[str, ...] | None  # None: no CDI spec folder was looked at

    @property
    def gpu_minors(self) -> list[int]:
        return sorted(int(m.group(1)) for d in self.devices if (m := _GPU_DEVICE.match(d)))


def _cdi_names(text: str, where: str) -> list[str]:
    """Device names a CDI spec (YAML or JSON) declares: "<kind>=<name>"."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        log.info("CDI spec %s is not YAML/JSON: ignored", where)
        return []
    if not isinstance(doc, Mapping) or not isinstance(doc.get("kind"), str):
        return []
    return [f"{doc['kind']}={d['name']}" for d in doc.get("devices") or [] if isinstance(d, Mapping) and "name" in d]


def parse_probe(text: str, driver_dir: str | None, cdi_dirs: Sequence[str] = ()) -> Probe:
    """Parse PROBE_SCRIPT's output. Paths under /host are given back as the host's;
    the driver folder's listing (/host/driver/...) as paths under `driver_dir`."""
    sections: dict[str, list[str]] = {}
    cdi: list[str] = []
    cur: str | None = None
    cdi_text: list[str] = []
    cdi_where = ""
    for line in text.splitlines():
        m = re.fullmatch(r"==(\w+)(?: (.+))?==", line.strip())
        if m:
            if cur == "cdi":
                cdi += _cdi_names("\n".join(cdi_text), cdi_where)
            cur, cdi_text, cdi_where = m.group(1), [], m.group(2) or ""
            sections.setdefault(cur, [])
            continue
        if cur == "cdi":
            cdi_text.append(line)
        elif cur is not None:
            sections[cur].append(line)
    if "end" not in sections or "devices" not in sections:
        raise ProbeError("GPU probe: output incomplete: " + (text.strip()[-300:] or "nothing"))

    def host_of(p: str) -> str:
        if driver_dir and p.startswith("/host/driver"):
            return driver_dir.rstrip("/") + p[len("/host/driver") :]
        return p[len("/host") :] if p.startswith("/host/") else p

    devices = tuple(d.strip() for d in sections["devices"] if _DEVICE.match(d.strip()))
    machine = next((x.strip() for x in sections.get("machine", []) if x.strip()), "x86_64")
    return Probe(
        machine=machine,
        devices=devices,
        ldconfig="\n".join(sections.get("ldconfig", [])),
        binaries=tuple(x.strip() for x in sections.get("bins", []) if x.strip()),
        listing=tuple(host_of(x.strip()) for x in sections.get("listing", []) if x.strip()),
        cdi_devices=tuple(cdi) if cdi_dirs else None,
    )


# --------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class HostGpuInfo:
    """The GPUs of one engine's host and how to give them to containers.

    source: "discovery", "HP_GPUS" (capacity only: never wired) or "unavailable"
        (discovery could not run: `why`).
    mode: runtime | cdi | devices (wiring.MODES), "" without GPUs, "none" for HP_GPUS.
    why: why there are no GPUs (or what is wrong with them), for messages.
    """

    engine: str
    source: str
    gpus: tuple[GpuRecord, ...] = ()
    driver_version: str | None = None
    mode: str = ""
    mode_why: str = ""
    driver: DriverFiles | None = None
    devices: tuple[str, ...] = ()
    cdi_devices: tuple[str, ...] | None = None
    why: str = ""
    at: float = 0.0
    host_cpus: int = 0
    host_memory_mib: int = 0
    problems: tuple[str, ...] = ()

    @property
    def ids(self) -> list[str]:
        """The ids hp's capacity pool and labels use: UUIDs (index when none)."""
        return [gpu_id(g) for g in sorted(self.gpus, key=lambda g: g.index)]

    def model_of(self) -> dict[str, str]:
        return {gpu_id(g): g.model for g in self.gpus}

    def find(self, ident: str) -> GpuRecord:
        for g in self.gpus:
            if ident == gpu_id(g):
                return g
        raise DiscoveryError(f"no GPU {ident!r} on engine {self.engine or 'local'} (have: {', '.join(self.ids)})")

    @property
    def wired(self) -> bool:
        """Whether nodes really get these GPUs (not the HP_GPUS stand-in)."""
        return self.mode in ("runtime", "cdi", "devices")

    def wiring(self, ids: Sequence[str]) -> GpuWiring | None:
        """How a container gets these GPUs; None for HP_GPUS stand-ins (capacity only).
        Raises GpuWiringError when they cannot be given (a GPU gone, driver files missing)."""
        if not self.wired:
            return None
        try:
            recs = [self.find(i) for i in ids]
        except DiscoveryError as e:
            raise GpuWiringError(str(e)) from None
        return wire(self.mode, recs, driver=self.driver, host_devices=self.devices, cdi_devices=self.cdi_devices)

    def instance_types(self) -> list[GpuInstanceType]:
        """Types named after what was found (h200.1x, h100.8x...)."""
        if not self.gpus or self.host_cpus <= 0 or self.host_memory_mib <= 0:
            return []
        return instance_types_for(self.gpus, self.host_cpus, self.host_memory_mib)

    def summary(self) -> str:
        if not self.gpus:
            return f"no GPU ({self.why})" if self.why else "no GPU"
        models: dict[str, int] = {}
        for g in self.gpus:
            models[g.model] = models.get(g.model, 0) + 1
        what = ", ".join(f"{n} x {m}" for m, n in sorted(models.items()))
        return f"{what} ({self.source}; mode {self.mode or '-'})"

    # -- the cache's form ---------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "engine": self.engine,
                "source": self.source,
                "gpus": [_rec_doc(g) for g in self.gpus],
                "driver_version": self.driver_version,
                "mode": self.mode,
                "mode_why": self.mode_why,
                "driver": None
                if self.driver is None
                else {
                    "source": self.driver.source,
                    "files": [[f.host_path, f.container_path, f.kind, f.base] for f in self.driver.files],
                },
                "devices": list(self.devices),
                "cdi_devices": None if self.cdi_devices is None else list(self.cdi_devices),
                "why": self.why,
                "at": self.at,
                "host_cpus": self.host_cpus,
                "host_memory_mib": self.host_memory_mib,
                "problems": list(self.problems),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> HostGpuInfo:
        d = json.loads(text)
        drv = d.get("driver")
        return cls(
            engine=d["engine"],
            source=d["source"],
            gpus=tuple(_rec(x) for x in d.get("gpus") or []),
            driver_version=d.get("driver_version"),
            mode=d.get("mode", ""),
            mode_why=d.get("mode_why", ""),
            driver=None if drv is None else DriverFiles(tuple(DriverFile(*f) for f in drv["files"]), drv["source"]),
            devices=tuple(d.get("devices") or ()),
            cdi_devices=None if d.get("cdi_devices") is None else tuple(d["cdi_devices"]),
            why=d.get("why", ""),
            at=float(d.get("at", 0.0)),
            host_cpus=int(d.get("host_cpus", 0)),
            host_memory_mib=int(d.get("host_memory_mib", 0)),
            problems=tuple(d.get("problems") or ()),
        )


def gpu_id(g: GpuRecord) -> str:
    return g.uuid or str(g.index)


_REC_FIELDS = ("index", "uuid", "name", "model", "pci_bus_id", "minor_number", "memory_mib")


def _rec_doc(g: GpuRecord) -> dict[str, Any]:
    return {k: getattr(g, k) for k in _REC_FIELDS}


def _rec(d: Mapping[str, Any]) -> GpuRecord:
    return GpuRecord(**{k: d.get(k) for k in _REC_FIELDS if k in d})


# --------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------


def from_env(value: str, engine: str, cpus: int, memory_mib: int) -> HostGpuInfo:
    """HP_GPUS=id[:model],...: stand-in GPUs (capacity only), model "gpu" unless given."""
    recs = []
    for i, item in enumerate(x.strip() for x in value.split(",") if x.strip()):
        ident, _, model = item.partition(":")
        recs.append(GpuRecord(index=i, uuid=ident, name=f"HP_GPUS {ident}", model=model or "gpu"))
    return HostGpuInfo(
        engine=engine,
        source=ENV_GPUS,
        gpus=tuple(recs),
        mode="none",
        mode_why=f"{ENV_GPUS} is set: stand-in GPUs, capacity only",
        at=time.time(),
        host_cpus=cpus,
        host_memory_mib=memory_mib,
        why="" if recs else f"{ENV_GPUS} is set and empty",
    )


def probe_image(provider: Provider) -> str | None:
    """An image of hp's to run the probe in: the base image (which `hp images build`
    makes first), or the worker image."""
    for ref in (*base_refs(), "hp-worker:latest"):
        if provider.image_id(ref) is not None:
            return ref
    return None


def _probe_spec(image: str, driver_dir: str | None, cdi_dirs: Sequence[str]) -> Any:
    binds = [f"{p}:/host{p}:ro" for p in ("/dev", "/etc", "/usr/bin", "/usr/local")]
    inner = ""
    if driver_dir:
        binds.append(f"{driver_dir}:/host/driver:ro")
        inner = "/host/driver"
    else:
        inner = f"/host{DEFAULT_DRIVER_DIR}"
    binds += [f"{d}:/host/cdi/{i}:ro" for i, d in enumerate(cdi_dirs)]
    return ContainerSpec(
        name=f"hp-gpu-probe-{secrets.token_hex(4)}",
        image=image,
        labels={L_MANAGED: "0", L_ROLE: PROBE_ROLE},
        network="none",
        command=["sh", "-c", PROBE_SCRIPT, "hp-gpu-probe", inner],
        binds=binds,
        memory_bytes=128 << 20,
    )


def _smi_spec(image: str, wiring: GpuWiring) -> Any:
    return ContainerSpec(
        name=f"hp-gpu-probe-{secrets.token_hex(4)}",
        image=image,
        labels={L_MANAGED: "0", L_ROLE: PROBE_ROLE},
        network="none",
        command=["nvidia-smi", "-q", "-x"],
        gpus=wiring,
        memory_bytes=256 << 20,
    )


def remove_left_probes(provider: Provider, now: float | None = None) -> list[str]:
    """Probes a process left (killed between its probe's end and the probe's removal):
    exited ones older than a probe may live, so that none a running discovery still reads
    is taken from it. Returns the names removed."""
    left = provider.containers(None, {L_MANAGED: "0", L_ROLE: PROBE_ROLE})
    cutoff = (time.time() if now is None else now) - 2 * PROBE_TIMEOUT
    old = [c for c in left if not c.running and _epoch(c.created) < cutoff]
    for c in old:
        provider.remove_container(c.id)
    return [c.name for c in old]


def _epoch(iso: str) -> float:
    try:
        return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return 0.0  # no creation time known: old


def probe_wiring(mode: str, probe: Probe, driver: DriverFiles) -> GpuWiring:
    """How step 2's container gets every GPU step 1 saw."""
    if mode == "cdi":
        return GpuWiring("cdi", ("all",), device_requests=({"driver": "cdi", "device_ids": [f"{CDI_KIND}=all"]},))
    if mode == "runtime":
        return GpuWiring(
            "runtime",
            ("all",),
            device_requests=({"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]},),
            env={"NVIDIA_DRIVER_CAPABILITIES": "utility"},
        )
    recs = [GpuRecord(index=i, uuid="", name="", model="", minor_number=m) for i, m in enumerate(probe.gpu_minors)]
    return wire("devices", recs, driver=driver, host_devices=probe.devices)


def run_discovery(provider: Provider, env: Mapping[str, str] | None = None) -> HostGpuInfo:
    """Steps 1 and 2 now (no cache). Engine failures propagate (TRANSIENT)."""
    env = os.environ if env is None else env
    info = provider.info()
    base = HostGpuInfo(
        engine=info.name, source="discovery", at=time.time(), host_cpus=info.cpus, host_memory_mib=info.memory_mib
    )
    image = probe_image(provider)
    if image is None:
        return _with(base, source="unavailable", why="no image to probe the host with yet ('hp images build')")
    driver_dir = env.get(ENV_DRIVER_DIR) or None
    cdi_dirs = list(info.cdi_spec_dirs)
    remove_left_probes(provider)
    res = provider.run_once(_probe_spec(image, driver_dir, cdi_dirs), timeout=PROBE_TIMEOUT)
    if res.exit_code != 0:
        return _with(base, source="unavailable", why=f"the GPU probe exited {res.exit_code}: {res.output[-300:]}")
    try:
        probe = parse_probe(res.output, driver_dir or DEFAULT_DRIVER_DIR, cdi_dirs)
    except ProbeError as e:
        return _with(base, source="unavailable", why=str(e))
    if not probe.gpu_minors:
        return _with(base, devices=probe.devices, why="no NVIDIA GPU device (/dev/nvidiaN) on the Docker host")
    try:
        driver = driver_files(
            ldconfig=probe.ldconfig or None,
            listing=probe.listing,
            binaries=probe.binaries,
            machine=probe.machine,
        )
    except DiscoveryError as e:
        return _with(base, devices=probe.devices, why=str(e))
    docker_info = {"Runtimes": {r: {} for r in info.runtimes}, "CDISpecDirs": cdi_dirs}
    try:
        choice = choose_mode(docker_info, env, probe.cdi_devices)
        wiring = probe_wiring(choice.mode, probe, driver)
    except GpuWiringError as e:
        return _with(
            base,
            devices=probe.devices,
            driver=driver,
            why=f"{len(probe.gpu_minors)} GPU device(s) on the host, but they cannot be given to containers: {e}",
        )
    smi = provider.run_once(_smi_spec(image, wiring), timeout=PROBE_TIMEOUT)
    try:
        if smi.exit_code != 0:
            raise DiscoveryError(f"exit {smi.exit_code}: {smi.output.strip()[-300:]}")
        host = parse_nvidia_smi_xml(smi.output)
    except DiscoveryError as e:
        return _with(
            base,
            devices=probe.devices,
            driver=driver,
            mode=choice.mode,
            mode_why=choice.why,
            why=f"nvidia-smi -q -x in a GPU container ({choice.mode} mode) failed: {e}",
        )
    problems = list(driver.version_problems(host.driver_version)) if choice.mode == "devices" else []
    # what is kept (and cached) of each GPU: identity and wiring, not its health counters
    usable = tuple(_rec(_rec_doc(g)) for g in host.gpus if not g.mig_enabled)
    if len(usable) < len(host.gpus):
        problems.append(f"{len(host.gpus) - len(usable)} GPU(s) in MIG mode: not used (hp gives whole GPUs)")
    return _with(
        base,
        gpus=usable,
        driver_version=host.driver_version,
        mode=choice.mode,
        mode_why=choice.why,
        driver=driver,
        devices=probe.devices,
        cdi_devices=probe.cdi_devices,
        problems=tuple(problems),
        why="" if usable else "nvidia-smi lists no usable GPU",
    )


def _with(info: HostGpuInfo, **kw: Any) -> HostGpuInfo:
    return replace(info, **kw)


def ttl(env: Mapping[str, str] | None = None) -> float:
    raw = (os.environ if env is None else env).get(ENV_TTL, "")
    try:
        return float(raw) if raw else DEFAULT_TTL
    except ValueError:
        return DEFAULT_TTL


def discover(
    provider: Provider, store: Store | None, *, refresh: bool = False, env: Mapping[str, str] | None = None
) -> HostGpuInfo:
    """The engine's GPUs: HP_GPUS when set, else the cached discovery when younger
    than the TTL, else a new one (cached). An engine failure during a refresh returns
    the last cached result when there is one (else it propagates). Without a store (a
    dry run, which writes no state) nothing is cached."""
    env = os.environ if env is None else env
    if store is None:
        info = provider.info()
        return (
            from_env(env[ENV_GPUS], info.name, info.cpus, info.memory_mib)
            if ENV_GPUS in env
            else run_discovery(provider, env)
        )
    try:
        info = provider.info()
    except TRANSIENT:  # no engine now: the last result of any engine, if there is one
        if ENV_GPUS not in env and (last := store.get(KEY + "*last")):
            return HostGpuInfo.from_json(last)
        raise
    if ENV_GPUS in env:
        return from_env(env[ENV_GPUS], info.name, info.cpus, info.memory_mib)
    key = KEY + (info.name or "local")
    cached = store.get(key)
    old: HostGpuInfo | None = None
    if cached:
        try:
            old = HostGpuInfo.from_json(cached)
        except (ValueError, KeyError, TypeError):
            old = None
    if old is not None and not refresh and time.time() - old.at < ttl(env):
        return old
    try:
        new = run_discovery(provider, env)
    except TRANSIENT as e:
        if old is not None:
            log.warning("GPU discovery failed (%s): using the result of %.0f s ago", e, time.time() - old.at)
            return old
        raise
    if new.source != "unavailable":
        store.put(key, new.to_json())
        store.put(KEY + "*last", new.to_json())
    return new
