"""bench/ci.py: how long a CI job waits for a cluster and one job, cold and warm.

cold (a fresh runner with no cache, target < 90 s): debootstrap a base into a temporary
     tag, `docker build --no-cache` of the node images on it into temporary tags, create a
     cluster that runs those images (the spec's per-group Image), one `hp submit` job.
     Only the temporary tags are removed afterwards: hp's own images, which others on this
     machine are using, are never touched.
warm (the image cache hit, target < 15 s): `hp images load --force DIR` (verify the file,
     then a real `docker load` of it), `hp create`, one `hp submit` job, each a new hp
     process as in a CI step. On a fresh runner the load also unpacks layers that exist
     here already, so warm here is a lower bound for the load part.
Both print the plain-docker floor of the same run (controller + N workers idle).

Usage: .venv/bin/python bench/ci.py [--skip-cold] [--workers 2] [--write-docs]
"""

from __future__ import annotations

import argparse
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchdocs
from common import bench_env, floor, hp, write_json

from orchestrator.docker.engine import DockerEngine as DockerProvider  # noqa: E402
from orchestrator.docker.images import NODE_IMAGES, Images, mirror  # noqa: E402
from orchestrator.releases import DEFAULT  # noqa: E402

JOB = "#!/bin/bash\nsrun hostname | sort\n"
ITYPE = "cpu.small"


def spec(name: str, n: int, images: dict[str, str] | None = None) -> dict:
    # cpu.small nodes, as hp's default cluster: what a CI job on a 2-vCPU runner would use
    groups = [("controller", "Controller", "cpu.small", 1), ("login", "Login", ITYPE, 1), ("w", "Compute", ITYPE, n)]
    role = {"Controller": "controller", "Login": "login", "Compute": "worker"}
    out = []
    for g, nt, it, c in groups:
        d = {"InstanceGroupName": g, "InstanceType": it, "InstanceCount": c, "SlurmConfig": {"NodeType": nt}}
        if nt == "Compute":
            d["SlurmConfig"]["PartitionNames"] = ["w"]
        if images:
            d["Image"] = images[role[nt]]
        out.append(d)
    return {"ClusterName": name, "InstanceGroups": out}


def timed(label: str, fn, times: dict[str, float]):  # noqa: ANN001, ANN201
    t0 = time.monotonic()
    r = fn()
    times[label] = time.monotonic() - t0
    print(f"  {label:<28} {times[label]:6.1f} s", flush=True)
    return r


def cluster_and_job(
    env: dict[str, str], home: str, n: int, times: dict[str, float], images: dict[str, str] | None = None
) -> None:
    name = f"cibench{secrets.token_hex(2)}"
    f = write_json(Path(home) / f"{name}.json", spec(name, n, images))
    job = Path(home) / "job.sh"
    job.write_text(JOB)
    try:
        timed("hp create", lambda: hp(env, "create", "-f", f, "--timeout", "120"), times)
        r = timed("hp submit (one job)", lambda: hp(env, "submit", name, str(job), "--nodes", str(n)), times)
        assert len(set(r.stdout.split())) == n, r.stdout
    finally:
        hp(env, "delete", name, check=False)


def cold(n: int) -> dict[str, float]:
    p = DockerProvider()
    tag = f"cibench{secrets.token_hex(3)}"
    base = f"hp-base-{tag}:trixie"
    refs = {d.name: f"hp-{d.name}-{tag}:cold" for d in NODE_IMAGES}
    times: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="hp-cold-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            timed(
                "debootstrap",
                lambda: subprocess.run(
                    ["debootstrap", "--variant=minbase", "trixie", str(rootfs), mirror()],
                    check=True,
                    capture_output=True,
                ),
                times,
            )

            def import_base() -> None:
                tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
                repo, t = base.split(":")
                p.api.import_image(
                    src=tar.stdout, repository=repo, tag=t, changes=['CMD ["/bin/bash"]', "ENV LANG=C.UTF-8"]
                )
                tar.wait()

            timed("import base", import_base, times)

        def build() -> None:
            for d in NODE_IMAGES:  # --no-cache for the first; the others share its stages, as in hp's build
                for chunk in p.api.build(
                    path=str(Images(p, DEFAULT).context(d)),
                    tag=refs[d.name],
                    target=d.target,
                    buildargs={"BASE": base},
                    rm=True,
                    forcerm=True,
                    decode=True,
                    nocache=d is NODE_IMAGES[0],
                ):
                    if "error" in chunk:
                        raise SystemExit(f"build failed: {chunk['error']}")

        timed("docker build --no-cache", build, times)
        with tempfile.TemporaryDirectory() as home:
            cluster_and_job(bench_env(home), home, n, times, refs)
        times["total"] = time.monotonic() - t0
    finally:
        for ref in [*refs.values(), base]:  # only the temporary tags made here
            try:
                p.api.remove_image(ref, noprune=False)
            except Exception:  # noqa: BLE001 - never made (an earlier step failed)
                pass
    return times


def warm(n: int) -> dict[str, float]:
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory(prefix="hp-cache-") as cache:
        env = bench_env(home)
        hp(env, "images", "save", cache)  # what a previous run left in the Actions cache (not timed)
        t0 = time.monotonic()
        timed("hp images load --force", lambda: hp(env, "images", "load", "--force", cache), times)
        cluster_and_job(env, home, n, times)
        times["total"] = time.monotonic() - t0
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-cold", action="store_true")
    benchdocs.add_option(ap)
    a = ap.parse_args()
    with benchdocs.section("ci", a.write_docs):
        res = figures(a.workers, a.skip_cold)
    sys.exit(0 if all(t < target for _, t, target in res) else 1)


def figures(n: int, skip_cold: bool) -> list[tuple[str, float, float]]:
    """Prints the floor, warm and (unless skipped) cold; returns (label, seconds, target) of each."""
    fl = floor(n, ITYPE)
    print(f"plain-docker floor, controller + {n} {ITYPE} workers idle: {fl:.2f} s", flush=True)
    print("warm (images from the cache):", flush=True)
    w = warm(n)
    res = [("warm", w["total"], 15.0)]
    if not skip_cold:
        print("cold (no images, no cache):", flush=True)
        c = cold(n)
        res.insert(0, ("cold", c["total"], 90.0))
    for label, t, target in res:
        print(
            f"{label}: {t:.1f} s (target < {target:.0f} s): {'OK' if t < target else 'ABOVE TARGET'}; floor {fl:.2f} s",
            flush=True,
        )
    return res


if __name__ == "__main__":
    main()
