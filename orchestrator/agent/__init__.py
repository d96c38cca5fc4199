"""The per-cluster agent: process control (process.py) apart from the daemon loop
(daemon.py); the group reconciler (reconciler.py); the on-start check queue (onstart.py)."""
