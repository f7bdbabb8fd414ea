"""Subset-Norm adaptive step size (Nguyen et al. 2024, "Efficient Adaptive Optimization via Subset-Norm
and Subspace-Momentum", arXiv:2411.07120; LITERATURE.md ¶80): AdaGrad with one accumulator per subset."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, positive
from gradwise.core.transform import Context, Transform, chain, state_dtype


def subset_shape(param: Tensor) -> tuple[int, ...]:
    """The accumulator's shape: for a tensor of 2+ dimensions viewed as m x n (n = the product of the
    trailing dimensions), one subset per index of the shorter side ((m, 1): rows, when m <= n; else
    (1, n): columns), so it holds min(m, n) numbers; a vector or scalar keeps one per entry."""
    if param.dim() < 2:
        return tuple(param.shape)
    m = param.shape[0]
    n = param.numel() // m if m else math.prod(param.shape[1:])
    return (m, 1) if m <= n else (1, n)


def subset_sums(u: Tensor) -> Tensor:
    """sum over each subset of u^2, in ``subset_shape(u)``."""
    if u.dim() < 2:
        return u * u
    flat = u.reshape(u.shape[0], math.prod(u.shape[1:]))
    return (flat * flat).sum(dim=1 if subset_shape(u)[1] == 1 else 0, keepdim=True)


def divided(d: Tensor, denominators: Tensor) -> Tensor:
    """d divided entrywise by its subset's denominator (``denominators`` in ``subset_shape(d)``)."""
    if d.dim() < 2:
        return d / denominators
    return (d.reshape(d.shape[0], math.prod(d.shape[1:])) / denominators).reshape(d.shape)


class scale_by_subset_norm(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """AdaGrad-Subset-Norm around ``inner`` (the direction: momentum, Subspace-Momentum, or none):
    with S(i) the subset of entry i (``subset_shape``),

        v_S <- v_S + sum_{j in S} u_j^2;   d <- inner(u);   u_i <- d_i / (sqrt(v_S(i)) + eps).

    v is AdaGrad's running sum of the incoming updates' subset norms (the paper's b_t^2); one subset
    per tensor would be AdaGrad-Norm, one per entry AdaGrad. The accumulator is not shaped like the
    parameter, so the link runs on whole tensors (not elementwise) and its state is not encoded.
    """

    name = "subset_norm"
    hyper = {"eps": Hyper(1e-8, positive)}
    nonnegative = ("sum_sq",)
    elementwise = False

    def __init__(self, inner: Transform | None = None):
        if inner is not None and not isinstance(inner, Transform):
            raise TypeError(f"scale_by_subset_norm(): inner={inner!r} must be a Transform, e.g. trace_ema()")
        self.inner = chain() if inner is None else chain(inner)
        if self.inner.reductions or self.inner.prepares or self.inner.moves_point:
            raise ValueError(f"scale_by_subset_norm(): inner={self.inner!r} reads statistics of the whole step or"
                             " moves the parameters; put those links before scale_by_subset_norm(...)")
        clash = sorted(set(self.inner.hyper) & set(self.hyper))
        if clash:
            raise ValueError(f"scale_by_subset_norm(): inner declares {clash}, which subset norm reads itself")
        self.hyper = {**self.inner.hyper, **self.hyper}
        self.state = ("sum_sq", *self.inner.state)
        self.nonnegative = ("sum_sq", *self.inner.nonnegative)
        self.batched, self.reads_params = self.inner.batched, True

    def wrapped(self, group=None) -> list[tuple[str, Transform]]:
        return [("", self.inner)]

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        own = torch.zeros(subset_shape(param), dtype=state_dtype(param), device=param.device)
        return {"sum_sq": own, **self.inner.init(param, group)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return self.inner.scalars(hyper, step)

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        for u, v in zip(updates, state["sum_sq"]):
            v.add_(subset_sums(u))
        directions = self.inner.update(updates, {k: state[k] for k in self.inner.state}, ctx)
        return [divided(d, v.sqrt() + ctx["eps"]) for d, v in zip(directions, state["sum_sq"])]

    def __repr__(self) -> str:
        return f"scale_by_subset_norm({self.inner!r})"
