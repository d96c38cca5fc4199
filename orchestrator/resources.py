"""Where hp's resources are: the one module that knows.

- `images/`: the node, multi-host and file-server image build contexts;
- `slurm-conf/`: the Slurm configuration templates (slurm.conf and its parts, slurmdbd.conf,
  the accounting database's init SQL);
- `healthchecks/`: the check programs and their images (`cpu/`, `gpu/`);
- `data/` (package data, next to this module): instance-types.yaml, gpu-thresholds.yaml.

In a checkout (an editable install) the first three are the repository's top-level folders.
An installed wheel carries them inside the package, under `_resources/` (the build backend's
force-include, pyproject.toml), so hp builds the same images wherever it is installed. The
paths are looked up on the first call, not at import.
"""

from __future__ import annotations

import functools
from pathlib import Path

from .errors import OperationFailed

FOLDERS = ("images", "slurm-conf", "healthchecks")
SHIPPED = "_resources"  # the folder inside the installed package that holds FOLDERS


def package() -> Path:
    return Path(__file__).resolve().parent


@functools.cache
def root() -> Path:
    """The folder that holds images/, slurm-conf/ and healthchecks/: inside the installed
    package, else the checkout's top level."""
    candidates = (package() / SHIPPED, package().parent)
    for r in candidates:
        if all((r / f).is_dir() for f in FOLDERS):
            return r
    raise OperationFailed(
        f"hp's resources ({', '.join(f + '/' for f in FOLDERS)}) are in none of {', '.join(map(str, candidates))}: "
        "reinstall hp (pip install .) or run it from a checkout"
    )


def images() -> Path:
    return root() / "images"


def slurm_conf() -> Path:
    return root() / "slurm-conf"


def healthchecks() -> Path:
    return root() / "healthchecks"


def data(name: str) -> Path:
    """A package data file (data/NAME): read by hp's code, shipped as package data."""
    return package() / "data" / name
