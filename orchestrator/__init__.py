"""hp orchestrator: runs Slurm clusters on Docker containers and checks node health."""

__version__ = "0.2.0"
