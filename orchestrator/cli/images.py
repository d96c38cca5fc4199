"""`hp images build|list|save|load|key`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import JsonOpt, env, sub_app
from .output import Out

images_app = sub_app("Build, list, save and load hp's images.")
SpecOpt = typer.Option(
    None, "-f", "--file", help="A cluster spec: its NodePackages' login and compute images are included."
)


def spec_packages(spec_file: Optional[Path]) -> tuple[str, ...]:
    """The NodePackages of a spec file (checked), or none."""
    from ..spec.loader import load_spec_file
    from ..spec.userwork import packages_of

    return packages_of(load_spec_file(spec_file)) if spec_file else ()


@images_app.command("build")
def build(
    gpu: bool = typer.Option(
        False,
        "--gpu",
        help="Also the GPU check image (~2.2 GB from PyPI; made by 'hp create' when a cluster has GPUs).",
    ),
    spec_file: Optional[Path] = SpecOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Build the node and check images (nothing is rebuilt when nothing changed)."""
    from ..docker.images import ALL_IMAGES, GPU_IMAGES, MULTIHOST_IMAGES

    packages = spec_packages(spec_file)
    e = env()
    getattr(e.provider, "source", e.provider).ping()  # images live on the local engine
    out = Out(json_out)
    refs = e.images.build(
        ALL_IMAGES + (MULTIHOST_IMAGES if e.multihost else ()) + (GPU_IMAGES if gpu else ()), log=out.info
    )
    derived = e.images.build_packages(refs, packages, log=out.info)
    refs.update({f"{n}-pkgs": r for n, r in derived.items() if r != refs[n]})
    if json_out:
        out.json({"Images": refs})
    else:
        out.table(None, ["IMAGE", "REFERENCE"], sorted(refs.items()))


@images_app.command("list")
def list_(json_out: bool = JsonOpt) -> None:
    """Show hp's images, the tag their inputs hash to now, and whether it is built."""
    e = env()
    getattr(e.provider, "source", e.provider).ping()  # images live on the local engine
    from ..docker.images import MULTIHOST_IMAGES

    rows = e.images.status(MULTIHOST_IMAGES if e.multihost else ())
    out = Out(json_out)
    if json_out:
        out.json({"Images": rows})
    else:
        out.table(None, ["IMAGE", "TAG", "PRESENT"], [[r["Image"], r["Tag"], r["Present"]] for r in rows])


@images_app.command("save")
def save(
    directory: Path = typer.Argument(..., help="Folder to write the images and manifest into."),
    spec_file: Optional[Path] = SpecOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Save hp's images (base, node, check) as one tar plus a manifest, e.g. for a CI cache."""
    from ..ci.images_io import save_images

    packages = spec_packages(spec_file)
    out = Out(json_out)
    doc = save_images(env(), directory, log=out.info, packages=packages)
    if json_out:
        out.json(doc)
    else:
        out.info(f"saved {len(doc['Images'])} images ({doc['Size'] / 1e6:.0f} MB), key {doc['Key']}, to {directory}")


@images_app.command("load")
def load(
    directory: Path = typer.Argument(..., help="Folder written by 'hp images save'."),
    force: bool = typer.Option(False, "--force", help="Load even when every image is already present."),
    spec_file: Optional[Path] = SpecOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Load images saved by 'hp images save', after checking the file against its manifest."""
    from ..ci.images_io import load_images

    packages = spec_packages(spec_file)
    out = Out(json_out)
    doc = load_images(env(), directory, log=out.info, force=force, packages=packages)
    if json_out:
        out.json(doc)
    else:
        out.info(f"{'loaded' if doc['Loaded'] else 'already present'}: " + ", ".join(i["Ref"] for i in doc["Images"]))


@images_app.command("key")
def key(spec_file: Optional[Path] = SpecOpt, json_out: bool = JsonOpt) -> None:
    """Print the hash of every image's inputs (a cache key; needs no Docker)."""
    from ..ci.images_io import images_key

    k = images_key(env(), spec_packages(spec_file))
    if json_out:
        Out(True).json({"Key": k})
    else:
        print(k)


GROUPS = (("images", images_app),)
