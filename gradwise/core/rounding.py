"""How the change u is written into a parameter: ``p <- p + u``, rounded to nearest (as ``add_``), or,
for bfloat16 parameters under ``param_rounding="stochastic"``, rounded stochastically.

A bfloat16 parameter keeps 8 significant bits: an update smaller than half a unit in the last place
is lost every step under round-to-nearest, so small learning rates stop training. Rounding up with
probability equal to the dropped fraction makes the written value unbiased, E[p'] = p + u (Gupta et
al., "Deep Learning with Limited Numerical Precision", ICML 2015; Zamirai et al., "Revisiting BFloat16
Training", 2020). The random bits hash (element index, seed) (``hashing.hash32``); the seed is
a function of the step and the parameter's position, and the index is the element's place in the
parameter's memory, so eager pieces, compiled flat views and a resumed run all draw the same bits.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.core.hashing import hash32
from gradwise.core.hyper import choice

ROUNDINGS = ("nearest", "stochastic")


check_rounding = choice(ROUNDINGS, "stochastic rounding applies to bfloat16 parameters")


def rounds_stochastically(static, dtype: torch.dtype) -> bool:
    """Whether a parameter of ``dtype`` in a group with these static values is written stochastically."""
    return dtype == torch.bfloat16 and static.get("param_rounding") == "stochastic"


def memory_index(t: Tensor, start: Tensor) -> Tensor:
    """Each element's offset in ``t``'s memory from its first element, plus ``start`` (int64)."""
    index = start
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[dim] = size
        index = index + torch.arange(size, device=t.device, dtype=torch.int64).view(shape) * stride
    return index.expand(t.shape)


def add_stochastically(p: Tensor, u: Tensor, seed: Tensor, start: Tensor) -> None:
    """``p <- p + u`` for a bfloat16 ``p``: the float32 sum rounded up or down to bfloat16 with the
    probabilities that make it unbiased. NaN and inf are written as they are."""
    x = p.float() + u.float()
    bits = x.view(torch.int32).to(torch.int64)
    noise = hash32(memory_index(p, start), seed) & 0xFFFF
    rounded = ((bits + noise) & ~0xFFFF).to(torch.int32).view(torch.float32)
    p.copy_(torch.where(torch.isfinite(x) & torch.isfinite(rounded), rounded, x))
