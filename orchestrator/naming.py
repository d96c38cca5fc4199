"""Names and labels. Labels on containers, networks and volumes are the truth of
what exists; names are derived from (cluster, group, index) alone."""

from __future__ import annotations

from collections.abc import Mapping

LABEL_PREFIX = "io.hp"
L_MANAGED = f"{LABEL_PREFIX}.managed"
L_CLUSTER = f"{LABEL_PREFIX}.cluster"
L_GROUP = f"{LABEL_PREFIX}.group"
L_ROLE = f"{LABEL_PREFIX}.role"  # controller | login | worker | network | state | shared | check | ...
L_NODE = f"{LABEL_PREFIX}.node"  # Slurm node name (= hostname)
L_INDEX = f"{LABEL_PREFIX}.index"
L_ITYPE = f"{LABEL_PREFIX}.instance-type"
L_GPUS = f"{LABEL_PREFIX}.gpus"  # the host GPUs (ids) backing a node
L_GPU_MODE = f"{LABEL_PREFIX}.gpu-mode"  # how they are given: runtime | cdi | devices | none (HP_GPUS stand-ins)
L_GPU_MODEL = f"{LABEL_PREFIX}.gpu-model"  # hp's model name of a node's GPUs (h200...)
L_GPU_DEVICES = f"{LABEL_PREFIX}.gpu-devices"  # their /dev/nvidiaN, in the node's order (gres.conf File=)
L_REQUEST = f"{LABEL_PREFIX}.health-request"  # a check container's health-check request
L_HOST = f"{LABEL_PREFIX}.host"  # the registered host a container was placed on (multi-host only)
L_HOME = f"{LABEL_PREFIX}.home"  # on a cluster's network: the hp state folder (HP_HOME) that made it
L_WATCHES = f"{LABEL_PREFIX}.watches"  # the node container a GPU monitor watches
L_SLURM_RELEASE = f"{LABEL_PREFIX}.slurm-release"  # a node image's Slurm release (images/node/Dockerfile)

# the default user of every cluster (`hp exec` runs as it; its home is on the shared /home)
DEFAULT_USER = "hpuser"
DEFAULT_UID = 1000  # the image's; a cluster's hpuser has the uid and gid of whoever made it (user_ids)
# Debian's ordinary users' and groups' ids: hp's node images hold hpuser alone among them
USER_IDS = range(1000, 60000)


def user_ids(environ: Mapping[str, str], uid: int, gid: int) -> tuple[int, int]:
    """The uid and gid a new cluster's hpuser gets, so that what its jobs write in a mounted
    folder belongs to whoever ran `hp create` (uid, gid: that process's): under sudo, the
    user who ran sudo (SUDO_UID, SUDO_GID). Each id outside USER_IDS (root itself, a system
    account or group, such as the docker group a CI runner's user may have as its own) is
    the image's, DEFAULT_UID."""
    if uid == 0:
        uid, gid = _number(environ.get("SUDO_UID"), uid), _number(environ.get("SUDO_GID"), gid)
    return (uid if uid in USER_IDS else DEFAULT_UID), (gid if gid in USER_IDS else DEFAULT_UID)


def _number(text: str | None, default: int) -> int:
    return int(text) if text and text.isdigit() else default


ROLE_BY_NODE_TYPE = {"Controller": "controller", "Login": "login", "Compute": "worker"}
# the roles of Slurm nodes' containers (not "check": health-check containers carry a node's labels too)
NODE_ROLES = ("controller", "login", "worker")

# Cluster services (not Slurm nodes): role -> the container's hostname (its alias on the
# cluster's network, the name slurm.conf and slurmdbd.conf use). A node's name always
# ends in -<index>, so none of these can be a node's.
# "accounting": an older cluster's container of slurmdbd and its MariaDB (both run in the
# controller's container now: images/node/hp-entry).
SERVICE_HOSTS = {"accounting": "slurmdbd", "rest": "slurmrestd"}


def labels(
    cluster: str,
    role: str,
    group: str | None = None,
    node: str | None = None,
    index: int | None = None,
    itype: str | None = None,
) -> dict[str, str]:
    out = {L_MANAGED: "1", L_CLUSTER: cluster, L_ROLE: role}
    if group is not None:
        out[L_GROUP] = group
    if node is not None:
        out[L_NODE] = node
    if index is not None:
        out[L_INDEX] = str(index)
    if itype is not None:
        out[L_ITYPE] = itype
    return out


def node_name(group: str, index: int) -> str:
    """Slurm node name and hostname: the group's name (lower case) and a 1-based index."""
    return f"{group.lower()}-{index}"


def split_node(node: str) -> tuple[str, int]:
    """(group prefix, index) of a node name; index 0 when it has none."""
    base, _, idx = node.rpartition("-")
    return (base, int(idx)) if idx.isdigit() and base else (node, 0)


def group_prefix(node: str) -> str:
    return split_node(node)[0]


def container_name(cluster: str, node: str) -> str:
    return f"hp-{cluster}-{node}"


def network_name(cluster: str) -> str:
    return f"hp-{cluster}"


def fileserver_name(cluster: str) -> str:
    """A multi-host cluster's /home file server (GlusterFS), on the controller's host;
    also its DNS name on the cluster's overlay network. Never a node's name: those end
    in -<index>."""
    return f"hp-{cluster}-home"


def monitor_name(cluster: str, node: str) -> str:
    """A GPU node's passive monitor container."""
    return f"hp-{cluster}-{node}-gpumon"


def state_volume(cluster: str) -> str:
    return f"hp-{cluster}-slurmctld"


def shared_volume(cluster: str) -> str:
    return f"hp-{cluster}-home"


def service_container(cluster: str, role: str) -> str:
    """A cluster service's container: hp-<cluster>-slurmdbd, -slurmrestd."""
    return container_name(cluster, SERVICE_HOSTS[role])


def database_volume(cluster: str) -> str:
    """The accounting database's data (MariaDB's datadir, in the controller's container;
    an older cluster's: in slurmdbd's)."""
    return f"hp-{cluster}-db"


def node_id(container_id: str) -> str:
    """HyperPod-like instance id: a replaced node gets a new id, same Slurm name."""
    return "i-" + container_id[:17]
