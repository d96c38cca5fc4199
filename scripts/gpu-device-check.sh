#!/usr/bin/env bash
# hp's GPU check on the lent GPU machine (an H200), in ONE call of the device tool.
# NOT RUN YET: written and dry-run on a CPU machine only (docs/gpu.md, "Running it").
#
# Prepare here (CPU machine):  scripts/gpu-device-bundle.sh            -> .device/ (~50 MB, git-ignored)
# Run there (device tool):     run(command="bash scripts/gpu-device-check.sh", carry=[".device"], timeout_s=480)
#
# What it does there (no network, no NVIDIA toolkit, cgroup v2; see ../shared/gpu-device/README.md):
#  1. records the machine (nvidia-smi -L and -q -x, driver folder, cgroup) under $OUT;
#  2. makes the carried wheels importable by the machine's Python (/opt/torch/.venv: CuPy 14,
#     nvidia-ml-py, NCCL), if it lacks them;
#  3. starts Debian 12's dockerd from .device/dock.tar.xz (no iptables) and imports a busybox rootfs;
#  4. hp's discovery, parsing, wiring, on this machine: parse_nvidia_smi_xml, driver_files of the
#     driver folder, wire("devices", ...); then hp's discovery through hp's own Provider
#     (gpu/inventory.py run_discovery: probe container, nvidia-smi container);
#  5. runs hp_gpu_check.py (this checkout's) in a container wired the no-toolkit way: the GPUs'
#     device nodes (from wire()) and, read-only, the host's /usr (the driver lives in
#     /usr/local/nvidia), /lib, /lib64, /opt (the Python), /etc/alternatives;
#  6. judges it with gpu/judge.py and the shipped thresholds, prints the verdict and figures;
#  7. runs hp_gpu_monitor.py in the same way for MONITOR_S seconds and measures its CPU (cgroup).
# Everything raw goes under $OUT (the device tool brings it back): keep it as tests/fixtures/.
set -u
export PYTHONUNBUFFERED=1
REPO=$(pwd)
BUNDLE=${HP_DEVICE_BUNDLE:-$REPO/.device}
OUT=${OUT:-/tmp/hp-gpu-device-out}
PY=${HP_DEVICE_PYTHON:-/opt/torch/.venv/bin/python3}
DRIVER_DIR=${HP_NVIDIA_DRIVER_DIR:-/usr/local/nvidia}
MONITOR_S=${MONITOR_S:-40}
GEMM_S=${GEMM_S:-5}
DRY_RUN=${HP_DEVICE_DRY_RUN:-0}  # 1: no GPU expected (a dry run on a CPU machine)
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
step() { echo; echo "=== [$(date -u +%H:%M:%S)] $*"; }

step "1. the machine"
uname -a; nproc; free -g | head -2
stat -fc 'cgroup fs: %T' /sys/fs/cgroup
export PATH="$DRIVER_DIR/bin:$PATH"
nvidia-smi -L | tee "$OUT/nvidia-smi-L.txt"
nvidia-smi -q -x > "$OUT/nvidia-smi-q.xml" 2> "$OUT/nvidia-smi-q.stderr.txt"; echo "nvidia-smi -q -x: exit $?"
ls -la /dev/nvidia* 2>&1 | tee "$OUT/dev-nvidia.txt"
find "$DRIVER_DIR" -maxdepth 3 \( -type f -o -type l \) 2>/dev/null | sort > "$OUT/driver-listing.txt"; wc -l < "$OUT/driver-listing.txt"
"$PY" -c 'import sys; print(sys.version)'

step "2. Python packages hp's own code needs"
SITE=/tmp/hp-site
mkdir -p "$SITE"
"$PY" - "$BUNDLE/wheels" "$SITE" <<'PY'
import glob, importlib.util, os, sys, zipfile
wheels, site = sys.argv[1], sys.argv[2]
tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
need = {"yaml": "pyyaml", "pydantic": "pydantic", "docker": "docker"}
missing = [m for m in need if importlib.util.find_spec(m) is None]
print("already importable:", [m for m in need if m not in missing], "missing:", missing)
if missing:
    for w in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
        name = os.path.basename(w)
        if "-py3-none-any" in name or f"-{tag}-{tag}-" in name:
            zipfile.ZipFile(w).extractall(site)
            print("unpacked", name)
