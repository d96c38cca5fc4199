"""The node images' tags and Slurm's version in them (read from the worker image's dpkg
database): `hp version --images`. They ask the Docker engine and hash the images' build
contexts; hp's and Python's versions are version.py's."""

from __future__ import annotations

from typing import Any

from ..core.context import Env
from ..docker.images import NODE_IMAGES
from ..errors import EngineUnavailable, OperationFailed


def image_versions(env: Env) -> dict[str, Any]:
    """{"images": name -> tag, "slurm": version}; both None, and a note saying why, when no
    engine answers or no image can be built."""
    doc: dict[str, Any] = {}
    try:
        env.provider.ping()
        refs = env.images.refs(NODE_IMAGES)
        doc["images"] = refs
        doc["slurm"] = slurm_version(env, refs["worker"])  # None if not built
    except (EngineUnavailable, OperationFailed) as e:
        doc["images"] = None
        doc["slurm"] = None
        doc["note"] = str(e).splitlines()[0]
    return doc


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
