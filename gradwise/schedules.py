"""Learning-rate schedules: multipliers of the base learning rate, as functions of the step count.

A schedule maps ``t`` (steps already taken: 0 for the first step) to a factor ``f(t) >= 0``; the
learning rate of step ``t`` is ``lr * f(t)``. Every schedule has a length; after it, the factor holds
its final value. ``a + b`` runs ``a`` for its length, then ``b`` (with ``b`` counting from 0), so::

    schedule = warmup(100) + cosine(900)          # 100 steps up to lr, then cosine to 0 over 900
    scheduler = ScheduleLR(optimizer, schedule)   # a torch LR scheduler: scheduler.step() per step

Closed forms (``n`` a segment's length, ``t`` in ``[0, n]``):

- ``warmup(n, start)``: ``start + (1 - start) t / n``  (linear warmup; Goyal et al., 2017)
- ``constant(n)``: ``1``
- ``cosine(n, final)``: ``final + (1 - final) (1 + cos(pi t / n)) / 2``  (Loshchilov & Hutter, 2017)
- ``linear_decay(n, final)``: ``1 - (1 - final) t / n``  (linear decay to zero: Defazio et al., 2023)
- ``warmup_stable_decay(total, warmup_steps, decay_steps)``: warmup, constant, linear decay to 0
  (Hu et al., 2024, MiniCPM)
- ``explore_exploit(total, warmup_steps, warmdown_fraction, final)``: warmup, constant, then a linear
  warm-down to ``final`` over the last ``warmdown_fraction`` of the budget (Ranger21; Iyer et al.,
  2020, "Wide-minima density hypothesis and the explore-exploit learning rate schedule")
- ``algoperf_baseline(step_hint, warmup_fraction)``: torch's ``LinearLR(start_factor=1e-10)`` for
  ``int(warmup_fraction * step_hint)`` steps, then ``CosineAnnealingLR(T_max=step_hint - warmup)``,
  as in AlgoPerf's baseline submissions.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from gradwise.core.hyper import closed_unit_interval, int_in, number_in, positive_int, unit_interval

#: what the schedules' arguments are: a number of steps, and a multiple of the learning rate
STEPS = int_in(0, note="a number of steps")
FACTOR = number_in(0, note="a multiple of the learning rate")


class Schedule:
    """A learning-rate multiplier over ``length`` steps; ``schedule(t)`` is the factor at step ``t``."""

    length: int = 0

    def __call__(self, t: int) -> float:
        t = int(STEPS("t", t))
        return self._at(min(t, self.length))

    def _at(self, t: int) -> float:
        raise NotImplementedError

    def __add__(self, other: "Schedule") -> "Schedule":
        if not isinstance(other, Schedule):
            return NotImplemented
        return Sequence(self, other)


class Sequence(Schedule):
    """Schedules one after the other: ``parts[i]`` runs for its length, counting from 0."""

    def __init__(self, *parts: Schedule):
        flat: list[Schedule] = []
        for part in parts:
            if not isinstance(part, Schedule):
                raise TypeError(f"invalid schedule part {part!r}: expected a gradwise.schedules.Schedule")
            flat.extend(part.parts if isinstance(part, Sequence) else [part])
        if not flat:
            raise ValueError("Sequence() needs at least one schedule")
        self.parts = tuple(flat)
        self.length = sum(p.length for p in self.parts)

    def _at(self, t: int) -> float:
        for part in self.parts[:-1]:
            if t < part.length:
                return part(t)
            t -= part.length
        return self.parts[-1](t)

    def __repr__(self) -> str:
        return " + ".join(repr(p) for p in self.parts)


class warmup(Schedule):  # noqa: N801 - schedules are named like functions
    """Linear warmup from ``start`` to 1 over ``steps`` steps: ``f(t) = start + (1 - start) t / steps``."""

    def __init__(self, steps: int, start: float = 0.0):
        self.length = int(STEPS("steps", steps))
        self.start = float(FACTOR("start", start))

    def _at(self, t: int) -> float:
        return 1.0 if t >= self.length else self.start + (1.0 - self.start) * t / self.length

    def __repr__(self) -> str:
        return f"warmup({self.length}, start={self.start})"


class constant(Schedule):  # noqa: N801
    """``f(t) = value`` for ``steps`` steps."""

    def __init__(self, steps: int, value: float = 1.0):
        self.length = int(STEPS("steps", steps))
        self.value = float(FACTOR("value", value))

    def _at(self, t: int) -> float:
        return self.value

    def __repr__(self) -> str:
        return f"constant({self.length}, value={self.value})"


class cosine(Schedule):  # noqa: N801
    """Cosine decay from 1 to ``final`` over ``steps``: ``final + (1 - final)(1 + cos(pi t / steps)) / 2``."""

    def __init__(self, steps: int, final: float = 0.0):
        self.length = int(STEPS("steps", steps))
        self.final = float(FACTOR("final", final))

    def _at(self, t: int) -> float:
        if t >= self.length:
            return self.final
        return self.final + (1.0 - self.final) * (1.0 + math.cos(math.pi * t / self.length)) / 2.0

    def __repr__(self) -> str:
        return f"cosine({self.length}, final={self.final})"


class linear_decay(Schedule):  # noqa: N801
    """Linear decay from 1 to ``final`` (default 0) over ``steps``: ``1 - (1 - final) t / steps``."""

    def __init__(self, steps: int, final: float = 0.0):
        self.length = int(STEPS("steps", steps))
        self.final = float(FACTOR("final", final))

    def _at(self, t: int) -> float:
        return self.final if t >= self.length else 1.0 - (1.0 - self.final) * t / self.length

    def __repr__(self) -> str:
        return f"linear_decay({self.length}, final={self.final})"


def _check_budget(total: int, **parts: int) -> None:
    if sum(parts.values()) > total:
        named = " + ".join(f"{k}={v}" for k, v in parts.items())
        raise ValueError(f"invalid schedule: {named} = {sum(parts.values())} steps is longer than the budget"
                         f" total_steps={total}")


def warmup_stable_decay(total_steps: int, warmup_steps: int, decay_steps: int, final: float = 0.0) -> Schedule:
    """Warmup-stable-decay: ``warmup(warmup_steps) + constant(...) + linear_decay(decay_steps, final)``."""
    total, w, d = int(STEPS("total_steps", total_steps)), int(STEPS("warmup_steps", warmup_steps)), \
        int(STEPS("decay_steps", decay_steps))
    _check_budget(total, warmup_steps=w, decay_steps=d)
    return warmup(w) + constant(total - w - d) + linear_decay(d, final)


def explore_exploit(total_steps: int, warmup_steps: int, warmdown_fraction: float = 0.72,
                    final: float = 0.0) -> Schedule:
    """Warmup, a constant explore phase, then linear warm-down over ``int(warmdown_fraction * total)``."""
    total, w = int(STEPS("total_steps", total_steps)), int(STEPS("warmup_steps", warmup_steps))
    d = int(float(closed_unit_interval("warmdown_fraction", warmdown_fraction)) * total)
    _check_budget(total, warmup_steps=w, warmdown_steps=d)
    return warmup(w) + constant(total - w - d) + linear_decay(d, final)


def algoperf_baseline(step_hint: int, warmup_fraction: float = 0.05) -> Schedule:
    """AlgoPerf's baseline: ``LinearLR(start_factor=1e-10)`` warmup then cosine over the rest of ``step_hint``."""
    hint = int(positive_int("step_hint", step_hint))
    w = int(float(closed_unit_interval("warmup_fraction", warmup_fraction)) * hint)
    return warmup(w, start=1e-10) + cosine(max(hint - w, 1))