PY
export PYTHONPATH="$SITE:$REPO"
"$PY" -c 'import yaml, pydantic, docker; print("yaml", yaml.__version__, "pydantic", pydantic.VERSION, "docker-py", docker.__version__)'

step "3. dockerd from the carried bundle"
D=/tmp/hp-dock
mkdir -p "$D" && tar -C "$D" -xJf "$BUNDLE/dock.tar.xz"
export PATH="$D/bin:$PATH" DOCKER_HOST=unix:///tmp/hp-d.sock
LD_LIBRARY_PATH="$D/lib" setsid dockerd --iptables=false --ip6tables=false --userland-proxy=false \
  --data-root /tmp/hp-dd --exec-root /tmp/hp-de -H "$DOCKER_HOST" > "$OUT/dockerd.log" 2>&1 < /dev/null &
for _ in $(seq 60); do "$PY" -c 'import docker; docker.from_env().ping()' 2>/dev/null && break; sleep 0.5; done
"$PY" -c 'import docker, json; i = docker.from_env().info(); print(json.dumps({k: i.get(k) for k in ("ServerVersion", "Driver", "CgroupVersion", "Runtimes")}))'

step "4-7. hp's code on this machine"
"$PY" - "$OUT" "$REPO" "$PY" "$DRIVER_DIR" "$MONITOR_S" "$GEMM_S" "$DRY_RUN" <<'PY'
import io, json, os, sys, tarfile, time, traceback
out, repo, py, driver_dir, monitor_s, gemm_s, dry = sys.argv[1:8]
import docker
from orchestrator.gpu import inventory
from orchestrator.gpu.discovery import driver_files, parse_nvidia_smi_xml, DiscoveryError
from orchestrator.gpu.thresholds import load_thresholds
from orchestrator.gpu.wiring import wire, GpuWiringError
from orchestrator.gpu.judge import judge_gpu_check
from orchestrator.gpu.monitor import MonitorState, decide

c = docker.from_env()
def save(name, text):
    with open(os.path.join(out, name), "w") as f:
        f.write(text)

# a busybox rootfs (the Python, the driver and their libraries come from the host, read-only)
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w") as t:
    t.add("/tmp/hp-dock/bin/busybox", arcname="bin/busybox")
    for d in ("usr", "lib", "lib64", "opt", "etc", "etc/alternatives", "tmp", "proc", "sys", "dev", "hp"):
        ti = tarfile.TarInfo(d); ti.type = tarfile.DIRTYPE; ti.mode = 0o1777 if d == "tmp" else 0o755; t.addfile(ti)
    for name in ("sh", "ls", "cat", "sleep", "uname", "find", "grep", "sort", "head"):
        ti = tarfile.TarInfo(f"bin/{name}"); ti.type = tarfile.SYMTYPE; ti.linkname = "busybox"; t.addfile(ti)
c.api.import_image_from_data(buf.getvalue(), repository="hp-device-probe", tag="1")

# 4. hp's parsing and wiring of this machine's GPUs
devices_present = sorted(f"/dev/{n}" for n in os.listdir("/dev") if n.startswith("nvidia"))
wiring, gpus = None, []
try:
    gpus = list(parse_nvidia_smi_xml(open(os.path.join(out, "nvidia-smi-q.xml")).read()).gpus)
    listing = [l.strip() for l in open(os.path.join(out, "driver-listing.txt")) if l.strip()]
    drv = driver_files(listing=listing)
    print("hp discovery (parsed here):", [(g.index, g.model, g.uuid, g.minor_number, g.pci_bus_id) for g in gpus])
    print("driver files:", [f.host_path for f in drv.files], "missing:", drv.missing)
    wiring = wire("devices", gpus, driver=drv, host_devices=devices_present)
    print("wiring devices:", wiring.devices, "device files (gres.conf):", wiring.device_files)
except (DiscoveryError, GpuWiringError, OSError) as e:
    print("hp parsing/wiring failed:", e)
try:  # hp's discovery through hp's own Provider (its probe container runs in the busybox rootfs)
    from orchestrator.docker.engine import DockerEngine
    inventory.probe_image = lambda p: "hp-device-probe:1"
    info = inventory.run_discovery(DockerEngine(), {"HP_NVIDIA_DRIVER_DIR": driver_dir})
    print("hp run_discovery:", info.summary(), "| why:", info.why, "| mode:", info.mode, "| devices:", info.devices)
    save("hp-discovery.json", info.to_json())
