"""Reading a spec file (YAML or JSON) into plain data."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ..errors import BadInput


def load_spec_file(path: str | Path) -> object:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise BadInput(f"cannot read spec file {p}: {e.strerror}", "invalid cluster spec") from None
    try:
        if p.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)  # YAML is a superset of JSON
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise BadInput(f"{p} is not valid YAML/JSON: {e}", "invalid cluster spec") from None
