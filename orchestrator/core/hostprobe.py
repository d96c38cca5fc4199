"""Can a host run hp's nodes? Probed with a short-lived container on its engine, by
`hp hosts add` (a host that cannot is not recorded) and by create's preflight on every
reachable host (a host that lost it since is refused before any image is streamed or
any container of the cluster made). Both refuse with exit 2, the reason and the fix.

What login and compute nodes on a registered host need (core/launcher.py): the
engine hands them /dev/fuse (they mount /home from the file server with a FUSE client)
and lets them mount (CAP_SYS_ADMIN, AppArmor unconfined); and the host reaches a swarm
manager on the swarm's TCP ports (2377 to join, 7946 for the overlay's gossip). The
probe runs in the base image (streamed from the local engine once when the host lacks
it: node images are built on it, so its layers travel anyway).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from ..docker.views import LOCAL_ENGINE, ContainerSpec
from ..errors import EngineError, ObjectMissing
from ..naming import L_MANAGED, L_ROLE

PROBE_TIMEOUT_S = 30.0
PORTS = (2377, 7946)  # the swarm's TCP ports on a manager (4789/udp, VXLAN, is proven by traffic)
FUSE_FIX = (
    "load the fuse module on that machine (modprobe fuse: /dev/fuse must exist there); for a Docker-in-Docker "
    "host, start its container with --device /dev/fuse"
)
MOUNT_FIX = "let containers mount: an engine that refuses CAP_SYS_ADMIN or AppArmor unconfined cannot run the nodes"
PORTS_FIX = "open TCP 2377 and 7946 (and UDP 7946, 4789) between the hosts"

# exit codes of the script: which need failed
SCRIPT = r"""
[ -c /dev/fuse ] || { echo "/dev/fuse is not a character device in the container"; exit 3; }
mkdir -p /tmp/hp-probe && mount -t tmpfs hp-probe /tmp/hp-probe 2>&1 || exit 4
umount /tmp/hp-probe
for port in $HP_PORTS; do
  timeout 3 bash -c "exec 3<>/dev/tcp/$HP_MANAGER/$port" 2>/dev/null \
    || { echo "no TCP connection to the swarm manager $HP_MANAGER:$port"; exit 5; }
done
echo ok
"""


def probe_spec(image: str, manager: str | None, host: str = LOCAL_ENGINE) -> ContainerSpec:
    return ContainerSpec(
        host=host,
        name=f"hp-probe-{uuid.uuid4().hex[:8]}",
        image=image,
        labels={L_MANAGED: "1", L_ROLE: "probe"},
        network="host",  # the host's own network: the swarm's ports as the engine reaches them
        environment={"HP_MANAGER": manager or "", "HP_PORTS": " ".join(map(str, PORTS)) if manager else ""},
        entrypoint=["bash", "-c"],
        command=[SCRIPT],
        devices=["/dev/fuse:/dev/fuse:rwm"],
        cap_add=["SYS_ADMIN"],
        security_opt=["apparmor=unconfined"],
        memory_bytes=64 << 20,
        init=False,
    )


def ensure_image(engine: Any, source: Any, ref: str, iid: str, log: Callable[[str], None]) -> None:
    """The probe's image on the host: streamed from the local engine when it lacks it."""
    if engine.image_id(ref) == iid:
        return
    log(f"streaming {ref} from the local engine (the probe runs in it; node images are built on it)")
    engine.load_images(source.save_images([ref]))


def problems(engine: Any, image: str, manager: str | None, host: str = LOCAL_ENGINE) -> list[str]:
    """What keeps nodes from running on the host of `engine` (a host's engine, or the
    hosts' provider and the `host` to probe; empty: nothing)."""
    try:
        r = engine.run_once(probe_spec(image, manager, host), timeout=PROBE_TIMEOUT_S)
    except ObjectMissing:  # its image is not there: hp's fault, not the host's
        raise
    except EngineError as e:
        why = _first(e)
        if "/dev/fuse" in why:
            return [f"its engine cannot hand containers /dev/fuse ({why}): {FUSE_FIX}"]
        if "apparmor" in why.lower() or "capabilit" in why.lower():
            return [f"its engine refuses what nodes need to mount ({why}): {MOUNT_FIX}"]
        return [f"a probe container does not run there ({why})"]
    out = (r.output or "").strip().splitlines()
    last = out[-1][:300] if out else ""
    if r.exit_code == 0:
        return []
    if r.exit_code == 3:
        return [f"{last}: {FUSE_FIX}"]
    if r.exit_code == 4:
        return [f"a container cannot mount there ({last}): {MOUNT_FIX}"]
    if r.exit_code == 5:
        return [f"{last}: {PORTS_FIX}"]
    return [f"the probe container exited {r.exit_code}: {last}"]


def _first(e: BaseException) -> str:
    return str(e).splitlines()[0][:300] if str(e) else type(e).__name__
