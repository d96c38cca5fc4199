"""hp's images as files, for a CI cache: `hp images save/load/key`."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.context import Env
from ..docker.images import ALL_IMAGES, CHECK_IMAGES, NODE_IMAGES, context_hash, packages_hash
from ..errors import BadInput, EngineError, OperationFailed
from ..releases import BEFORE_CHOICE, RELEASES, SlurmRelease, problem

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
Log = Callable[[str], None]


# -- images as files ---------------------------------------------------------------------
def images_key(env: Env, release: SlurmRelease, packages: tuple[str, ...] = ()) -> str:
    """Hash of one Slurm release's images' inputs (the release and its base recipe, build
    contexts, targets; a spec's NodePackages), computable on a fresh runner before any image
    exists: the actions/cache key, which starts with the release (`26.05-...`). (The image
    tags themselves also hash the base image's id, which only exists once it is made.)"""
    rel = RELEASES[release]
    h = hashlib.sha256(f"hp-images/{MANIFEST_FORMAT}\0{rel}\0".encode())
    for d in ALL_IMAGES:
        h.update(f"{d.name}\0{d.target or ''}\0".encode())
        h.update(context_hash(env.images(release).context(d)).encode())
    if packages:  # without: the key hp had before NodePackages existed
        h.update(f"NodePackages\0{packages_hash(packages)}\0".encode())
    return f"{release}-{h.hexdigest()[:24]}"


def _present_refs(env: Env, release: SlurmRelease, packages: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(logical name, reference) of what save stores: base, node images (with NodePackages,
    the derived login and compute images too), check images if built."""
    images = env.images(release)
    base_ref, base_id = images.base(make=False)
    out = [("base", base_ref)]
    for d in NODE_IMAGES:
        ref = images.tag(d, base_id)
        if not images.exists(ref):
            raise OperationFailed(f"image {ref} is not built: run 'hp images build --slurm {release}' first")
        out.append((d.name, ref))
    base_refs = dict(out)
    for name, ref in images.with_packages(base_refs, packages).items():
        if ref != base_refs[name]:
            if not images.exists(ref):
                raise OperationFailed(f"image {ref} (NodePackages) is not built: run 'hp images build -f SPEC' first")
            out.append((f"{name}-pkgs", ref))
    for d in CHECK_IMAGES:
        ref = images.tag(d, base_id)
        if images.exists(ref):
            out.append((d.name, ref))
    return out


def save_images(
    env: Env, release: SlurmRelease, directory: Path, log: Log = lambda s: None, packages: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Write one release's images into one tar (layers shared by the images stored once) and
    a manifest with the release, each image's id and the tar's sha256, under `directory`."""
    env.provider.ping()
    refs = _present_refs(env, release, packages)
    key = images_key(env, release, packages)
    directory.mkdir(parents=True, exist_ok=True)
    fname = f"hp-images-{key}.tar"
    tmp = directory / (fname + ".part")
    h, size = hashlib.sha256(), 0
    log(f"saving {len(refs)} images to {directory / fname}")
    with open(tmp, "wb") as f:
        for chunk in env.provider.save_images([r for _, r in refs]):
            f.write(chunk)
            h.update(chunk)
            size += len(chunk)
    os.replace(tmp, directory / fname)  # never leave a half-written tar under the final name
    for old in directory.glob("hp-images-*.tar"):
        if old.name != fname:
            old.unlink()
    doc = {
        "Format": MANIFEST_FORMAT,
        "Slurm": release.value,
        "Key": key,
        "File": fname,
        "Sha256": h.hexdigest(),
        "Size": size,
        "Images": [{"Name": n, "Ref": r, "Id": env.provider.image_id(r)} for n, r in refs],
    }
    (directory / MANIFEST).write_text(json.dumps(doc, indent=2) + "\n")
    return {"Directory": str(directory), **doc}


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest, checked for shape; every problem found is reported at once."""
    mpath = directory / MANIFEST
    if not directory.is_dir():
        raise BadInput(
            f"{directory} is not a directory (save images there with 'hp images save {directory}')",
            "cannot load images",
        )
    if not mpath.is_file():
        raise BadInput(f"{mpath} is missing: {directory} holds no saved images", "cannot load images")
    try:
        doc = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise BadInput(f"{mpath} is corrupt: {e}", "cannot load images") from None
    problems = []
    if not isinstance(doc, dict):
        raise BadInput(f"{mpath} is corrupt: not a JSON object", "cannot load images")
    if doc.get("Format") != MANIFEST_FORMAT:
        problems.append(f"{mpath}: format {doc.get('Format')!r} is not {MANIFEST_FORMAT}")
    for k, t in (("File", str), ("Sha256", str), ("Size", int), ("Images", list), ("Key", str)):
        if not isinstance(doc.get(k), t):
            problems.append(f"{mpath}: {k} is missing or not a {t.__name__}")
    if isinstance(doc.get("File"), str) and ("/" in doc["File"] or not (directory / doc["File"]).is_file()):
        problems.append(f"image file {directory / str(doc['File'])} is missing")
    if "Slurm" in doc and (bad := problem(doc["Slurm"], f"{mpath}: Slurm")):
        problems.append(bad)
    if problems:
        raise BadInput(problems, "cannot load images")
    return doc


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


def load_images(
    env: Env, directory: Path, log: Log = lambda s: None, force: bool = False, packages: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Verify the saved tar against its manifest, then load it into the engine (unless every
    image is already there, or `force`) and check every image has the id it was saved with."""
    doc = read_manifest(directory)
    path = directory / doc["File"]
    size = path.stat().st_size
    if size != doc["Size"]:
        raise OperationFailed(f"{path} is corrupt: {size} bytes, the manifest says {doc['Size']}")
    digest = _sha256_file(path)
    if digest != doc["Sha256"]:
        raise OperationFailed(f"{path} is corrupt: sha256 {digest[:16]}..., the manifest says {doc['Sha256'][:16]}...")
    env.provider.ping()
    missing = [i for i in doc["Images"] if env.provider.image_id(i["Ref"]) != i["Id"]]
    if missing or force:
        log(f"loading {len(doc['Images'])} image(s) from {path}")
        with open(path, "rb") as f:
            try:
                env.provider.load_images(f)
            except EngineError as e:
                raise OperationFailed(f"loading {path} failed: {e}") from None
    else:
        log("every image is already present with the saved id: nothing to load")
    wrong = [i["Ref"] for i in doc["Images"] if env.provider.image_id(i["Ref"]) != i["Id"]]
    if wrong:
        raise OperationFailed(f"after loading {path}, these images are missing or differ: {', '.join(wrong)}")
    release = SlurmRelease(doc["Slurm"]) if "Slurm" in doc else BEFORE_CHOICE  # saved before hp had a choice
    key = images_key(env, release, packages)
    if doc["Key"] != key:
        log(
            f"note: these images were saved for inputs {doc['Key']}, the inputs now hash to {key}: "
            "'hp create' will build what changed"
        )
    return {
        "Directory": str(directory),
        "Slurm": release.value,
        "Key": doc["Key"],
        "KeyMatches": doc["Key"] == key,
        "Loaded": bool(missing or force),
        "Images": doc["Images"],
    }
