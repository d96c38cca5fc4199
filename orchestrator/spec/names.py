"""Name rules beyond HyperPod's pattern: the names hp derives from a cluster's and a
group's names must work in Docker, its DNS, the kernel and Slurm (pure functions).

HyperPod's rule ([a-zA-Z0-9](-*[a-zA-Z0-9])*, at most 63 characters, in spec/model.py) lets
through names that cannot work here. Found by creating real clusters (Slurm 24.11,
Docker 20.10, runc), see the report of issue 9:

- A node's container is named hp-<cluster>-<group lower>-<index> and Docker's embedded
  DNS answers a reverse lookup of its address with "<container>.<network>". A container
  name over 63 characters is not a valid DNS label: `getent hosts <ip>` fails after
  10.3 s instead of answering in 0.3 s (63 vs 64 characters, measured). slurmctld looks
  up the address of a node asking for its configuration (configless) and does not
  answer within MessageTimeout (10 s): slurmd logs "_fetch_child: failed to fetch
  remote configs: Socket timed out on send/recv operation", slurmctld logs
  "slurm_bufs_sendto(msg_type=RESPONSE_CONFIG) failed: Unexpected missing socket
  error", the node never joins and the create times out. The same for a login node
  (sackd). While it waits, slurmctld answers other nodes 10 s late. The index counts:
  a group whose 9 nodes work breaks at its 10th.
- A hostname over 64 characters (HOST_NAME_MAX) cannot be set: the container does not
  start ("runc create failed: ... sethostname: invalid argument").
- Slurm's accounting (slurmdbd on MySQL) names per-cluster tables
  "<cluster>_assoc_usage_month_table"; MySQL identifiers are at most 64 characters.
- Slurm lower-cases ClusterName (a cluster named "Lab" is "lab" to Slurm), so two
  clusters differing only in case would be one cluster in a shared accounting database.
- `PartitionName=DEFAULT` (any case) in slurm.conf sets defaults for later partitions
  instead of making one: a group's partition named "default" silently does not exist
  (created clusters showed no such partition in sinfo).

Not limits (tested, they work): upper case in cluster and group names (node names are
lower-cased), names of digits only ("123", node "123-1"), repeated dashes ("c--d"),
groups named "default" or "all", partitions "ALL", "DEV" or "CPU" next to "cpu" (Slurm
partition names are case-sensitive), a 55-character controller group name. Docker
itself takes container, network and volume names of 200+ characters.
"""

from __future__ import annotations

from ..naming import container_name, network_name, node_name, shared_volume, state_volume

DNS_LABEL_MAX = 63
"""One DNS label (RFC 1035). Docker's DNS answers reverse lookups with the container's
name as a label: hp's container names (and so also network names and hostnames, which
are shorter) must fit, or Slurm's configless fetch times out (see above)."""

HOST_NAME_MAX = 64
"""Linux's limit on a hostname (sethostname(2)); a node's hostname is its Slurm name."""

SLURM_MAX_NODE_COUNT = 65536
"""slurmctld refuses a MaxNodeCount above this, so no node index is larger. Names are
checked for this index, whatever the cluster's MaxNodeCount: a later scale-up can
then never reach a node name that cannot work."""

MYSQL_IDENTIFIER_MAX = 64
SLURMDBD_LONGEST_CLUSTER_TABLE = "assoc_usage_month_table"
"""The longest per-cluster table name of slurmdbd's MySQL plugin (with
wckey_usage_month_table); tables are named <cluster>_<table>."""

CLUSTER_NAME_MAX = MYSQL_IDENTIFIER_MAX - 1 - len(SLURMDBD_LONGEST_CLUSTER_TABLE)
"""40: a cluster can have Slurm accounting turned on later without being renamed."""

RESERVED_PARTITIONS_ANY_CASE = ("default",)
"""slurm.conf keywords a PartitionName cannot be (Slurm compares them case-blind)."""

HP_DEFAULT_PARTITION = "dev"
"""hp's own partition holding every compute node (slurm.conf.tmpl)."""


