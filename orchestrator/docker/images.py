"""Build hp's images, tagged with a hash of their inputs.

The build contexts are the checkout's images/ and healthchecks/ folders, which a wheel
carries inside the package (resources.py), so hp installed anywhere builds the same images. A second build with nothing changed inspects
the tags and builds nothing. Each Slurm release has its own set of images (`Images` is one
release's), on a base of the Debian suite that carries it (releases.py): `debian:<suite>-slim`
when it is present or can be pulled; else it is made locally with debootstrap and imported
(no registry needed, only a Debian mirror). A tag says its release: `hp-worker:26.05-<hash>`.
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
from ..releases import DEFAULT, RELEASES, SlurmRelease
from .provider import Provider

DEBOOTSTRAP_TIMEOUT = 900.0
DEBOOTSTRAP_SCRIPTS = Path("/usr/share/debootstrap/scripts")

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
# `hp create` (and `hp images build`) when hosts are registered: the multi-host provider
# names them (its cluster_images(); cluster_images below).
MULTIHOST_IMAGES = (
    ImageDef("node-mh", "images/node-mh", None, parent="worker"),
    ImageDef("fileserver", "images/fileserver", None, parent="node-mh"),
)
_BY_NAME = {d.name: d for d in NODE_IMAGES + SERVICE_IMAGES + CHECK_IMAGES + GPU_IMAGES + MULTIHOST_IMAGES}


def cluster_images(provider: Provider) -> tuple[ImageDef, ...]:
    """The images a cluster needs on this provider beyond hp's node images
    (Provider.cluster_images: MULTIHOST_IMAGES across hosts, none on one engine)."""
    return tuple(_BY_NAME[n] for n in provider.cluster_images())


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


def parse_dpkg_version(status: str, package: str) -> str | None:
    """An installed package's version in a dpkg status file."""
    for para in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Package") == package and "installed" in fields.get("Status", ""):
            return fields.get("Version")
    return None


def slurm_version(provider: Provider, ref: str) -> str | None:
    """Slurm's exact version in an image (Debian's slurmd package: `26.05.5-1`), read from its
    dpkg database without running it; None when the image is absent or has no slurmd."""
    if provider.image_id(ref) is None:
        return None
    return parse_dpkg_version(provider.read_image_file(ref, "/var/lib/dpkg/status").decode(errors="replace"), "slurmd")


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


def base_refs() -> tuple[str, ...]:
    """Every release's base image names (pulled and local): images of hp's that run anywhere."""
    return tuple(ref for r in RELEASES.values() for ref in (r.pulled_base, r.local_base))


class Images:
    """One Slurm release's images."""

    def __init__(self, provider: Provider, release: SlurmRelease, root: Path | None = None):
        self.p = provider
        self.release = release
        self.rel = RELEASES[release]
        self.root = root or resources.root()  # the folder the ImageDefs' contexts are relative to
        self._base: tuple[str, str] | None = None  # (ref, image id)

    # -- base -----------------------------------------------------------------------
    def base(self, log: Log = lambda s: None, make: bool = True) -> tuple[str, str]:
        """(reference, image id) of the base image, made if needed and `make`."""
        if self._base:
            return self._base
        pulled, local = self.rel.pulled_base, self.rel.local_base
        for ref in (pulled, local):
            if (iid := self.p.image_id(ref)) is not None:
                self._base = (ref, iid)
                return self._base
        if not make:
            raise OperationFailed("no base image: run 'hp images build'")
        try:
            log(f"pulling {pulled}")
            self.p.pull(*self.rel.pull)
        except EngineError as e:  # no registry: fall back to a local base
            log(f"cannot pull {pulled} ({str(e).splitlines()[0][:120]}); making {local} with debootstrap")
        else:
            iid = self.p.image_id(pulled)
            if iid is not None:
                self._base = (pulled, iid)
                return self._base
        self._debootstrap(log)
        iid = self.p.image_id(local)
        if iid is None:
            raise OperationFailed(f"importing {local} produced no image")
        self._base = (local, iid)
        return self._base

    def _debootstrap(self, log: Log) -> None:
        if not shutil.which("debootstrap"):
            raise OperationFailed(
                f"no base image: {self.rel.pulled_base} can't be pulled and debootstrap is not installed.\n"
                "Install it (apt-get install -y debootstrap) and run as root, or make the pull work."
            )
        with tempfile.TemporaryDirectory(prefix="hp-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            suite = self.rel.suite
            cmd = ["debootstrap", "--variant=minbase", suite, str(rootfs), mirror()]
            if not (DEBOOTSTRAP_SCRIPTS / suite).exists():  # a debootstrap older than the suite: sid's script
                cmd.append(str(DEBOOTSTRAP_SCRIPTS / "sid"))
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
            if self.rel.apt_conf:
                (rootfs / "etc/apt/apt.conf.d/99hp").write_text(self.rel.apt_conf)
            tar_path = Path(tmp) / "rootfs.tar"
            with tarfile.open(tar_path, "w") as tar:
                tar.add(rootfs, arcname=".")
            shutil.rmtree(rootfs, ignore_errors=True)
            log(f"importing {self.rel.local_base}")
            repo, tag = self.rel.local_base.split(":")
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
        h.update(b"\0" + self.release.value.encode())
        if d.parent:
            h.update(b"\0" + self.tag(_BY_NAME[d.parent], base_id).encode())
        return f"{d.repo()}:{self.release.value}-{h.hexdigest()[:12]}"

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
            args = {"BASE": base_ref, "SLURM_RELEASE": self.release.value, **({"PARENT": parent} if parent else {})}
            if parent and not self.exists(parent):
                raise OperationFailed(f"building {ref} needs {parent}: build it first")
            self.p.build_image(self.context(d), ref, d.target, args, steps)
        except ObjectMissing as e:
            raise OperationFailed(f"building {ref} failed: {e}") from None
        if not self.exists(ref):
            raise OperationFailed(f"building {ref} produced no image")
        self.p.tag_image(ref, d.repo(), self.release.value)  # hp-worker:26.05: the release's newest
        if self.release is DEFAULT:
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
                # the parent's release leads the tag too (hp-worker-pkgs:26.05-<hash>): hp upgrade
                # tells a node's release by it
                release = refs[name].rsplit(":", 1)[-1].split("-", 1)[0]
                out[name] = f"hp-{name}-pkgs:{release}-{h[:12]}" if release in RELEASES else f"hp-{name}-pkgs:{h[:12]}"
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
            return [
                {"Image": d.repo(), "Slurm": self.release.value, "Tag": "", "Present": False}
                for d in ALL_IMAGES + GPU_IMAGES + extra
            ]
        return [
            {
                "Image": d.repo(),
                "Slurm": self.release.value,
                "Tag": self.tag(d, base_id),
                "Present": self.exists(self.tag(d, base_id)),
                "Base": base_ref,
            }
            for d in ALL_IMAGES + GPU_IMAGES + extra
        ]
