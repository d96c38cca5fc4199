"""Node recovery: the decision table (rules.py), the watcher that applies it (watcher.py),
and the actions, reboot and replace (actions.py)."""
