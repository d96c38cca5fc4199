"""`hp images build|list|save|load|key`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from ..errors import BadInput
from .common import JsonOpt, SlurmOpt, env, sub_app
from .output import Out

if TYPE_CHECKING:
    from ..releases import SlurmRelease

images_app = sub_app("Build, list, save and load hp's images.")
SpecOpt = typer.Option(
    None, "-f", "--file", help="A cluster spec: its NodePackages' login and compute images are included."
)


def spec_inputs(spec_file: Optional[Path], slurm: Optional[str]) -> tuple[tuple[str, ...], SlurmRelease]:
    """The NodePackages of a spec file (checked), or none, and the Slurm release: --slurm,
    else the spec's SlurmVersion, else the default. Every problem named at once."""
    from ..releases import DEFAULT, SlurmRelease, problem
    from ..spec.loader import load_spec_file
    from ..spec.userwork import packages_of

    raw = load_spec_file(spec_file) if spec_file else {}
    problems: list[str] = []
    try:
        packages = packages_of(raw)
    except BadInput as e:
        problems, packages = list(e.problems), ()
    given, where = (
        (slurm, "--slurm")
        if slurm is not None
        else (raw.get("SlurmVersion") if isinstance(raw, dict) else None, "SlurmVersion")
    )
    if given is not None and (bad := problem(given, where)):
        problems.append(bad)
    if problems:
        raise BadInput(problems, "invalid cluster spec" if spec_file else "invalid option")
    return packages, (SlurmRelease(given) if given is not None else DEFAULT)


@images_app.command("build")
def build(
    gpu: bool = typer.Option(
        False,
        "--gpu",
        help="Also the GPU check image (~2.2 GB from PyPI; made by 'hp create' when a cluster has GPUs).",
    ),
    spec_file: Optional[Path] = SpecOpt,
    slurm: Optional[str] = SlurmOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Build one Slurm release's node and check images (nothing is rebuilt when nothing changed)."""
    from ..docker.images import ALL_IMAGES, GPU_IMAGES, cluster_images

    packages, release = spec_inputs(spec_file, slurm)
    e = env()
    e.provider.image_source().ping()
    out = Out(json_out)
    images = e.images(release)
    refs = images.build(ALL_IMAGES + cluster_images(e.provider) + (GPU_IMAGES if gpu else ()), log=out.info)
    derived = images.build_packages(refs, packages, log=out.info)
    refs.update({f"{n}-pkgs": r for n, r in derived.items() if r != refs[n]})
    if json_out:
        out.json({"Images": refs})
    else:
        out.table(None, ["IMAGE", "REFERENCE"], sorted(refs.items()))


@images_app.command("list")
def list_(json_out: bool = JsonOpt) -> None:
    """Show hp's images of every Slurm release, the tag their inputs hash to now, and whether it is built."""
    e = env()
    e.provider.image_source().ping()
    from ..docker.images import cluster_images
    from ..releases import SlurmRelease

    rows = [r for rel in SlurmRelease for r in e.images(rel).status(cluster_images(e.provider))]
    out = Out(json_out)
    if json_out:
        out.json({"Images": rows})
    else:
        out.table(
            None, ["IMAGE", "SLURM", "TAG", "PRESENT"], [[r["Image"], r["Slurm"], r["Tag"], r["Present"]] for r in rows]
        )


@images_app.command("save")
def save(
    directory: Path = typer.Argument(..., help="Folder to write the images and manifest into."),
    spec_file: Optional[Path] = SpecOpt,
    slurm: Optional[str] = SlurmOpt,
    json_out: bool = JsonOpt,
) -> None:
    """Save one Slurm release's images (base, node, check) as one tar plus a manifest, e.g. for a CI cache."""
    from ..ci.images_io import save_images

    packages, release = spec_inputs(spec_file, slurm)
    out = Out(json_out)
    doc = save_images(env(), release, directory, log=out.info, packages=packages)
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

    packages, _ = spec_inputs(spec_file, None)  # the release is the saved images' (their manifest)
    out = Out(json_out)
    doc = load_images(env(), directory, log=out.info, force=force, packages=packages)
    if json_out:
        out.json(doc)
    else:
        out.info(f"{'loaded' if doc['Loaded'] else 'already present'}: " + ", ".join(i["Ref"] for i in doc["Images"]))


@images_app.command("key")
def key(spec_file: Optional[Path] = SpecOpt, slurm: Optional[str] = SlurmOpt, json_out: bool = JsonOpt) -> None:
    """Print the hash of one Slurm release's images' inputs (a cache key; needs no Docker)."""
    from ..ci.images_io import images_key

    packages, release = spec_inputs(spec_file, slurm)
    k = images_key(env(), release, packages)
    if json_out:
        Out(True).json({"Key": k})
    else:
        print(k)


GROUPS = (("images", images_app),)