except Exception:
    traceback.print_exc()

expected = len(gpus) or 1
devs = list(wiring.devices) if wiring else [f"{d}:{d}:rwm" for d in devices_present]
vols = {p: {"bind": p, "mode": "ro"} for p in ("/usr", "/lib", "/lib64", "/opt", "/etc/alternatives") if os.path.exists(p)}
vols[repo] = {"bind": "/hp", "mode": "ro"}
env = {
    "PATH": f"{driver_dir}/bin:/usr/bin:/bin",
    "LD_LIBRARY_PATH": f"{driver_dir}/lib64:{driver_dir}/lib",
    **(dict(wiring.env) if wiring else {}),
}
prog = "/hp/healthchecks/gpu"

def run(cmd, timeout, name):
    ctr = c.containers.create("hp-device-probe:1", cmd, devices=devs, volumes=vols, environment=env,
                              network_mode="none", name=name)
    t0 = time.time()
    try:
        ctr.start()
        code = ctr.wait(timeout=timeout)["StatusCode"]
        return code, ctr.logs(stdout=True, stderr=False).decode(), ctr.logs(stdout=False, stderr=True).decode(), time.time() - t0
    finally:
        ctr.remove(force=True)

# 5-6. the check, judged by hp
code, stdout, stderr, took = run([py, f"{prog}/hp_gpu_check.py", "--expected-gpus", str(expected), "--gemm-seconds", gemm_s], 400, "hp-gpu-check")
save("hp_gpu_check.json", stdout); save("hp_gpu_check.stderr.txt", stderr)
print(f"hp_gpu_check.py: exit {code} in {took:.1f} s (container start to end)")
table = load_thresholds()
model = gpus[0].model if gpus else None
v = judge_gpu_check(stdout, expected_gpus=expected, model=model,
                    thresholds=table.models.get(model) if model else None, tolerance=table.tolerance)
verdict = {"passed": v.passed, "action": v.action, "reasons": v.reasons, "notes": v.notes,
           "findings": [f.__dict__ for f in v.findings], "figures": v.figures, "seconds_in_container": took}
save("verdict.json", json.dumps(verdict, indent=2))
print("VERDICT:", "PASSED" if v.passed else "FAILED", "| action:", v.action)
for r in v.reasons: print("  reason:", r)
for n in v.notes: print("  note:", n)
for k in sorted(v.figures): print(f"  {k} = {v.figures[k]:g}")

# 7. the passive monitor: its findings while idle and its CPU
try:
    ctr = c.containers.create("hp-device-probe:1", [py, f"{prog}/hp_gpu_monitor.py", "--interval", "10"],
                              devices=devs, volumes=vols, environment=env, network_mode="none", name="hp-gpu-monitor")
    ctr.start(); time.sleep(5)
    cpu0 = c.api.stats(ctr.id, stream=False)["cpu_stats"]["cpu_usage"]["total_usage"]; t0 = time.time()
    time.sleep(float(monitor_s))
    cpu1 = c.api.stats(ctr.id, stream=False)["cpu_stats"]["cpu_usage"]["total_usage"]; dt = time.time() - t0
    lines = ctr.logs(stdout=True, stderr=False).decode().splitlines()
    save("hp_gpu_monitor.jsonl", "\n".join(lines) + "\n"); save("hp_gpu_monitor.stderr.txt", ctr.logs(stdout=False, stderr=True).decode())
    ctr.remove(force=True)
    st = MonitorState(expected_gpus=expected)
    findings = st.feed_lines(lines)
    pct = 100 * (cpu1 - cpu0) / 1e9 / dt
    print(f"monitor: {len(lines)} line(s) in {monitor_s} s idle; CPU {pct:.3f}% of a core (target < 0.5%)")
    print("monitor findings:", [f"{f.code} {f.severity}/{f.action}: {f.message}" for f in findings], "decision:", decide(findings))
    save("monitor-cpu.json", json.dumps({"seconds": dt, "cpu_percent_of_a_core": pct, "lines": len(lines)}))
except Exception:
    traceback.print_exc()
PY
echo "exit of the hp part: $?"
step "dockerd log (tail)"; tail -5 "$OUT/dockerd.log"
ls -la "$OUT"
