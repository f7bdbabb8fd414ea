"""The rounds of a step: phase r of every bucket runs in round r (``core/stepping.py``), so the plans of a
step's groups are lined up here. A chain with a guard (a ``"skip"`` reduction, ``skip_nonfinite``) may skip the
whole step once its statistics are totalled, so chains without one wait until every guard has decided
(``after_guards``); and each statistic must be totalled in one round by every chain that computes it
(``check_rounds``).
"""
from __future__ import annotations

from gradwise.core.phases import Phase


def after_guards(plans: dict[int, tuple[Phase, ...]]) -> dict[int, tuple[Phase, ...]]:
    """The plans, those without a guard (a ``"skip"`` reduction) made to wait out the rounds up to the
    last guard's, so that no parameter is written before every guard has had its say."""
    rounds = [r for phases in plans.values() for r, phase in enumerate(phases) if guards(phase)]
    if not rounds:
        return plans
    wait = (Phase([], None, True, False),) * (max(rounds) + 1)
    return {k: phases if any(guards(p) for p in phases) else wait + phases for k, phases in plans.items()}


def guards(phase: Phase) -> bool:
    """Whether ``phase`` ends with a guard: a reduction whose total may skip the step."""
    return phase.reducer is not None and "skip" in phase.reducer[1].reductions.values()


def check_rounds(plans) -> None:
    """Each statistic is computed in the same round (phase index) by every chain that computes it, so
    that its total is complete when any chain reads it (a route's chains may differ)."""
    rounds: dict[str, int] = {}
    for phases in plans:
        for r, phase in enumerate(phases):
            for name in phase.reducer[1].reductions if phase.reducer else ():
                if rounds.setdefault(name, r) != r:
                    raise ValueError(f"the statistic {name!r} is computed after {r} phases in one route's chain and"
                                     f" after {rounds[name]} in another's; put its link at the same place in both")
