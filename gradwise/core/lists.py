"""Arithmetic over lists of tensors: one ``torch._foreach_*`` call per list eagerly, one op per tensor
under ``torch.compile``.

A link's ``update`` maps lists to lists. Eagerly, a Python loop pays the interpreter and the argument
parsing once per tensor and op, which on a small model is most of a step; a foreach kernel pays them
once per list (torch.optim's default path on GPUs, ``foreach=True``). Each function here computes, per
tensor, exactly the op its name says, so a link written with them gives the same bits as its loop
(on the CPU, and wherever torch has no fused kernel, a foreach op runs that very op on each tensor).
Traced by ``torch.compile`` they unroll into the per-tensor ops, so the compiled graphs are those of
the loop. ``y`` may be a Python number, a 0-d tensor (broadcast to every tensor of the list) or a list.
``scalar_state`` and ``snapshot`` gather a bucket's 0-d state and copy it for a step's roll back.
"""
from __future__ import annotations

import operator
from collections import defaultdict
from typing import Union

import torch
from torch import Tensor

from gradwise.core.params import local

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


def sub(xs: list[Tensor], ys: list[Tensor]) -> list[Tensor]:
    """``[x - y]`` for each pair (in the promoted dtype, as ``-``)."""
    if _foreach(xs):
        return torch._foreach_sub(xs, ys)
    return [x - y for x, y in zip(xs, ys)]


def sub_(xs: list[Tensor], ys: list[Tensor], alpha: Tensor | None = None) -> None:
    """``x.sub_(y)`` for each pair; with ``alpha`` (a 0-d tensor), ``x.sub_(y, alpha=alpha)`` (``_scaled``)."""
    if alpha is not None and (ys := _scaled(torch._foreach_sub_, torch.Tensor.sub_, xs, ys, alpha)) is None:
        return
    if _foreach(xs):
        torch._foreach_sub_(xs, ys)
        return
    for x, y in zip(xs, ys):
        x.sub_(y)


def add_(xs: list[Tensor], y: Operand, alpha: Tensor | None = None) -> None:
    """``x.add_(y)`` for each x; with ``alpha`` (a 0-d tensor; ``y`` a list), ``x.add_(y, alpha=alpha)``
    (``_scaled``)."""
    if alpha is not None and (y := _scaled(torch._foreach_add_, torch.Tensor.add_, xs, y, alpha)) is None:
        return
    if _foreach(xs):
        torch._foreach_add_(xs, y)
        return
    for x, b in zip(xs, _each(y, len(xs))):
        x.add_(b)


def _scaled(foreach, op, xs: list[Tensor], ys: list[Tensor], alpha: Tensor) -> list[Tensor] | None:
    """Eagerly on the CPU, ``op(x, y, alpha=alpha)`` for each pair with ``alpha`` as a number (one foreach call; torch's
    kernel multiplies and adds in one fused rounding where it vectorizes), and None; traced or on another device,
    ``ys`` times ``alpha``, for the caller's op without it (within a rounding of the fused one)."""
    number = _cpu_number(alpha)
    if number is None:
        return mul(ys, alpha)
    if _foreach(xs):
        foreach(xs, ys, alpha=number)
    else:
        for x, y in zip(xs, ys):
            op(x, y, alpha=number)
    return None


def addcmul_(xs: list[Tensor], ys: list[Tensor], zs: list[Tensor], value: Tensor | None = None) -> None:
    """``x.addcmul_(y, z, value=value)`` for each x (``value`` a 0-d tensor, or None: torch's default, 1):
    ``x + value y z``, torch.optim Adam's second-moment update."""
    _pointwise_(torch._foreach_addcmul_, torch.Tensor.addcmul_, operator.mul, xs, ys, zs, value)


def addcdiv_(xs: list[Tensor], ys: list[Tensor], zs: list[Tensor], value: Tensor) -> None:
    """``x.addcdiv_(y, z, value=value)`` for each x (``value`` a 0-d tensor): ``x + value y / z``, torch.optim
    Adam's parameter update."""
    _pointwise_(torch._foreach_addcdiv_, torch.Tensor.addcdiv_, operator.truediv, xs, ys, zs, value)


