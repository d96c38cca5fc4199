"""hp orchestrator: runs Slurm clusters on Docker containers and checks node health."""
