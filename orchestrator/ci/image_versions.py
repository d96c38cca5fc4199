"""The node images' tags and Slurm's version in them, per Slurm release (read from the
worker image's dpkg database): `hp version --images`. They ask the Docker engine and hash
the images' build contexts; hp's and Python's versions are version.py's."""

from __future__ import annotations

from typing import Any

from ..core.context import Env
from ..docker.images import NODE_IMAGES
from ..errors import EngineUnavailable, OperationFailed
from ..releases import DEFAULT, SlurmRelease


def image_versions(env: Env) -> dict[str, Any]:
    """{"images": name -> tag, "slurm": version} of the default release (hp's output before
    it had a choice), and "releases": release -> the same of each; a release's are None, and
    a note says why, when no engine answers or its images cannot be built."""
    per = {r.value: release_versions(env, r) for r in SlurmRelease}
    return {**per[DEFAULT.value], "releases": per}


def release_versions(env: Env, release: SlurmRelease) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    try:
        env.provider.ping()
        refs = env.images(release).refs(NODE_IMAGES)
        doc["images"] = refs
        doc["slurm"] = env.slurm_version(refs["worker"])  # None if not built
    except (EngineUnavailable, OperationFailed) as e:
        doc["images"] = None
        doc["slurm"] = None
        doc["note"] = str(e).splitlines()[0]
    return doc
