"""python -m orchestrator.agent NAME: the cluster's agent (see daemon.py)."""

import sys

from .daemon import main

sys.exit(main())
