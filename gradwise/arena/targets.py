"""Validation targets set on the reference machine by ``gradwise arena set-targets`` (``targets.json``)."""
from __future__ import annotations

import json
from pathlib import Path

TARGETS_FILE = Path(__file__).with_name("targets.json")


def load_targets(path: Path = TARGETS_FILE) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def committed_target(workload: str, path: Path = TARGETS_FILE) -> float | None:
    entry = load_targets(path).get(workload)
    return None if entry is None else float(entry["target"])
