"""The cluster spec: its model and rules (model.py), the instance-type catalogue
(catalogue.py), reading spec files safely (loader.py)."""
