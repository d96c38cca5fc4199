"""`hp images build|list|save|load|key`."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import JsonOpt, env, sub_app
from .output import Out

images_app = sub_app("Build, list, save and load hp's images.")


@images_app.command("build")
def build(
    gpu: bool = typer.Option(
        False,
        "--gpu",
        help="Also the GPU check image (~2.2 GB from PyPI; made by 'hp create' when a cluster has GPUs).",
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Build the node and check images (nothing is rebuilt when nothing changed)."""
    from ..docker.images import ALL_IMAGES, GPU_IMAGES, MULTIHOST_IMAGES

    e = env()
    getattr(e.provider, "source", e.provider).ping()  # images live on the local engine
    out = Out(json_out)
    refs = e.images.build(
        ALL_IMAGES + (MULTIHOST_IMAGES if e.multihost else ()) + (GPU_IMAGES if gpu else ()), log=out.info
    )
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
    json_out: bool = JsonOpt,
) -> None:
    """Save hp's images (base, node, check) as one tar plus a manifest, e.g. for a CI cache."""
    from ..ci.images_io import save_images

    out = Out(json_out)
    doc = save_images(env(), directory, log=out.info)
    if json_out:
        out.json(doc)
    else:
        out.info(f"saved {len(doc['Images'])} images ({doc['Size'] / 1e6:.0f} MB), key {doc['Key']}, to {directory}")


@images_app.command("load")
def load(
    directory: Path = typer.Argument(..., help="Folder written by 'hp images save'."),
    force: bool = typer.Option(False, "--force", help="Load even when every image is already present."),
    json_out: bool = JsonOpt,
) -> None:
    """Load images saved by 'hp images save', after checking the file against its manifest."""
    from ..ci.images_io import load_images

    out = Out(json_out)
    doc = load_images(env(), directory, log=out.info, force=force)
    if json_out:
        out.json(doc)
    else:
        out.info(f"{'loaded' if doc['Loaded'] else 'already present'}: " + ", ".join(i["Ref"] for i in doc["Images"]))


@images_app.command("key")
def key(json_out: bool = JsonOpt) -> None:
    """Print the hash of every image's inputs (a cache key; needs no Docker)."""
    from ..ci.images_io import images_key

    k = images_key(env())
    if json_out:
        Out(True).json({"Key": k})
    else:
        print(k)


GROUPS = (("images", images_app),)
