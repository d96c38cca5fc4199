"""The only package that runs Slurm commands (client.py) or knows Slurm's states and
reasons (model.py); slurm.conf and a node's registration string (conf.py)."""
