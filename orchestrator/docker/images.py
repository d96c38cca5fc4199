"""Build hp's images, tagged with a hash of their inputs.

The build contexts are the checkout's images/ and healthchecks/ folders, which a wheel
carries inside the package (resources.py), so hp installed anywhere builds the same images. A second build with nothing changed inspects
the tags and builds nothing. The base is `debian:trixie-slim` when it is present or can
be pulled; else it is made locally with debootstrap and imported (no registry needed,
only a Debian mirror).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import resources
from ..errors import EngineError, ObjectMissing, OperationFailed
from .provider import Provider

PULL_BASE = ("debian", "trixie-slim")
LOCAL_BASE = "hp-base:trixie"
DEBOOTSTRAP_TIMEOUT = 900.0

Log = Callable[[str], None]


def mirror() -> str:
    return os.environ.get("HP_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@dataclass(frozen=True)
class ImageDef:
    name: str  # logical name: controller, login, worker, rest, check-cpu, check-gpu, node-mh, fileserver
    context: str  # build context folder, relative to the resources' root (images/..., healthchecks/...)
    target: str | None
    parent: str | None = None  # built FROM this image of hp's (build argument PARENT); its tag is in the hash

    def repo(self) -> str:
        return f"hp-{self.name}"


NODE_IMAGES = (
    ImageDef("controller", "images/node", "controller"),
    ImageDef("login", "images/node", "login"),
    ImageDef("worker", "images/node", "worker"),
)
# The cluster service Rest: a target on the node images' shared stage (slurmrestd).
# Accounting runs in the controller's image (slurmdbd, MariaDB and its data directory).
SERVICE_IMAGES = (ImageDef("rest", "images/node", "rest"),)
CHECK_IMAGES = (ImageDef("check-cpu", "healthchecks/cpu", None),)
# The GPU check image (CuPy, nvidia-ml-py, CUDA and NCCL wheels from PyPI: ~2.2 GB, a
# build of about a minute) is built only where it is needed: by `hp create` of a cluster
# with GPU types, or `hp images build --gpu`. Not in ALL_IMAGES (`hp images build`).
GPU_IMAGES = (ImageDef("check-gpu", "healthchecks/gpu", None),)
ALL_IMAGES = NODE_IMAGES + SERVICE_IMAGES + CHECK_IMAGES
# Only with registered hosts (multi-host clusters): the worker image plus a GlusterFS
# client, run by login and compute nodes (HP_ROLE set per container), which mount /home
# from the cluster's file server; and that server, built on it (the layers they share
# travel to each host once). The single-host images stay as they are. Built by
# `hp create` (and `hp images build`) when hosts are registered.
MULTIHOST_IMAGES = (
    ImageDef("node-mh", "images/node-mh", None, parent="worker"),
    ImageDef("fileserver", "images/fileserver", None, parent="node-mh"),
)
_BY_NAME = {d.name: d for d in NODE_IMAGES + SERVICE_IMAGES + CHECK_IMAGES + GPU_IMAGES + MULTIHOST_IMAGES}


# NodePackages (the spec's Debian packages): a login/compute image derived from hp's, keyed
# by the content hash of its parent's tag (itself a hash of the base image and hp's
# context), this recipe and the sorted list. The names are validated (spec/userwork.py)
# and reach apt-get as arguments through xargs from a file of the build context: no
# shell reads them.
PACKAGES_DOCKERFILE = """\
ARG PARENT
FROM ${PARENT}
ARG APT_OPTS="-o Acquire::http::Timeout=20 -o Acquire::Retries=1"
COPY packages.txt /tmp/hp-packages.txt
RUN apt-get $APT_OPTS update --error-on=any \\
 && xargs -r -d '\\n' -a /tmp/hp-packages.txt apt-get $APT_OPTS install -y --no-install-recommends \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /tmp/hp-packages.txt