def auto_warmup_steps(beta2: float, total_steps: int, fallback_fraction: float = 0.22) -> int:
    """Ma & Yarats (2021, "On the adequacy of untuned warmup for adaptive optimization"): warm Adam
    up for ``ceil(2 / (1 - beta2))`` steps; as Ranger21, ``int(fallback_fraction * total_steps)`` when
    that is more than 45% of the budget."""
    beta2 = float(unit_interval("beta2", beta2))
    total = int(positive_int("total_steps", total_steps))
    steps = math.ceil(2.0 / (1.0 - beta2))
    if steps / total <= 0.45:
        return steps
    return int(float(closed_unit_interval("fallback_fraction", fallback_fraction)) * total)


def chebyshev_steps(count: int, low: float = 0.1, high: float = 1.0) -> list[float]:
    """Agarwal, Goel & Zhang (2021, "Acceleration via Fractal Learning Rate Schedules",
    arXiv:2103.01338): the ``count`` Chebyshev step sizes 1 / (C - R cos((i + 1/2) pi / count)),
    C = (high + low) / 2, R = (high - low) / 2 (from 1 / high up to nearly 1 / low), in the fractal
    order sigma: sigma_1 = (0), sigma_2m = interleave(sigma_m, 2m - 1 - sigma_m). ``count`` must be a
    power of two, as the order is defined for those (Ranger21's code fails on other counts)."""
    count = int(STEPS("count", count))
    if count < 1 or count & (count - 1):
        raise ValueError(f"invalid count={count!r}: the fractal Chebyshev order needs a power of two >= 1")
    centre, radius = (high + low) / 2, (high - low) / 2
    steps = [1 / (centre - radius * math.cos((i + 0.5) / count * math.pi)) for i in range(count)]
    order = [0]
    while len(order) < count:
        order = [j for i in order for j in (i, 2 * len(order) - 1 - i)]
    return [steps[i] for i in order]


