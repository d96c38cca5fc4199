"""Slurm releases (issue 48): a Debian suite that does not carry the release asked for fails the
node image build, saying so and naming the fix, instead of building another Slurm major.

Real Docker and Debian's mirror: the node images' first stage is built on the default release's
base with another release asked for (the suite offers only its own major)."""

from __future__ import annotations

import uuid

import pytest

from orchestrator.docker.engine import DockerEngine
from orchestrator.docker.images import NODE_IMAGES, Images
from orchestrator.errors import EngineError
from orchestrator.releases import DEFAULT, RELEASES, SlurmRelease


def test_a_suite_without_the_release_fails_the_build_naming_it_and_the_fix(docker_ok: None) -> None:
    p = DockerEngine()
    images = Images(p, DEFAULT)
    base_ref, _ = images.base(make=False)  # made by `make images` (hp images build)
    other = next(r for r in SlurmRelease if r is not DEFAULT)
    tag = f"hp-test-release-{uuid.uuid4().hex[:6]}:x"
    with pytest.raises(EngineError) as ei:
        p.build_image(
            images.context(NODE_IMAGES[0]), tag, "spank", {"BASE": base_ref, "SLURM_RELEASE": other}, lambda s: None
        )
    assert p.image_id(tag) is None  # nothing was built under the tag
    said = str(ei.value)
    suite = RELEASES[DEFAULT].suite
    assert f"hp: Debian {suite} offers Slurm {DEFAULT}." in said, said  # the candidate it found, e.g. 26.05.5-1
    assert f"not {other}: hp does not build Slurm {other} from it" in said, said
    assert "hp images build --slurm RELEASE" in said and "HP_DEBIAN_MIRROR" in said, said
