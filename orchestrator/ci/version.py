"""hp's and Python's versions: `hp version`, at once (no engine asked, no state opened;
image_versions.py has the images' and Slurm's, `hp version --images`)."""

from __future__ import annotations

import sys

from .. import __version__


def versions() -> dict[str, str]:
    return {"hp": __version__, "python": sys.version.split()[0]}