def derived_names(cluster: str, group: str, index: int) -> dict[str, tuple[str, int, str]]:
    """What hp names after (cluster, group, node index): kind -> (name, limit, why)."""
    node = node_name(group, index)
    return {
        "container": (
            container_name(cluster, node),
            DNS_LABEL_MAX,
            "Docker's DNS cannot answer for a longer container name, and Slurm's configless fetch "
            "times out waiting for it",
        ),
        "hostname": (node, HOST_NAME_MAX, "the kernel refuses a longer hostname"),
        "network": (network_name(cluster), DNS_LABEL_MAX, "Docker's DNS answers with it as one DNS label"),
        "state volume": (state_volume(cluster), 255, "a file name"),
        "home volume": (shared_volume(cluster), 255, "a file name"),
    }


def max_group_name_len(cluster: str, max_index: int = SLURM_MAX_NODE_COUNT) -> int:
    """The longest group name that works in this cluster, for indexes up to max_index."""
    return DNS_LABEL_MAX - len(container_name(cluster, node_name("", max_index)))


def cluster_name_problems(
    name: str, *, accounting: bool = True, max_index: int = SLURM_MAX_NODE_COUNT, what: str = "ClusterName"
) -> list[str]:
    """Problems of a cluster name that already matches HyperPod's pattern."""
    out = []
    if accounting and len(name) > CLUSTER_NAME_MAX:
        out.append(
            f"{what} {name!r} has {len(name)} characters, at most {CLUSTER_NAME_MAX}: Slurm's accounting "
            f"tables are named '<cluster>_{SLURMDBD_LONGEST_CLUSTER_TABLE}' and MySQL names are at most "
            f"{MYSQL_IDENTIFIER_MAX} characters"
        )
    # the shortest node name a cluster can have: a one-character group, index up to the max
    if max_group_name_len(name, max_index) < 1:
        out.append(
            f"{what} {name!r} is too long: hp's container names "
            f"'hp-{name}-<group>-<index>' would exceed {DNS_LABEL_MAX} characters, the longest name "
            "Docker's DNS can answer for"
        )
    return out


def group_name_problems(
    cluster: str, group: str, *, max_index: int = SLURM_MAX_NODE_COUNT, what: str = "InstanceGroupName"
) -> list[str]:
    """Problems of a group name (matching HyperPod's pattern) in a cluster: every name
    derived from it, for every index up to max_index, must be within its limit."""
    if max_group_name_len(cluster, max_index) < 1:
        return []  # the cluster name is reported, not every group
    out = []
    for kind, (derived, limit, why) in derived_names(cluster, group, max_index).items():
        if len(derived) > limit:
            most = max_group_name_len(cluster, max_index)
            out.append(
                f"{what} {group!r} is too long for cluster {cluster!r}: its nodes' {kind} names reach "
                f"{len(derived)} characters ({derived!r} for node {max_index}), at most {limit}: {why}. "
                f"In this cluster a group name has at most {most} characters"
            )
            break
    return out


def partition_name_problems(name: str, *, what: str = "PartitionNames[0]", keywords: bool = True) -> list[str]:
    """A partition name's problems (`keywords`: also Slurm's keywords, a newer rule)."""
    if keywords and name.lower() in RESERVED_PARTITIONS_ANY_CASE:
        return [
            f"{what}: {name!r} is a slurm.conf keyword (PartitionName=DEFAULT sets defaults, it makes no "
            "partition); pick another name"
        ]
    if name == HP_DEFAULT_PARTITION:
        return [f"{what}: {name!r} is the default partition every compute node is in; pick another name"]
    return []


def slurm_cluster_name(name: str) -> str:
    """The name Slurm uses for the cluster (it lower-cases ClusterName)."""
    return name.lower()


def cluster_name_conflict(name: str, existing: list[str]) -> str | None:
    """A problem when another cluster has the same name to Slurm (case aside)."""
    for other in existing:
        if other != name and slurm_cluster_name(other) == slurm_cluster_name(name):
            return (
                f"cluster {other!r} exists and Slurm lower-cases cluster names: {name!r} and {other!r} would "
                f"both be {slurm_cluster_name(name)!r} in Slurm's accounting"
            )
    return None
