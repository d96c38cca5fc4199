"""Registered Docker hosts: clusters that span several machines (docs/multihost.md).

- registry.py: `hp hosts add|list|remove`, the Docker swarm that joins the hosts (init on
  the first, join tokens for the others, up to three managers; or an existing swarm used
  as it is);
- engines.py: the provider hp uses (`provider_for`: the local engine when no host is
  registered, else a MultiHostProvider over the hosts' engines) and the host watcher's
  records of lost hosts;
- hostwatch.py: the agent's host watcher: a host whose engine stops answering (or whose swarm
  node is Down) has its nodes marked and, with NodeRecovery Automatic, replaced on other
  hosts under the same Slurm names; a host that comes back is reconciled (stale copies of
  replaced nodes removed before anything starts).
"""
