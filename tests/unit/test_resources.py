"""Where hp's resources are (orchestrator/resources.py): the checkout's top-level folders, or
the copy an installed wheel carries inside the package; and the wheel's mapping says the same."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import resources
from orchestrator.docker.images import ALL_IMAGES, GPU_IMAGES, MULTIHOST_IMAGES, Images
from orchestrator.errors import OperationFailed
from orchestrator.releases import DEFAULT

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh() -> Iterator[None]:
    resources.root.cache_clear()
    yield
    resources.root.cache_clear()


def test_a_checkout_uses_its_top_level_folders(fresh: None) -> None:
    assert resources.root() == REPO
    assert resources.images() == REPO / "images"
    assert resources.slurm_conf() == REPO / "slurm-conf"
    assert resources.healthchecks() == REPO / "healthchecks"
    assert resources.data("instance-types.yaml") == REPO / "orchestrator" / "data" / "instance-types.yaml"
    assert resources.data("gpu-thresholds.yaml").is_file()


def test_every_image_context_is_a_folder_with_a_dockerfile() -> None:
    images = Images(provider=None, release=DEFAULT)  # type: ignore[arg-type]  # contexts only
    for d in ALL_IMAGES + GPU_IMAGES + MULTIHOST_IMAGES:
        assert (images.context(d) / "Dockerfile").is_file(), d


def test_an_installed_package_uses_the_copy_inside_it(fresh: None, tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "site-packages" / "orchestrator"
    for f in resources.FOLDERS:
        (pkg / resources.SHIPPED / f).mkdir(parents=True)
        (tmp_path / "site-packages" / f).mkdir()  # a stray folder next to the package is not used
    monkeypatch.setattr(resources, "package", lambda: pkg)
    assert resources.root() == pkg / resources.SHIPPED
    assert resources.slurm_conf() == pkg / resources.SHIPPED / "slurm-conf"


def test_no_resources_anywhere_says_so(fresh: None, tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "site-packages" / "orchestrator"
    (pkg / resources.SHIPPED / "images").mkdir(parents=True)  # incomplete: no slurm-conf/, no healthchecks/
    monkeypatch.setattr(resources, "package", lambda: pkg)
    with pytest.raises(OperationFailed, match="reinstall hp"):
        resources.root()


def test_the_wheel_carries_the_folders_where_resources_looks() -> None:
    hatch = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert hatch["force-include"] == {f: f"orchestrator/{resources.SHIPPED}/{f}" for f in resources.FOLDERS}
    assert hatch["packages"] == ["orchestrator"]  # with orchestrator/data/*.yaml, its package data