class ranger21_schedule(Schedule):  # noqa: N801
    """Ranger21's warmup and explore-exploit warm-down, exactly as its code counts steps (s = t + 1):

    f = min(1, s / warmup_steps) for s <= warmup_steps, else 1;  from s >= S = total - warmdown_steps:
    f = max(1 - (1 - min_factor) min(max(s + 1 - S, 1) / (warmdown_steps + 1), 1), min_factor)
    (the warm-down replaces the warmup factor, as in the reference).

    ``cheb`` (a list of factors, one per epoch of ``epoch_steps`` steps, e.g. ``chebyshev_steps``)
    multiplies the constant part after the warmup as Ranger21's ``use_cheb`` does: from s >
    warmup_steps until the warm-down, f = cheb[clamp(s // epoch_steps - 1, 0, len(cheb) - 1)].
    """

    def __init__(self, total_steps: int, warmup_steps: int, warmdown_steps: int, min_factor: float,
                 cheb: list[float] | None = None, epoch_steps: int = 1):
        self.length = int(STEPS("total_steps", total_steps))
        self.warmup_steps = int(STEPS("warmup_steps", warmup_steps))
        self.warmdown_steps = int(STEPS("warmdown_steps", warmdown_steps))
        self.min_factor = float(FACTOR("min_factor", min_factor))
        _check_budget(self.length, warmup_steps=self.warmup_steps)  # the warm-down may overlap the warmup
        _check_budget(self.length, warmdown_steps=self.warmdown_steps)
        self.cheb = [float(FACTOR("cheb", c)) for c in cheb] if cheb is not None else None
        self.epoch_steps = int(STEPS("epoch_steps", epoch_steps))
        if self.cheb is not None and (not self.cheb or self.epoch_steps < 1):
            raise ValueError(f"invalid cheb={cheb!r}, epoch_steps={epoch_steps!r}: expected factors and epochs >= 1")

    def _at(self, t: int) -> float:
        s, start = t + 1, self.length - self.warmdown_steps
        if self.warmdown_steps and s >= start:
            pct = min(max(s + 1 - start, 1) / (self.warmdown_steps + 1), 1.0)
            return max(1.0 - (1.0 - self.min_factor) * pct, self.min_factor)
        if self.warmup_steps and s <= self.warmup_steps:
            return min(1.0, s / self.warmup_steps)
        if self.cheb is not None:
            return self.cheb[min(max(s // self.epoch_steps - 1, 0), len(self.cheb) - 1)]
        return 1.0

    def __repr__(self) -> str:
        cheb = f", cheb={self.cheb}, epoch_steps={self.epoch_steps}" if self.cheb is not None else ""
        return (f"ranger21_schedule({self.length}, warmup_steps={self.warmup_steps},"
                f" warmdown_steps={self.warmdown_steps}, min_factor={self.min_factor}{cheb})")


class ScheduleLR(torch.optim.lr_scheduler.LRScheduler):
    """A torch LR scheduler that sets every group's lr to ``initial_lr * schedule(t)`` at step ``t``.

    Its ``state_dict`` holds the step count (the schedule is rebuilt from code, as torch's schedulers).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule, last_epoch: int = -1):
        if not isinstance(schedule, Schedule):
            raise TypeError(f"invalid schedule={schedule!r}: expected a gradwise.schedules.Schedule")
        self.schedule = schedule
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        factor = self.schedule(self.last_epoch)
        return [base * factor for base in self.base_lrs]

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "schedule")}


__all__ = [
    "Schedule", "ScheduleLR", "Sequence", "algoperf_baseline", "auto_warmup_steps", "chebyshev_steps", "constant",
    "cosine",
    "explore_exploit", "linear_decay", "ranger21_schedule", "warmup", "warmup_stable_decay",
]
