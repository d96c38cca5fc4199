"""The cluster services beside the Slurm nodes (Accounting and Rest in the spec):

- accounting.py: the accounting (slurmdbd and its MariaDB) and slurmrestd containers, their start at
  create (with slurmctld's, at once: each waits for the one it needs), readiness, health (HyperPod's
  SlurmHealthMetadata: Healthy, or Unhealthy with DaemonDown / DbUnreachable) and
  restart, and the cluster's JWT key and database password (0600 in hp's state);
- jwt.py: HS256 tokens, verified with the cluster's key (pure);
- front.py: the agent's verifying front before slurmrestd on a loopback port (a bad,
  expired or forged token gets 401 and nothing else);
- metrics.py: the Prometheus collector the agent serves (Slurm's view, through the
  Slurm boundary, and hp's own);
- endpoints.py: the agent's loopback ports (REST front, metrics), recorded in the store;
- servicewatch.py: the agent's watch over the services (a dead database or slurmdbd is
  started again, in order).
"""
