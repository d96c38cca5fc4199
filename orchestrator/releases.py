"""The Slurm releases hp builds, and what differs between them: one row each.

A release is a Slurm major version (`24.11`, `26.05`). hp builds its node images from
Debian's packages of it, on a base of the Debian suite that carries that major: the suite,
the base image's names, apt's settings there, and the REST API versions of its slurmrestd
are the release's row here, read by the image builds (docker/images.py), the spec
(spec/model.py: `SlurmVersion`), `hp create --slurm` and the docs' examples. Nothing else
branches on a release.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class SlurmRelease(StrEnum):
    V24_11 = "24.11"
    V26_05 = "26.05"


# What a spec without SlurmVersion (and `hp create` without --slurm) gets: 26.05 (24.11's support
# ended in May 2026; the e2e suite passes on both, docs/testing.md).
DEFAULT = SlurmRelease.V26_05
# A stored spec of a cluster made before hp had a choice ran this release.
BEFORE_CHOICE = SlurmRelease.V24_11


class Release(NamedTuple):  # a NamedTuple: the CLI imports this module, and no dataclasses
    release: SlurmRelease
    suite: str  # the Debian suite whose packages are this major (debootstrap's suite, the base's tag)
    pull: tuple[str, str]  # the base image pulled when a registry answers: (repository, tag)
    # apt's settings in a base made by debootstrap (/etc/apt/apt.conf.d/99hp): forky's mirrors
    # serve its Release files past their Valid-Until (a suite in development), which apt refuses
    apt_conf: str
    rest_api: str  # slurmrestd's newest data_parser/openapi version (the `hp api` example)
    # slurmctld answers HTTP GET /readyz on its own port (25.11 and later): the agent's
    # controller ping uses it where it reaches the controller's address (slurm/client.py)
    readyz: bool = False

    @property
    def local_base(self) -> str:
        """The base image made locally with debootstrap when no registry answers."""
        return f"hp-base:{self.suite}"

    @property
    def pulled_base(self) -> str:
        return f"{self.pull[0]}:{self.pull[1]}"


RELEASES: dict[SlurmRelease, Release] = {
    r.release: r
    for r in (
        Release(SlurmRelease.V24_11, "trixie", ("debian", "trixie-slim"), "", "v0.0.42"),
        Release(
            SlurmRelease.V26_05,
            "forky",
            ("debian", "forky-slim"),
            'Acquire::Check-Valid-Until "false";\n',
            "v0.0.45",
            readyz=True,
        ),
    )
}


def names() -> str:
    """The releases, for a message: `24.11, 26.05`."""
    return ", ".join(r.value for r in SlurmRelease)


def problem(value: object, where: str) -> str | None:
    """Why `value` is not a release hp has (None: it is one). A YAML number (26.05 written
    without quotes) is named as such."""
    if isinstance(value, str) and value in SlurmRelease._value2member_map_:
        return None
    hint = f' (a YAML number: quote it, "{value}")' if isinstance(value, float | int) else ""
    return f"{where}: Slurm release {value!r} is not one hp has ({names()}){hint}"
