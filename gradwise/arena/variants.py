"""State formats as arena entries: ``AdamW[int8]`` is the recipe ``AdamW`` built with ``state="int8"``, so the
quality of each format is measured on the arena's workloads as any other entry is. A variant takes its recipe's
self-tuning point and search space; only recipes that keep encoded state (``gradwise.recipes.takes_state()``)
have variants, and only in the formats of ``FORMATS`` (``fp32`` is the recipe itself). Names are parsed and
checked here alone; the low-communication entries' brackets (``DiLoCo[H=10]``) are ``low_comm``'s.
"""
from __future__ import annotations

import re

#: the bracket's values: the ``state=`` codec names other than fp32 (``gradwise.state.codec``)
FORMATS = ("bf16", "int8", "int4", "fp8")

_VARIANT = re.compile(r"([^\[\]]+)\[([^\[\]]*)\]")


def split_variant(name: str) -> tuple[str, str | None]:
    """``("AdamW", "int8")`` for ``"AdamW[int8]"``, ``(name, None)`` for a name without a bracket; checks nothing
    else (``check_entry`` does)."""
    match = _VARIANT.fullmatch(name)
    return (match[1], match[2]) if match else (name, None)


def variant_recipes() -> list[str]:
    """The recipes a variant may name: those that take ``state=``."""
    from gradwise.recipes import takes_state

    return takes_state()


def check_entry(name: str, argument: str = "optimizer") -> str:
    """The entry ``name`` as the arena spells it (recipe matched case-insensitively, format in lower case), or a
    ``ValueError`` naming ``argument``, the value and what is allowed."""
    from gradwise.by_name import canonical_name, optimizer_names

    if not isinstance(name, str):
        raise ValueError(f"invalid {argument}={name!r}: expected an optimizer name such as 'AdamW' or 'AdamW[int8]'")
    from gradwise.arena import low_comm

    if low_comm.parse(name, argument) is not None:  # DiLoCo[H=10], PowerSGD[r=4], DeMo: multi-worker entries
        return low_comm.canonical(name)
    recipe, state = split_variant(name)
    if state is None and ("[" in name or "]" in name):
        raise ValueError(f"invalid {argument}={name!r}: a variant is RECIPE[FORMAT], e.g. 'AdamW[int8]', with FORMAT"
                         f" one of {', '.join(FORMATS)}")
    recipe = canonical_name(recipe.strip(), optimizer_names(), argument=argument)
    if state is None:
        return recipe
    if state.strip().lower() not in FORMATS:
        raise ValueError(f"invalid {argument}={name!r}: unknown state format {state!r}; the bracket is the recipe's"
                         f" state= argument, one of {', '.join(FORMATS)} (fp32 is {recipe!r} itself)")
    if recipe not in variant_recipes():
        raise ValueError(f"invalid {argument}={name!r}: {recipe} takes no state= format, so it has no variants;"
                         f" recipes with variants: {', '.join(variant_recipes())}")
    return f"{recipe}[{state.strip().lower()}]"
