"""Operations on clusters, the face the CLI (and CI) use:

- create.py: `create` (CreateOptions), `capacity_problems`, `has_gpus`;
- delete.py: `delete`; teardown.py: `remove_resources`, `other_home` (also create's rollback);
- query.py: `list_clusters`, `nodes` (and `observe`); describe.py: `describe`;
- scaling.py: `scale`, `delete_nodes`; waiting.py: `wait_groups` (`hp scale --wait`);
- exec.py: `exec_target`, `run_exec` (`hp exec`); target.py: which node and as whom (also
  the quick `hp exec`'s, cli/quick.py).

They stand on the cluster core (orchestrator/core/) and the services, recovery, hosts
and health packages; nothing below them imports this package. Each is imported by what
uses it (nothing here: `hp exec` does not load what `hp create` needs).
"""
