"""Every entry the arena takes, as ``gradwise arena list`` shows it: the name, its self-tuning point in short,
whether a search space is shipped for it, and its state-format variants (``NAME[FORMAT]``); then the
low-communication entries (``DiLoCo[H=10]``, ...), which run on ``--workers-per-trial`` workers."""
from __future__ import annotations

from typing import Any

from gradwise.arena import low_comm
from gradwise.arena.shipped_spaces import has_shipped_space
from gradwise.arena.submissions import SELF_TUNING
from gradwise.arena.variants import FORMATS, variant_recipes
from gradwise.by_name import optimizer_names

#: the short names of the common keys
SHORT = {"beta1": "b1", "beta2": "b2", "one_minus_beta1": "1-b1", "weight_decay": "wd", "warmup_factor": "warmup",
         "momentum": "mom", "update_proj_gap": "gap", "precondition_frequency": "every", "sync_every": "H",
         "start_powerSGD_iter": "start"}


def _value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value).replace(" ", "")
    return f"{value:g}"


def short_point(point: dict[str, Any]) -> str:
    """``lr=0.002 b1=0.9 wd=0.05 warmup=0.05``; a constant schedule reads ``no-schedule``."""
    words = [f"{SHORT.get(k, k)}={_value(v)}" for k, v in point.items() if k != "schedule"]
    if point.get("schedule") == "constant":
        words.append("no-schedule")
    return " ".join(words)


#: the low-communication entries as ``arena list`` shows them, each bracket with an example value
LOW_COMM_EXAMPLES = ("DiLoCo[H=10]", "StreamingDiLoCo[H=10]", "DeMo", "PowerSGD[r=4]")


def entry_rows() -> list[dict[str, str]]:
    """One row per optimizer name (recipes first, then ``torch.<Name>``), then the low-communication entries
    (multi-worker trials, ``--workers-per-trial``)."""
    with_variants = set(variant_recipes())
    rows = [{"name": name,
             "point": short_point(SELF_TUNING[name]) if name in SELF_TUNING else "-",
             "space": "shipped" if has_shipped_space(name) else "-",
             "variants": " ".join(FORMATS) if name in with_variants else "-"}
            for name in optimizer_names()]
    return rows + [{"name": name, "point": short_point(low_comm.self_tuning_point(name)),
                    "space": "shipped" if has_shipped_space(name) else "-", "variants": "-"}
                   for name in LOW_COMM_EXAMPLES]