"""
PACKAGES_OF = ("login", "worker", "node-mh")  # the images that login and compute nodes run


def packages_hash(packages: tuple[str, ...]) -> str:
    """What a derived image depends on besides its parent: the recipe and the list."""
    return hashlib.sha256(PACKAGES_DOCKERFILE.encode() + b"\0" + "\n".join(packages).encode()).hexdigest()


def context_hash(ctx: Path) -> str:
    """What a build context's images depend on: each file's path, content and whether it
    is executable. Not the other permission bits: a tree unpacked with another umask
    (a `git archive`, a user with umask 002) builds the same images."""
    h = hashlib.sha256()
    for p in sorted(ctx.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(ctx)).encode() + b"\0")
            h.update(b"x" if p.stat().st_mode & 0o111 else b"-")
            h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def _steps(log: Log) -> Log:
    """A build's log lines for `log`: its steps only."""

    def steps(line: str) -> None:
        if line.startswith("Step "):
            log(line)

    return steps


class Images:
    def __init__(self, provider: Provider, root: Path | None = None):
        self.p = provider
        self.root = root or resources.root()  # the folder the ImageDefs' contexts are relative to
        self._base: tuple[str, str] | None = None  # (ref, image id)

    # -- base -----------------------------------------------------------------------
    def base(self, log: Log = lambda s: None, make: bool = True) -> tuple[str, str]:
        """(reference, image id) of the base image, made if needed and `make`."""
        if self._base:
            return self._base
        pulled = f"{PULL_BASE[0]}:{PULL_BASE[1]}"
        for ref in (pulled, LOCAL_BASE):
            if (iid := self.p.image_id(ref)) is not None:
                self._base = (ref, iid)
                return self._base
        if not make:
            raise OperationFailed("no base image: run 'hp images build'")
        try:
            log(f"pulling {pulled}")
            self.p.pull(*PULL_BASE)
        except EngineError as e:  # no registry: fall back to a local base
            log(f"cannot pull {pulled} ({str(e).splitlines()[0][:120]}); making {LOCAL_BASE} with debootstrap")
        else:
            iid = self.p.image_id(pulled)
            if iid is not None:
                self._base = (pulled, iid)
                return self._base
        self._debootstrap(log)
        iid = self.p.image_id(LOCAL_BASE)
        if iid is None:
            raise OperationFailed(f"importing {LOCAL_BASE} produced no image")
        self._base = (LOCAL_BASE, iid)
        return self._base

    def _debootstrap(self, log: Log) -> None:
        if not shutil.which("debootstrap"):
            raise OperationFailed(
                "no base image: debian:trixie-slim can't be pulled and debootstrap is not installed.\n"
                "Install it (apt-get install -y debootstrap) and run as root, or make the pull work."
            )
        with tempfile.TemporaryDirectory(prefix="hp-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            cmd = ["debootstrap", "--variant=minbase", "trixie", str(rootfs), mirror()]
            log(" ".join(cmd))
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=DEBOOTSTRAP_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise OperationFailed(
                    f"debootstrap did not finish in {DEBOOTSTRAP_TIMEOUT:g} s: is the Debian mirror "
                    f"{mirror()} reachable? (set HP_DEBIAN_MIRROR to another one)"
                ) from None
            if r.returncode != 0:
                raise OperationFailed(
                    f"debootstrap failed ({r.returncode}); is the Debian mirror {mirror()} reachable?\n"
                    f"{(r.stdout + r.stderr)[-2000:]}"
                )
            tar_path = Path(tmp) / "rootfs.tar"
            with tarfile.open(tar_path, "w") as tar:
                tar.add(rootfs, arcname=".")
            shutil.rmtree(rootfs, ignore_errors=True)
            log(f"importing {LOCAL_BASE}")
            repo, tag = LOCAL_BASE.split(":")
            self.p.import_image(tar_path, repo, tag, ['CMD ["/bin/bash"]', "ENV LANG=C.UTF-8"])

    # -- role images ----------------------------------------------------------------
    def context(self, d: ImageDef) -> Path:
        """The build context folder of `d`."""
        return self.root / d.context

    def tag(self, d: ImageDef, base_id: str | None = None) -> str:
        if base_id is None:
            base_id = self.base(make=False)[1]
        h = hashlib.sha256()
        h.update(base_id.encode() + b"\0" + (d.target or "").encode() + b"\0")
        h.update(context_hash(self.context(d)).encode())
        if d.parent:
            h.update(b"\0" + self.tag(_BY_NAME[d.parent], base_id).encode())
        return f"{d.repo()}:{h.hexdigest()[:12]}"

    def refs(self, defs: tuple[ImageDef, ...] = NODE_IMAGES) -> dict[str, str]:
        """Image reference per logical name, for what is (or would be) built now."""
        base_id = self.base(make=False)[1]
        return {d.name: self.tag(d, base_id) for d in defs}

    def exists(self, ref: str) -> bool:
        return self.p.image_id(ref) is not None

    def build(self, defs: tuple[ImageDef, ...] = ALL_IMAGES, log: Log = lambda s: None) -> dict[str, str]:
        base_ref, base_id = self.base(log)
        out = {}
        for d in defs:
            ref = self.tag(d, base_id)
            out[d.name] = ref
            if self.exists(ref):
                log(f"{ref} is up to date")
                continue
            log(f"building {ref}")
            self._build_one(d, ref, base_ref, log, self.tag(_BY_NAME[d.parent], base_id) if d.parent else None)
        return out

    def _build_one(self, d: ImageDef, ref: str, base_ref: str, log: Log, parent: str | None = None) -> None:
        steps = _steps(log)
        try:
            args = {"BASE": base_ref, **({"PARENT": parent} if parent else {})}
            if parent and not self.exists(parent):
                raise OperationFailed(f"building {ref} needs {parent}: build it first")
            self.p.build_image(self.context(d), ref, d.target, args, steps)
        except ObjectMissing as e:
            raise OperationFailed(f"building {ref} failed: {e}") from None
        if not self.exists(ref):
            raise OperationFailed(f"building {ref} produced no image")
        self.p.tag_image(ref, d.repo(), "latest")

    # -- NodePackages: derived login/compute images -----------------------------------
    @staticmethod
    def with_packages(refs: dict[str, str], packages: tuple[str, ...]) -> dict[str, str]:
        """`refs` with the login and compute nodes' images replaced by the ones derived
        for `packages` (no packages: `refs` as they are). Tags only; nothing is built."""
        if not packages:
            return dict(refs)
        out = dict(refs)
        for name in PACKAGES_OF:
            if name in refs and not refs[name].startswith(f"hp-{name}-pkgs:"):  # not one derived already
                h = hashlib.sha256(f"{refs[name]}\0{packages_hash(packages)}".encode()).hexdigest()
                out[name] = f"hp-{name}-pkgs:{h[:12]}"
        return out

    def build_packages(
        self, refs: dict[str, str], packages: tuple[str, ...], log: Log = lambda s: None
    ) -> dict[str, str]:
        """Build the derived images of `refs` that are missing (a second call with the
        same images and list builds nothing); the refs with them in. A package apt
        cannot install fails the build with apt's words (OperationFailed)."""
        out = self.with_packages(refs, packages)
        for name in PACKAGES_OF:
            if name not in refs or out[name] == refs[name]:
                continue
            if self.exists(out[name]):
                log(f"{out[name]} is up to date")
                continue
            log(f"building {out[name]} (NodePackages: {' '.join(packages)})")
            with tempfile.TemporaryDirectory(prefix="hp-pkgs-") as tmp:
                (Path(tmp) / "Dockerfile").write_text(PACKAGES_DOCKERFILE)
                (Path(tmp) / "packages.txt").write_text("".join(p + "\n" for p in packages))
                try:
                    self.p.build_image(Path(tmp), out[name], None, {"PARENT": refs[name]}, _steps(log))
                except EngineError as e:
                    raise OperationFailed(f"NodePackages: {e}") from None
            if not self.exists(out[name]):
                raise OperationFailed(f"building {out[name]} produced no image")
        return out

    def status(self, extra: tuple[ImageDef, ...] = ()) -> list[dict[str, str | bool]]:
        """hp's images (and `extra` ones: the multi-host images when hosts are registered)."""
        try:
            base_ref, base_id = self.base(make=False)
        except OperationFailed:
            return [{"Image": d.repo(), "Tag": "", "Present": False} for d in ALL_IMAGES + GPU_IMAGES + extra]
        return [
            {
                "Image": d.repo(),
                "Tag": self.tag(d, base_id),
                "Present": self.exists(self.tag(d, base_id)),
                "Base": base_ref,
            }
            for d in ALL_IMAGES + GPU_IMAGES + extra
        ]
