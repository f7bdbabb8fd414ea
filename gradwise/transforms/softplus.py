"""Softplus as a compiled CPU step computes it fast: the smoothed denominators of PNM (``scale_by_pnm_adam``) and
MADGRAD (``scale_by_madgrad``), after Tong et al. (2019, "Calibrating the adaptive learning rate"):

    softplus(x) = log(1 + exp(beta x)) / beta        (x itself where beta x > 20, as ``F.softplus``)

Eagerly this is ``F.softplus``. Traced by torch.compile for float32 (or narrower) tensors it takes a form of the
same function that needs no logarithm: with s = beta x and t = exp(-|s|) in (0, 1],

    log(1 + exp(s)) = max(s, 0) + log1p(t),   log1p(t) = 2 atanh(u) = 2 (u + u^3/3 + u^5/5 + ...),   u = t / (2 + t)

where u <= 1/3, so the series cut after u^13 leaves a relative remainder below 9^-7 / 15 (1.3e-8), under
float32's rounding; exp is taken as exp2, and |s| at most 40 (t >= exp(-40) keeps u^2 a normal float32: denormal
arithmetic is slow on a CPU, and real denominators reach beta x of 50 and more). For x >= 0 (both denominators'
domain) the result is within 4 float32 roundings of the exact softplus, as torch's own float32 kernel is; for x < 0,
where it is about exp(beta x), within 2 |beta x| + 4 roundings (beta x and exp2's argument carry one each) down to
beta x = -40, and exp(-40) / beta below, within 4.3e-18 / beta of the exact value. Traced float64 takes
max(x, 0) + log1p(exp(-|s|)) / beta (the series would need 16 terms for double's precision).

Why: inductor's CPU code calls SLEEF for exp and log, log the costlier; Ranger21's compiled elementwise loop, bound
by its vector arithmetic and not by its memory traffic on a CPU, spent most of its time in the two (``bench/step.py``'s
Ranger21 row measures the step).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

#: F.softplus's default threshold (beta x above it gives x); an int, so that a trace holds it as a constant (a
#: float global would be a graph input, loaded at every vector)
THRESHOLD = 20
#: |beta x| is taken at most this (an int: a constant in the trace; module docstring)
FLOOR = 40
#: the terms of atanh's series in u^2 after the factor 2u: 1, 1/3, ..., 1/13 (1 / (2k + 1), k < TERMS)
TERMS = 7


def softplus(x: Tensor, beta: float) -> Tensor:
    """``F.softplus(x, beta)``; traced, the form of the module docstring (float32 and narrower) or
    max(x, 0) + log1p(exp(-|beta x|)) / beta (float64)."""
    if not torch.compiler.is_compiling():
        return F.softplus(x, beta=beta)
    scaled = x * beta
    if x.dtype == torch.float64:
        return torch.where(scaled > THRESHOLD, x, x.clamp_min(0) + torch.log1p(torch.exp(-scaled.abs())) * (1 / beta))
    t = torch.exp2(scaled.abs().clamp_max(FLOOR) * -(1 / math.log(2)))
    u = t / (t + 2.0)
    w = u * u
    series = 1.0 / (2 * TERMS - 1)
    for k in reversed(range(TERMS - 1)):
        series = series * w + 1.0 / (2 * k + 1)
    return torch.where(scaled > THRESHOLD, x, x.clamp_min(0) + (u * series) * (2 / beta))
