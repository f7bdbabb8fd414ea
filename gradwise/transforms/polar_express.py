"""Newton-Schulz coefficient schedules: one (a, b, c) per iteration instead of one for all, and the Polar
Express schedule (Amsel, Persson, Musco & Gower, 2025, "The Polar Express: Optimal Matrix Sign Methods
and Their Application to the Muon Algorithm", arXiv:2505.16932).

Iteration t applies p_t(x) = a_t x + b_t x^3 + c_t x^5 to every singular value. Polar Express picks each
p_t as the odd quintic closest to 1 in the sup norm on the interval [l_t, u_t] the singular values are
known to lie in after t - 1 iterations (starting from [1e-3, 1]), so the composition is the optimal
approximation of sign(x) at every iteration (the paper's Theorem 4.1); the intervals shrink to 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gradwise.core.hyper import Check, number_in, sequence_of

#: the paper's Algorithm 1 (degree 5, l = 1e-3, as released with the paper): the optimal quintics before
#: its safety factor; the last one (15/8, -10/8, 3/8: the degree-5 Newton-Schulz of Pade) repeats after
POLAR_EXPRESS_OPTIMAL = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
#: the paper's safety factor (its Section 4.4): p_t(x / 1.01) for every polynomial but the last, so a
#: singular value that round-off lifted a little above u_t still maps below u_{t+1}; the input is
#: normalized by 1.01 ||X||_F + eps (not max(||X||_F, eps)) for the same reason
POLAR_EXPRESS_SAFETY = 1.01
POLAR_EXPRESS_COEFFICIENTS = tuple(
    (a / POLAR_EXPRESS_SAFETY, b / POLAR_EXPRESS_SAFETY ** 3, c / POLAR_EXPRESS_SAFETY ** 5)
    for a, b, c in POLAR_EXPRESS_OPTIMAL[:-1]) + POLAR_EXPRESS_OPTIMAL[-1:]
#: the named schedules: their coefficients and the factor on ||X||_F of their normalization
NAMED_SCHEDULES = {"polar_express": (POLAR_EXPRESS_COEFFICIENTS, POLAR_EXPRESS_SAFETY)}

_TRIPLE = sequence_of((number_in(),) * 3, ("a", "b", "c"))


@dataclass(frozen=True)
class coefficient_schedule(Check):  # noqa: N801 - checks are named like the functions they replace
    """One (a, b, c) for every iteration, a non-empty sequence of them (iteration t takes entry t; the
    last repeats when there are fewer entries than iterations, the rest go unused when more), or the
    name of one (``NAMED_SCHEDULES``); every number finite."""

    def accepts(self, value: Any) -> bool:
        if isinstance(value, str):
            return value in NAMED_SCHEDULES
        return _TRIPLE.accepts(value) or (isinstance(value, (tuple, list)) and len(value) > 0
                                          and all(_TRIPLE.accepts(v) for v in value))

    @property
    def expected(self) -> str:
        names = ", ".join(repr(n) for n in NAMED_SCHEDULES)
        return f"{_TRIPLE.expected}, a non-empty sequence of such triples (one per iteration) or one of [{names}]"

    def __call__(self, name: str, value: Any) -> Any:
        nested = isinstance(value, (tuple, list)) and any(isinstance(v, (tuple, list)) for v in value)
        if isinstance(value, (tuple, list)) and len(value) == 3 and not nested:
            _TRIPLE(name, value)  # one triple: names the number that is wrong
        elif isinstance(value, (tuple, list)) and value and not _TRIPLE.accepts(value):
            for i, entry in enumerate(value):
                if isinstance(entry, (tuple, list)) and not _TRIPLE.accepts(entry):
                    _TRIPLE(f"{name}[{i}]", entry)  # names the entry and the number in it
        return super().__call__(name, value)


def as_schedule(ns_coefficients: Any) -> Any:
    """``ns_coefficients`` as a group keeps it: a list as a tuple (of tuples), so that it hashes; a name,
    a tuple or anything else (which the check then refuses, naming it) as it is."""
    if not isinstance(ns_coefficients, (tuple, list)) or _TRIPLE.accepts(ns_coefficients):
        return tuple(ns_coefficients) if isinstance(ns_coefficients, list) else ns_coefficients
    return tuple(tuple(t) if isinstance(t, list) else t for t in ns_coefficients)


def iteration_coefficients(ns_coefficients: Any, steps: int) -> tuple[tuple[float, float, float], ...]:
    """The (a, b, c) of each of ``steps`` iterations, as the paper's Algorithm 1 takes them from a schedule."""
    if isinstance(ns_coefficients, str):
        schedule = NAMED_SCHEDULES[ns_coefficients][0]
    elif _TRIPLE.accepts(ns_coefficients):
        schedule = (ns_coefficients,)
    else:
        schedule = ns_coefficients
    return tuple(tuple(map(float, schedule[min(i, len(schedule) - 1)])) for i in range(steps))


def norm_factor(ns_coefficients: Any) -> float | None:
    """The factor s of a named schedule's normalization X / (s ||X||_F + eps), or None for the classic
    X / max(||X||_F, eps) (torch.optim.Muon's)."""
    return NAMED_SCHEDULES[ns_coefficients][1] if isinstance(ns_coefficients, str) else None

