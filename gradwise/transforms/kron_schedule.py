"""When PSGD Kron fits its preconditioner, and the random draws of each step: functions of the step alone,
so that every run, every process and every resume takes the same decisions."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gradwise.core.hashing import seed
from gradwise.core.hyper import Check, closed_unit_interval, either, optional


@dataclass(frozen=True)
class precondition_update_prob_schedule:  # noqa: N801 - pytorch-optimizer's name
    """p(n) = clamp(max_prob exp(-decay (n - flat_start)), min_prob, max_prob) at step n (0 for the first),
    in float32 as pytorch-optimizer computes it: 1 for ``flat_start`` steps, then down to ``min_prob``."""

    max_prob: float = 1.0
    min_prob: float = 0.03
    decay: float = 0.001
    flat_start: int = 500

    def __call__(self, n: int) -> Tensor:
        prob = self.max_prob * torch.exp(-self.decay * (torch.tensor(n, dtype=torch.float32) - self.flat_start))
        return prob.clamp_(min=self.min_prob, max=self.max_prob)


@dataclass(frozen=True)
class FunctionOfStep(Check):
    """A callable (not a number)."""

    def accepts(self, value: Any) -> bool:
        return callable(value) and not isinstance(value, (bool, int, float, Tensor))

    @property
    def expected(self) -> str:
        return "a function of the step (0 for the first) giving a probability"


#: ``pre_conditioner_update_probability``: a probability, a function of the step, or None (the default schedule)
PROBABILITY = optional(either(closed_unit_interval, FunctionOfStep()), "= precondition_update_prob_schedule()")


def fitting_steps(probability: Any, steps: int) -> bytearray:
    """Whether each of steps 1 .. ``steps`` fits the preconditioner, by pytorch-optimizer's counter: a fit
    once 1 / p(step - 1) steps have been counted since the last one (``probability`` None: the default)."""
    probability = precondition_update_prob_schedule() if probability is None else probability
    out, counter = bytearray(steps), 0
    for step in range(1, steps + 1):
        p = probability(step - 1) if callable(probability) else probability
        counter += 1
        out[step - 1] = bool(p > 0 and counter >= 1 / p)
        counter = 0 if out[step - 1] else counter
    return out


class FittingSteps:
    """``fitting_steps`` of each probability setting, computed once up to the latest step asked for."""

    def __init__(self) -> None:
        self._known: dict[Any, bytearray] = {}

    def __call__(self, probability: Any, step: int) -> bool:
        known = self._known.get(probability, bytearray())
        if len(known) < step:
            known = self._known[probability] = fitting_steps(probability, max(step, 2 * len(known)))
        return bool(known[step - 1])


def noise_seed(step: int) -> int:
    """The generator seed of the step's random vectors V: 24 bits, exact in a float32 scalar."""
    return seed(step, 0, "psgd_kron.noise") & 0xFFFFFF


def balances(step: int, balance_prob: float) -> bool:
    """Whether a fitting step first balances the factors: a draw below ``balance_prob``, seeded by the step."""
    return random.Random(seed(step, 0, "psgd_kron.balance")).random() < balance_prob