def addcdiv_each_(xs: list[Tensor], ys: list[Tensor], zs: list[Tensor], values: Tensor) -> None:
    """``x.addcdiv_(y, z, value=v)`` for each x with its own ``v`` (``values``: a 1-D tensor, one per x), read as
    numbers (torch.optim NAdam's step sizes, which it reads with ``item()``); traced, ``x + v y / z``."""
    if torch.compiler.is_compiling():
        for x, y, z, v in zip(xs, ys, zs, values.to(xs[0].dtype).unbind()):
            x.add_(y * v / z)
        return
    numbers = values.tolist()
    if _foreach(xs):
        torch._foreach_addcdiv_(xs, ys, zs, numbers)
        return
    for x, y, z, v in zip(xs, ys, zs, numbers):
        x.addcdiv_(y, z, value=v)


def _pointwise_(foreach, op, combine, xs: list[Tensor], ys: list[Tensor], zs: list[Tensor],
                value: Tensor | None) -> None:
    """``op(x, y, z, value=value)`` for each x, ``x + combine(value y, z)``. Eagerly with ``value`` on the CPU, torch's
    op with ``value`` as a number (reading it syncs nothing); else ``op(x, y * value, z)``, the same bits (torch
    computes ``value * y`` first; torch.optim's own path for a tensor beta2). ``value`` None: the op's default.
    Traced, ``x + combine(y * value, z)``: the value of ``op(x, y * value, z)``, without the multiplication by 1
    that the op's decomposition keeps, a vector op per element of a compiled loop."""
    if torch.compiler.is_compiling():
        for x, y, z in zip(xs, ys, zs):
            x.add_(combine(y if value is None else y * value, z))
        return
    if value is None:
        if _foreach(xs):
            foreach(xs, ys, zs)
            return
        for x, y, z in zip(xs, ys, zs):
            op(x, y, z)
        return
    number = _cpu_number(value)
    if number is not None:
        if len(xs) > 1:
            foreach(xs, ys, zs, number)
            return
        for x, y, z in zip(xs, ys, zs):
            op(x, y, z, value=number)
        return
    if _foreach(xs):
        foreach(xs, torch._foreach_mul(ys, value), zs)
        return
    for x, y, z in zip(xs, ys, zs):
        op(x, y * value, z)


def div(xs: list[Tensor], ys: Operand) -> list[Tensor]:
    """``[x / y]``."""
    if _foreach(xs):
        return torch._foreach_div(xs, ys)
    return [x / y for x, y in zip(xs, _each(ys, len(xs)))]


def div_(xs: list[Tensor], ys: Operand) -> None:
    """``x.div_(y)`` for each x (``y`` a list, a number or a 0-d tensor)."""
    if _foreach(xs):
        torch._foreach_div_(xs, ys)
        return
    for x, y in zip(xs, _each(ys, len(xs))):
        x.div_(y)


def sqrt(xs: list[Tensor]) -> list[Tensor]:
    """``[x.sqrt()]``."""
    if _foreach(xs):
        return torch._foreach_sqrt(xs)
    return [x.sqrt() for x in xs]


def sqrt_(xs: list[Tensor]) -> None:
    """``x.sqrt_()`` for each x."""
    if _foreach(xs):
        torch._foreach_sqrt_(xs)
        return
    for x in xs:
        x.sqrt_()


def sign_(xs: list[Tensor]) -> None:
    """``x.sign_()`` for each x."""
    if _foreach(xs):
        torch._foreach_sign_(xs)
        return
    for x in xs:
        x.sign_()


def lerp_(xs: list[Tensor], ys: list[Tensor], weight: Tensor | list[Tensor]) -> None:
    """``x.lerp_(y, weight)`` for each pair (``weight`` a 0-d tensor, or a list of them: one per pair)."""
    weights = _each(weight, len(xs))
    if _foreach(xs):
        torch._foreach_lerp_(xs, ys, weights)
        return
    for x, y, w in zip(xs, ys, weights):
        x.lerp_(y, w)


