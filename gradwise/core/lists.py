"""Arithmetic over lists of tensors: one ``torch._foreach_*`` call per list eagerly, one op per tensor
under ``torch.compile``.

A link's ``update`` maps lists to lists. Eagerly, a Python loop pays the interpreter and the argument
parsing once per tensor and op, which on a small model is most of a step; a foreach kernel pays them
once per list (torch.optim's default path on GPUs, ``foreach=True``). Each function here computes, per
tensor, exactly the op its name says, so a link written with them gives the same bits as its loop
(on the CPU, and wherever torch has no fused kernel, a foreach op runs that very op on each tensor).
Traced by ``torch.compile`` they unroll into the per-tensor ops, so the compiled graphs are those of
the loop. ``y`` may be a Python number, a 0-d tensor (broadcast to every tensor of the list) or a list.
"""
from __future__ import annotations

from typing import Union

import torch
from torch import Tensor

Operand = Union[Tensor, float, list]


def _each(y: Operand, n: int) -> list:
    return y if isinstance(y, list) else [y] * n


def _foreach(xs: list[Tensor]) -> bool:
    """Whether to call the foreach kernel: for two tensors or more (for one, the plain op costs less), eagerly."""
    return len(xs) > 1 and not torch.compiler.is_compiling()


def mul(xs: list[Tensor], y: Operand) -> list[Tensor]:
    """``[x * y]``."""
    if _foreach(xs):
        return torch._foreach_mul(xs, y)
    return [x * b for x, b in zip(xs, _each(y, len(xs)))]


def mul_(xs: list[Tensor], y: Operand) -> None:
    """``x.mul_(y)`` for each x."""
    if _foreach(xs):
        torch._foreach_mul_(xs, y)
        return
    for x, b in zip(xs, _each(y, len(xs))):
        x.mul_(b)


def add(xs: list[Tensor], ys: list[Tensor]) -> list[Tensor]:
    """``[x + y]`` for each pair (in the promoted dtype, as ``+``)."""
    if _foreach(xs):
        return torch._foreach_add(xs, ys)
    return [x + y for x, y in zip(xs, ys)]


def add_(xs: list[Tensor], y: Operand) -> None:
    """``x.add_(y)`` for each x."""
    if _foreach(xs):
        torch._foreach_add_(xs, y)
        return
    for x, b in zip(xs, _each(y, len(xs))):
        x.add_(b)


def div_(xs: list[Tensor], ys: list[Tensor]) -> None:
    """``x.div_(y)`` for each pair."""
    if _foreach(xs):
        torch._foreach_div_(xs, ys)
        return
    for x, y in zip(xs, ys):
        x.div_(y)


def sqrt(xs: list[Tensor]) -> list[Tensor]:
    """``[x.sqrt()]``."""
    if _foreach(xs):
        return torch._foreach_sqrt(xs)
    return [x.sqrt() for x in xs]


def lerp_(xs: list[Tensor], ys: list[Tensor], weight: Tensor) -> None:
    """``x.lerp_(y, weight)`` for each pair (``weight`` a 0-d tensor)."""
    if _foreach(xs):
        torch._foreach_lerp_(xs, ys, [weight] * len(xs))
        return
    for x, y in zip(xs, ys):
        x.lerp_(y, weight)


def maximum_(xs: list[Tensor], ys: list[Tensor]) -> None:
    """``x <- max(x, y)`` for each pair."""
    if _foreach(xs):
        torch._foreach_maximum_(xs, ys)
        return
    for x, y in zip(xs, ys):
        x.copy_(torch.maximum(x, y))
