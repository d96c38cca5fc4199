"""What a CI pipeline needs around a cluster: images as files for a cache
(save/load/key), a batch job whose exit code is the step's (submit), and the
evidence when something failed (logs)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .cluster import DEFAULT_USER, Cluster, Env
from .errors import BadInput, LaunchError, NotFound, OperationFailed, WaitTimeout
from .images import ALL_IMAGES, CHECK_IMAGES, LOCAL_BASE, NODE_IMAGES, PULL_BASE, _context_hash
from .naming import L_NODE, L_ROLE
from .ops import exec_target

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
Log = Callable[[str], None]


# -- images as files ---------------------------------------------------------------------
def images_key(env: Env) -> str:
    """Hash of every image's inputs (build contexts, targets, base recipe), computable
    on a fresh runner before any image exists: the actions/cache key. (The image tags
    themselves also hash the base image's id, which only exists once it is made.)"""
    h = hashlib.sha256(f"hp-images/{MANIFEST_FORMAT}\0{PULL_BASE}\0{LOCAL_BASE}\0".encode())
    for d in ALL_IMAGES:
        h.update(f"{d.name}\0{d.target or ''}\0".encode())
        h.update(_context_hash(env.images.root / d.context).encode())
    return h.hexdigest()[:24]


def _present_refs(env: Env) -> list[tuple[str, str]]:
    """(logical name, reference) of what save stores: base, node images, check images if built."""
    base_ref, base_id = env.images.base(make=False)
    out = [("base", base_ref)]
    for d in NODE_IMAGES:
        ref = env.images.tag(d, base_id)
        if not env.provider.image_exists(ref):
            raise OperationFailed(f"image {ref} is not built: run 'hp images build' first")
        out.append((d.name, ref))
    for d in CHECK_IMAGES:
        ref = env.images.tag(d, base_id)
        if env.provider.image_exists(ref):
            out.append((d.name, ref))
    return out


def save_images(env: Env, directory: Path, log: Log = lambda s: None) -> dict[str, Any]:
    """Write the images into one tar (layers shared by the images stored once) and a
    manifest with each image's id and the tar's sha256, under `directory`."""
    env.provider.ping()
    refs = _present_refs(env)
    key = images_key(env)
    directory.mkdir(parents=True, exist_ok=True)
    fname = f"hp-images-{key}.tar"
    tmp = directory / (fname + ".part")
    h, size = hashlib.sha256(), 0
    log(f"saving {len(refs)} images to {directory / fname}")
    with open(tmp, "wb") as f:
        for chunk in env.provider.save_images([r for _, r in refs]):
            f.write(chunk)
            h.update(chunk)
            size += len(chunk)
    os.replace(tmp, directory / fname)  # never leave a half-written tar under the final name
    for old in directory.glob("hp-images-*.tar"):
        if old.name != fname:
            old.unlink()
    doc = {
        "Format": MANIFEST_FORMAT,
        "Key": key,
        "File": fname,
        "Sha256": h.hexdigest(),
        "Size": size,
        "Images": [{"Name": n, "Ref": r, "Id": env.provider.image_id(r)} for n, r in refs],
    }
    (directory / MANIFEST).write_text(json.dumps(doc, indent=2) + "\n")
    return {"Directory": str(directory), **doc}


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest, checked for shape; every problem found is reported at once."""
    mpath = directory / MANIFEST
    if not directory.is_dir():
        raise BadInput(f"{directory} is not a directory (save images there with 'hp images save {directory}')",
                       "cannot load images")
    if not mpath.is_file():
        raise BadInput(f"{mpath} is missing: {directory} holds no saved images", "cannot load images")
    try:
        doc = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise BadInput(f"{mpath} is corrupt: {e}", "cannot load images") from None
    problems = []
    if not isinstance(doc, dict):
        raise BadInput(f"{mpath} is corrupt: not a JSON object", "cannot load images")
    if doc.get("Format") != MANIFEST_FORMAT:
        problems.append(f"{mpath}: format {doc.get('Format')!r} is not {MANIFEST_FORMAT}")
    for k, t in (("File", str), ("Sha256", str), ("Size", int), ("Images", list), ("Key", str)):
        if not isinstance(doc.get(k), t):
            problems.append(f"{mpath}: {k} is missing or not a {t.__name__}")
    if isinstance(doc.get("File"), str) and ("/" in doc["File"] or not (directory / doc["File"]).is_file()):
        problems.append(f"image file {directory / str(doc['File'])} is missing")
    if problems:
        raise BadInput(problems, "cannot load images")
    return doc


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


def load_images(env: Env, directory: Path, log: Log = lambda s: None, force: bool = False) -> dict[str, Any]:
    """Verify the saved tar against its manifest, then load it into the engine (unless every
    image is already there, or `force`) and check every image has the id it was saved with."""
    doc = read_manifest(directory)
    path = directory / doc["File"]
    size = path.stat().st_size
    if size != doc["Size"]:
        raise OperationFailed(f"{path} is corrupt: {size} bytes, the manifest says {doc['Size']}")
    digest = _sha256_file(path)
    if digest != doc["Sha256"]:
        raise OperationFailed(f"{path} is corrupt: sha256 {digest[:16]}..., the manifest says {doc['Sha256'][:16]}...")
    env.provider.ping()
    missing = [i for i in doc["Images"] if env.provider.image_id(i["Ref"]) != i["Id"]]
    if missing or force:
        log(f"loading {len(doc['Images'])} image(s) from {path}")
        with open(path, "rb") as f:
            try:
                env.provider.load_images(f)
            except LaunchError as e:
                raise OperationFailed(f"loading {path} failed: {e}") from None
    else:
        log("every image is already present with the saved id: nothing to load")
    wrong = [i["Ref"] for i in doc["Images"] if env.provider.image_id(i["Ref"]) != i["Id"]]
    if wrong:
        raise OperationFailed(f"after loading {path}, these images are missing or differ: {', '.join(wrong)}")
    key = images_key(env)
    if doc["Key"] != key:
        log(f"note: these images were saved for inputs {doc['Key']}, the inputs now hash to {key}: "
            "'hp create' will build what changed")
    return {"Directory": str(directory), "Key": doc["Key"], "KeyMatches": doc["Key"] == key,
            "Loaded": bool(missing or force), "Images": doc["Images"]}


def slurm_version(env: Env, ref: str) -> str | None:
    """Slurm's version in an image, from its dpkg database (read without running the
    image), remembered per image id: images are immutable."""
    image_id = env.provider.image_id(ref)
    if image_id is None:
        return None
    kv = f"slurm-version:{image_id}"
    if (known := env.store.get(kv)) is not None:
        return known
    status = env.provider.read_image_file(ref, "/var/lib/dpkg/status").decode(errors="replace")
    version = parse_dpkg_version(status, "slurmd")
    if version:
        env.store.put(kv, version)
    return version


def parse_dpkg_version(status: str, package: str) -> str | None:
    for para in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Package") == package and "installed" in fields.get("Status", ""):
            return fields.get("Version")
    return None


# -- submit ------------------------------------------------------------------------------
# Not `sbatch --wait`: it polls the job after 2, 8, then 32 s, so a 3 s job would hold the
# CI step for 10 s. hp submits, follows the output file on the login node (the shared
# /home) and asks slurmctld for the job's state every POLL seconds instead.
POLL = 0.25
# Follow the output until the `done` file appears (tail --pid: one last read, then exit).
FOLLOW_SH = r"""
out="$1"; done="$2"
( while [ ! -e "$done" ]; do sleep 0.1; done ) & w=$!
tail -n +1 -s 0.1 -F --pid="$w" "$out" 2>/dev/null
rm -f "$done"
"""
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
         "OUT_OF_MEMORY"}


@dataclass
class SubmitResult:
    cluster: str
    job_id: int | None
    exit_code: int
    script: str
    output_file: str
    output: str

    def as_dict(self) -> dict[str, Any]:
        return {"ClusterName": self.cluster, "JobId": self.job_id, "ExitCode": self.exit_code,
                "Script": self.script, "OutputFile": self.output_file, "Output": self.output}


def job_exit_code(state: str, return_code: int | None) -> int:
    """The exit code a CI step gets: the script's own; 1 when Slurm ended the job
    another way (cancelled, node failure, time limit...) and left a 0 behind."""
    if state == "COMPLETED":
        return return_code or 0
    return return_code or 1


def submit(env: Env, name: str, script: Path, partition: str | None, nodes: int | None,
           sbatch_args: list[str], timeout: float, write: Callable[[bytes], None]) -> SubmitResult:
    problems = []
    if not script.is_file():
        problems.append(f"script {script} does not exist or is not a file")
    if nodes is not None and nodes < 1:
        problems.append(f"--nodes must be at least 1, got {nodes}")
    if timeout <= 0:
        problems.append(f"--timeout must be positive, got {timeout:g}")
    if problems:
        raise BadInput(problems, "cannot submit")
    if env.store.cluster(name) is None:
        raise NotFound(f"cluster {name!r} does not exist")
    p = env.provider
    cluster = Cluster(env, name)
    target = exec_target(env, name, None)
    if target == cluster.controller_container:  # only login and compute nodes share /home
        raise BadInput(f"cluster {name!r} has no running login node: hp submit runs jobs from one", "cannot submit")
    home = f"/home/{DEFAULT_USER}"
    jobdir = f"{home}/hp-submit"
    stem = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}-" + re.sub(r"[^A-Za-z0-9._-]", "_", script.name)
    remote, out_file, done_file = f"{jobdir}/{stem}", f"{jobdir}/{stem}.out", f"{jobdir}/{stem}.done"
    user_env = {"HOME": home, "USER": DEFAULT_USER}
    mk = p.exec(target, ["install", "-d", "-o", "1000", "-g", "1000", home, jobdir])
    if mk.exit_code != 0:
        raise OperationFailed(f"cannot make {jobdir} on {target}: {mk.output.strip()}")
    p.put_files(target, jobdir, {stem: (script.read_bytes(), 0o755, 1000), f"{stem}.out": (b"", 0o644, 1000)})
    args = (["--partition", partition] if partition else []) + (["--nodes", str(nodes)] if nodes else [])
    sb = p.exec(target, ["sbatch", "--parsable", "-o", out_file, "-e", out_file, *args, *sbatch_args, remote],
                user=DEFAULT_USER, workdir=home, environment=user_env)
    first = sb.output.strip().splitlines()[-1].split(";")[0] if sb.output.strip() else ""
    if sb.exit_code != 0 or not first.isdigit():
        write(sb.output.encode())
        return SubmitResult(name, None, sb.exit_code or 1, remote, out_file, sb.output)
    job_id = int(first)
    shown: list[bytes] = []
    follower = threading.Thread(target=_follow, args=(p, target, out_file, done_file, write, shown), daemon=True)
    follower.start()
    try:
        job = _wait_job(cluster, job_id, time.monotonic() + timeout)
    finally:  # stop the follower (it reads the file once more), also on timeout or ^C
        p.put_files(target, jobdir, {f"{stem}.done": (b"", 0o644, 1000)})
        follower.join(10)
    if job is None:
        p.exec(target, ["scancel", str(job_id)], user=DEFAULT_USER)
        raise WaitTimeout(f"job {job_id} did not finish within {timeout:g} s (cancelled); output in {out_file}")
    code = job_exit_code(job.state, job.exit_code)
    if job.state != "COMPLETED":
        write(f"hp: job {job_id} ended {job.state}\n".encode())
    return SubmitResult(name, job_id, code, remote, out_file, b"".join(shown).decode(errors="replace"))


def _follow(p: Any, target: str, out_file: str, done_file: str, write: Callable[[bytes], None],
            shown: list[bytes]) -> None:
    stream, _ = p.exec_stream(target, ["sh", "-c", FOLLOW_SH, "hp-follow", out_file, done_file], user=DEFAULT_USER)
    for out, err in stream:
        for chunk in (out, err):
            if chunk:
                shown.append(chunk)
                write(chunk)


def _wait_job(cluster: Cluster, job_id: int, deadline: float) -> Any:
    """The job once it has ended; None at the deadline."""
    while time.monotonic() < deadline:
        job = cluster.slurm.job(job_id)
        if job is not None and job.state in ENDED:
            return job
        time.sleep(POLL)
    return None


# -- logs --------------------------------------------------------------------------------
class LogWriter:
    """Writes the files of a logs folder; the cluster's auth key never reaches a file."""

    def __init__(self, root: Path, secret: bytes | None):
        self.root = root
        self.secret = secret or None
        self.files: list[str] = []

    def write(self, rel: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else data
        if self.secret and self.secret in raw:
            raw = raw.replace(self.secret, b"<hp: auth key removed>")
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
        self.files.append(rel)

    def json(self, rel: str, doc: Any) -> None:
        self.write(rel, json.dumps(doc, indent=2, default=str) + "\n")


def export_logs(env: Env, name: str, directory: Path, log: Log = lambda s: None) -> dict[str, Any]:
    """Everything worth reading after a failure, one folder per node. Works on half-made
    and failed clusters: stopped containers are read with get_archive, not exec."""
    p = env.provider
    p.ping()
    row = env.store.cluster(name)
    containers = p.containers(name)
    if row is None and not containers:
        raise NotFound(f"cluster {name!r} does not exist")
    cluster = Cluster(env, name)
    key_path = env.store.home / "clusters" / name / "slurm.key"
    secret = key_path.read_bytes() if key_path.is_file() else None
    w = LogWriter(directory, secret)
    directory.mkdir(parents=True, exist_ok=True)
    by_node = {c.labels.get(L_NODE) or c.name: c for c in containers}
    ctl = next((c for c in containers if c.labels.get(L_ROLE) == "controller"), None)
    ctl_up = ctl is not None and ctl.state == "running"
    recorded = env.store.latest_node_status(name) if row else {}
    for node in sorted(set(by_node) | set(recorded)):
        log(f"collecting {node}")
        _node_logs(env, cluster, w, node, by_node.get(node), recorded.get(node), ctl if ctl_up else None)
    if row is not None:
        w.json("cluster.json", {"ClusterName": name, "ClusterStatus": row.status, "FailureMessage": row.message or None,
                                "Spec": row.spec})
        w.json("events.json", [e.as_dict() for e in env.store.events(name)])
        w.write("slurm.conf", _slurm_conf(env, cluster, ctl))
        health = _health_results(env, name)
        if health is not None:
            w.json("health-checks.json", health)
    if ctl_up:
        w.write("sinfo.txt", p.exec(ctl.name, ["sinfo", "-N", "-l"]).output)
        w.write("squeue.txt", p.exec(ctl.name, ["squeue", "-a", "-l"]).output)
    nodes = sorted(set(by_node) | set(recorded))
    return {"ClusterName": name, "Directory": str(directory), "Nodes": nodes, "Files": sorted(w.files)}


def _node_logs(env: Env, cluster: Cluster, w: LogWriter, node: str, c: Any, recorded: Any, ctl: Any) -> None:
    p = env.provider
    if c is None:  # recorded by hp but never got a container (e.g. launch failed)
        w.json(f"{node}/status.json", {"Node": node, "Container": None,
                                       "RecordedStatus": recorded[0] if recorded else None,
                                       "Message": recorded[1] if recorded else None})
        return
    st = p.inspect(c.id)
    w.json(f"{node}/status.json", {"Node": node, "Container": c.name, "Image": st["Config"]["Image"],
                                   "Labels": c.labels, "State": st["State"],
                                   "RecordedStatus": recorded[0] if recorded else None,
                                   "Message": recorded[1] if recorded else None})
    w.write(f"{node}/container.log", p.logs(c.id))
    for fname, data in p.get_dir(c.id, "/var/log/slurm").items():
        if fname.endswith(".log"):
            w.write(f"{node}/{fname}", data)
    if ctl is not None and c.labels.get(L_ROLE) == "worker":
        w.write(f"{node}/scontrol-show-node.txt", p.exec(ctl.name, ["scontrol", "show", "node", node]).output)


def _slurm_conf(env: Env, cluster: Cluster, ctl: Any) -> bytes:
    """The controller's slurm.conf as it was given to slurmctld; rendered from the spec
    when there is no controller container. The key lives in its own file (slurm.key)."""
    if ctl is not None:
        data = env.provider.get_dir(ctl.id, "/etc/slurm/slurm.conf")
        if data:
            return next(iter(data.values()))
    from .slurmconf import render

    return render(cluster.spec, env.catalogue).encode()


def _health_results(env: Env, name: str) -> Any:
    """The deep health checks hp recorded for the cluster: requests and per-node results."""
    try:
        from .health.records import Records
    except ImportError:  # an hp without health checks
        return None
    rec = Records(env.store)
    return [{"RequestId": r.id, "State": r.state, "Checks": r.checks, "Nodes": r.nodes, "Message": r.message,
             "Results": [x.as_dict() for x in rec.results(r.id)]} for r in rec.requests(name)]
