"""Build hp's images, tagged with a hash of their inputs.

A second build with nothing changed inspects the tags and builds nothing. The base is
`debian:trixie-slim` when it is present or can be pulled; else it is made locally with
debootstrap and imported (no registry needed, only a Debian mirror).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import OperationFailed
from .provider import DockerProvider
from .slurmconf import project_dir

PULL_BASE = ("debian", "trixie-slim")
LOCAL_BASE = "hp-base:trixie"
MIRROR = os.environ.get("HP_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@dataclass(frozen=True)
class ImageDef:
    name: str  # logical name: controller, login, worker, check-cpu
    context: str  # folder under the project root
    target: str | None

    def repo(self) -> str:
        return f"hp-{self.name}"


NODE_IMAGES = (
    ImageDef("controller", "images/node", "controller"),
    ImageDef("login", "images/node", "login"),
    ImageDef("worker", "images/node", "worker"),
)
CHECK_IMAGES = (ImageDef("check-cpu", "healthchecks/cpu", None),)
ALL_IMAGES = NODE_IMAGES + CHECK_IMAGES

Log = Callable[[str], None]


def _context_hash(ctx: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(ctx.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(ctx)).encode() + b"\0")
            h.update(oct(p.stat().st_mode & 0o777).encode() + b"\0")
            h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


class Images:
    def __init__(self, provider: DockerProvider, root: Path | None = None):
        self.p = provider
        self.root = root or project_dir()
        self._base: tuple[str, str] | None = None  # (ref, image id)

    # -- base -----------------------------------------------------------------------
    def base(self, log: Log = lambda s: None, make: bool = True) -> tuple[str, str]:
        """(reference, image id) of the base image, made if needed and `make`."""
        if self._base:
            return self._base
        pulled = f"{PULL_BASE[0]}:{PULL_BASE[1]}"
        for ref in (pulled, LOCAL_BASE):
            if self.p.image_exists(ref):
                self._base = (ref, self.p.api.inspect_image(ref)["Id"])
                return self._base
        if not make:
            raise OperationFailed("no base image: run 'hp images build'")
        try:
            log(f"pulling {pulled}")
            self.p.api.pull(PULL_BASE[0], tag=PULL_BASE[1])
            self._base = (pulled, self.p.api.inspect_image(pulled)["Id"])
            return self._base
        except Exception as e:  # noqa: BLE001 - no registry: fall back to a local base
            log(f"cannot pull {pulled} ({str(e).splitlines()[0][:120]}); making {LOCAL_BASE} with debootstrap")
        self._debootstrap(log)
        self._base = (LOCAL_BASE, self.p.api.inspect_image(LOCAL_BASE)["Id"])
        return self._base

    def _debootstrap(self, log: Log) -> None:
        if not shutil.which("debootstrap"):
            raise OperationFailed(
                "no base image: debian:trixie-slim can't be pulled and debootstrap is not installed.\n"
                "Install it (apt-get install -y debootstrap) and run as root, or make the pull work.")
        with tempfile.TemporaryDirectory(prefix="hp-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            cmd = ["debootstrap", "--variant=minbase", "trixie", str(rootfs), MIRROR]
            log(" ".join(cmd))
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise OperationFailed(f"debootstrap failed ({r.returncode}):\n{(r.stdout + r.stderr)[-2000:]}")
            tar_path = Path(tmp) / "rootfs.tar"
            with tarfile.open(tar_path, "w") as tar:
                tar.add(rootfs, arcname=".")
            shutil.rmtree(rootfs, ignore_errors=True)
            log(f"importing {LOCAL_BASE}")
            repo, tag = LOCAL_BASE.split(":")
            self.p.api.import_image_from_file(str(tar_path), repository=repo, tag=tag,
                                              changes=["CMD [\"/bin/bash\"]", "ENV LANG=C.UTF-8"])

    # -- role images ----------------------------------------------------------------
    def tag(self, d: ImageDef, base_id: str | None = None) -> str:
        if base_id is None:
            base_id = self.base(make=False)[1]
        h = hashlib.sha256()
        h.update(base_id.encode() + b"\0" + (d.target or "").encode() + b"\0")
        h.update(_context_hash(self.root / d.context).encode())
        return f"{d.repo()}:{h.hexdigest()[:12]}"

    def refs(self, defs: tuple[ImageDef, ...] = NODE_IMAGES) -> dict[str, str]:
        """Image reference per logical name, for what is (or would be) built now."""
        base_id = self.base(make=False)[1]
        return {d.name: self.tag(d, base_id) for d in defs}

    def build(self, defs: tuple[ImageDef, ...] = ALL_IMAGES, log: Log = lambda s: None) -> dict[str, str]:
        base_ref, base_id = self.base(log)
        out = {}
        for d in defs:
            ref = self.tag(d, base_id)
            out[d.name] = ref
            if self.p.image_exists(ref):
                log(f"{ref} is up to date")
                continue
            log(f"building {ref}")
            self._build_one(d, ref, base_ref, log)
        return out

    def _build_one(self, d: ImageDef, ref: str, base_ref: str, log: Log) -> None:
        tail: list[str] = []
        for chunk in self.p.api.build(path=str(self.root / d.context), tag=ref, target=d.target,
                                      buildargs={"BASE": base_ref}, rm=True, forcerm=True, decode=True):
            if "stream" in chunk:
                line = chunk["stream"].rstrip()
                if line:
                    tail = (tail + [line])[-30:]
                    if line.startswith("Step "):
                        log(line)
            if "error" in chunk:
                raise OperationFailed(f"building {ref} failed: {chunk['error'].strip()}\n" + "\n".join(tail[-15:]))
        if not self.p.image_exists(ref):
            raise OperationFailed(f"building {ref} produced no image:\n" + "\n".join(tail[-15:]))
        repo = d.repo()
        self.p.api.tag(ref, repo, "latest")

    def status(self) -> list[dict[str, str | bool]]:
        try:
            base_ref, base_id = self.base(make=False)
        except OperationFailed:
            return [{"Image": d.repo(), "Tag": "", "Present": False} for d in ALL_IMAGES]
        return [{"Image": d.repo(), "Tag": self.tag(d, base_id), "Present": self.p.image_exists(self.tag(d, base_id)),
                 "Base": base_ref} for d in ALL_IMAGES]