def lerp_small_(xs: list[Tensor], ys: list[Tensor], weight: Tensor | list[Tensor]) -> None:
    """``x.lerp_(y, weight)`` for each pair, for a ``weight`` (0-d tensor, or a list of them) in [0, 1/2] as far as
    speed goes: eagerly that op; traced, ``x + weight (y - x)``, torch's own formula for such weights, without the
    select on the weight its decomposition keeps per element (which costs a compiled CPU step a tenth of its
    time). Any weight gives the same value up to a rounding."""
    if not torch.compiler.is_compiling():
        lerp_(xs, ys, weight)
        return
    for x, y, w in zip(xs, ys, _each(weight, len(xs))):
        x.add_((y - x) * w)


def maximum_(xs: list[Tensor], ys: list[Tensor]) -> None:
    """``x <- max(x, y)`` for each pair."""
    if _foreach(xs):
        torch._foreach_maximum_(xs, ys)
        return
    for x, y in zip(xs, ys):
        x.copy_(torch.maximum(x, y))


def _cpu_number(value: Tensor) -> float | None:
    """A 0-d CPU tensor's value as a Python number, eagerly (reading it syncs nothing), for a foreach op's scalar
    argument; None when traced or on another device (the caller then multiplies by the tensor)."""
    if value.device.type == "cpu" and not torch.compiler.is_compiling():
        return value.item()
    return None


#: (dtype, device) -> a 0-d one, added to step counters (``count_up_``)
_ONES: dict[tuple[torch.dtype, torch.device], Tensor] = {}


def count_up_(counters: list[Tensor]) -> None:
    """``c += 1`` for each 0-d step counter, as one ``add_`` of a kept 0-d one per counter: the number 1 is
    wrapped in a new tensor at every call, and on 0-d CPU tensors the foreach kernel costs more than the loop
    (about twice this loop). The same values: counts are whole numbers."""
    for c in counters:
        key = (c.dtype, c.device)
        one = _ONES.get(key)
        if one is None:
            one = _ONES[key] = torch.ones((), dtype=c.dtype, device=c.device)
        c.add_(one)


#: the parameter dtypes the fused CPU kernels run on with plain state (state and updates in the same dtype)
FUSED_KERNEL_DTYPES = (torch.float32, torch.float64)


def fused_kernel_takes(params: list[Tensor], updates: list[Tensor], state) -> bool:
    """Whether torch's fused optimizer kernels (``torch._fused_adamw_``, ``torch._fused_sgd_``) take these lists
    (``state``: a link's state lists by key): contiguous CPU tensors of one floating dtype (the parameters' own,
    as plain state keeps it), not DTensors. (On CUDA, reading the step's numbers for a kernel would wait for the
    device; the list ops and the compiled path take them as tensors.)"""
    dtype = params[0].dtype
    return dtype in FUSED_KERNEL_DTYPES and all(
        type(x) in _PLAIN_TENSORS and x.is_cpu and x.dtype == dtype and x.is_contiguous()
        for tensors in (params, updates, *state.values()) for x in tensors)


_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)


def scalar_state(states: list[dict[str, Tensor]], sharded: bool) -> list[list[Tensor]]:
    """The 0-d state of ``states`` but their step counters (what ``advance`` and a link's ``prepare`` write), as one
    list of tensors per key. (A key's tensors are made alike, by one link's ``init``, on the parameters' device;
    ``sharded``: their local parts.)"""
    kept: dict[str, list[Tensor]] = defaultdict(list)
    for st in states:
        for k, v in st.items():
            if k != "step" and v.dim() == 0:
                kept[k].append(local(v) if sharded else v)
    return list(kept.values())


def snapshot(scalars: list[list[Tensor]]) -> list[tuple[list[Tensor], Tensor]]:
    """(the tensors, a stacked copy of them) for each list of ``scalar_state``: one stack per key, not a clone per
    tensor, which a step of many parameters would pay once per parameter and key; ``roll_back`` copies them back."""
    return [(tensors, torch.stack(tensors)) for tensors in scalars]
