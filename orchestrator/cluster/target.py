"""Which node `hp exec` runs a command in, and as whom: rules over what a listing of the
cluster's containers says (each container's node, name, id, role and whether it runs), no
Docker and no state, so that the quick `hp exec` (cli/quick.py) and the full one
(exec.py) choose alike. Light on purpose: it imports nothing but naming."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..naming import DEFAULT_USER

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (5 ms of `hp exec`)
if TYPE_CHECKING:
    from typing import TypeVar

    from ..docker.views import Container

    C = TypeVar("C", bound=Container)  # a views.Container, or the quick way's cli/quick.py Seen


def find_node(nodes: Mapping[str, C], node: str) -> C | None:
    """The container of `node` among a cluster's node containers (Slurm node name ->
    container): by its Slurm name, its container's name, or a prefix of its id."""
    if not node:
        return None
    return nodes.get(node) or next((c for c in nodes.values() if c.name == node or c.id.startswith(node)), None)


def default_login(containers: Iterable[C]) -> C | None:
    """Where a command runs when no node is named: the first running login node by name
    (None: there is none, and the controller is used)."""
    return min((c for c in containers if c.role == "login" and c.running), key=lambda c: c.name, default=None)


def identity(root: bool) -> tuple[str, str, dict[str, str] | None]:
    """(user, working directory, environment) of a command run as the default user (or root)."""
    if root:
        return "root", "/root", None
    home = f"/home/{DEFAULT_USER}"
    return DEFAULT_USER, home, {"HOME": home, "USER": DEFAULT_USER}
