"""The per-cluster agent: process control (process.py) apart from the daemon loop
(daemon.py); the group reconciler (reconciler.py); the on-start check queue (onstart.py).
The daemon also runs the cluster services' watch and loopback endpoints (metrics, the
REST front), from orchestrator/services."""
