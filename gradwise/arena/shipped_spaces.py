"""The external-tuning search spaces the arena ships, one per entry: ``gradwise/arena/spaces/<name>.json``
(package data). Each holds ``optimizer``, ``source`` (where its ranges come from: AlgoPerf's NAdamW baseline
space for the Adam family, else lr log-uniform a decade either side of the self-tuning point and the method's
key knobs) and ``space``, in AlgoPerf's dict form. ``gradwise arena run --ruleset external --optimizers NAME``
tunes over it; a state-format variant (``AdamW[int8]``) takes its recipe's space, a low-communication entry
(``DiLoCo[H=10]``, ``DeMo``; ``--workers-per-trial``) its method's (``DiLoCo.json``), checked against the entry.
"""
from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from gradwise.arena import low_comm
from gradwise.arena.submissions import check_search_space
from gradwise.arena.variants import split_variant


def _folder():
    return files("gradwise.arena") / "spaces"


def shipped_names() -> list[str]:
    """The entries (recipes and ``torch.<Name>``) with a shipped space."""
    return sorted(f.name.removesuffix(".json") for f in _folder().iterdir() if f.name.endswith(".json"))


def _file_and_entry(name: str) -> tuple[str, str]:
    """The file's stem for entry ``name`` and the entry its space is checked against (a bare method, ``DiLoCo``:
    its entry at an example bracket, ``DiLoCo[H=10]``)."""
    if name in low_comm.METHODS:
        key = low_comm.METHODS[name]
        return name, name if key is None else f"{name}[{key}=10]"
    parsed = low_comm.parse(name)
    return (parsed[0], name) if parsed is not None else (split_variant(name)[0], name)


def has_shipped_space(name: str) -> bool:
    return _file_and_entry(name)[0] in shipped_names()


def shipped_file(name: str) -> dict[str, Any]:
    """The whole file of ``name``'s space (``optimizer``, ``source``, ``space``), checked."""
    recipe, entry = _file_and_entry(name)
    if recipe not in shipped_names():
        raise ValueError(f"no shipped search space for optimizer {name!r}; shipped: {', '.join(shipped_names())}."
                         " Give one with --search-space FILE")
    raw = json.loads((_folder() / f"{recipe}.json").read_text())
    if raw.get("optimizer") != recipe:
        raise ValueError(f"invalid shipped search space {recipe}.json: it names optimizer {raw.get('optimizer')!r}")
    check_search_space(entry, raw["space"])
    return raw


def shipped_space(name: str) -> dict[str, dict]:
    """``name``'s shipped space in AlgoPerf's dict form (a variant's: its recipe's)."""
    return shipped_file(name)["space"]
