"""Factored second moments (Shazeer & Stern, 2018, arXiv:1804.04235, "Adafactor") and the block-RMS
transforms Adafactor's step is made of.

A tensor of two or more dimensions, seen as a stack of (rows, cols) matrices over its last two
dimensions, keeps a running mean of its squares per row, R (..., rows, 1), and per column,
C (..., 1, cols): rows + cols numbers per matrix instead of rows * cols. The second moment is
estimated as their rank-1 product, V = R C / mean(R). A tensor of fewer dimensions keeps the full
running mean. The row and column factors are not shaped like the parameter, so these transforms are
not elementwise: the optimizer runs them on whole tensors (eagerly, or compiled one parameter at a
time), where ``update`` may write such state.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, non_negative, non_positive, number_in, optional, sequence_of
from gradwise.core.transform import Context, Transform, state_dtype


def factored_buffers(param: Tensor, row: str, col: str, full: str | None = None) -> dict[str, Tensor]:
    """Zeroed buffers for ``param``: ``row`` (..., rows, 1) and ``col`` (..., 1, cols) for two or more
    dimensions, else empty ones and, if ``full`` is named, a buffer shaped like ``param`` (empty for
    two or more dimensions)."""
    dtype, device = state_dtype(param), param.device
    factored = param.dim() >= 2
    shape = list(param.shape)
    out = {row: torch.zeros(shape[:-1] + [1] if factored else [0], dtype=dtype, device=device),
           col: torch.zeros(shape[:-2] + [1, shape[-1]] if factored else [0], dtype=dtype, device=device)}
    if full is not None:
        out[full] = torch.zeros(0, dtype=dtype, device=device) if factored else torch.zeros_like(param, dtype=dtype)
    return out


def accumulate(square: Tensor, row: Tensor, col: Tensor, full: Tensor, weight: Any) -> None:
    """row and col (fewer than two dimensions: full) <- their running means, moved toward the means
    of ``square`` by ``weight`` (lerp)."""
    if square.numel() == 0:  # an empty tensor has no rows or columns to average (a mean would be NaN)
        return
    if square.dim() < 2:
        full.lerp_(square, weight)
        return
    row.lerp_(square.mean(dim=-1, keepdim=True), weight)
    col.lerp_(square.mean(dim=-2, keepdim=True), weight)


def inverse_root(row: Tensor, col: Tensor, full: Tensor, shape: torch.Size, floor: Any) -> Tensor:
    """1 / sqrt(max(V, floor^2)) with V = R C / max(mean(R), floor) (factored) or V = full.

    Without a floor (CAME, AdaLomo) the factored root is taken as their references take it, one factor
    at a time: (R / mean(R))^-1/2 C^-1/2. R C itself would underflow to 0 where a zero gradient leaves
    R = C = eps1 = 1e-30, and the update 0 / sqrt(0) would be NaN."""
    if len(shape) < 2:
        estimate = full
    elif isinstance(floor, float) and floor == 0.0:
        return (row / row.mean(dim=-2, keepdim=True)).rsqrt() * col.rsqrt()
    else:
        estimate = (row * col) / row.mean(dim=-2, keepdim=True).clamp(min=floor)
    return estimate.clamp(min=floor * floor).rsqrt()


#: Adafactor's (eps1, eps2): eps1 floors the second moment (None: the dtype's machine epsilon), eps2
#: the parameter scale. Static: a Python value (None is allowed), so changing it recompiles.
ADAFACTOR_EPS = Hyper((None, 1e-3), sequence_of((optional(non_negative), non_negative), ("eps1", "eps2")),
                      static=True)


def rms(t: Tensor) -> Tensor:
    """The root mean square of a whole tensor, as a 0-d tensor (0 for an empty one)."""
    return torch.linalg.vector_norm(t) / math.sqrt(max(t.numel(), 1))


class scale_by_factored_rms(Transform):  # noqa: N801 - transforms are named like functions (optax grammar)
    """Adafactor's preconditioner, as torch.optim.Adafactor computes it.

    At step t, with b_t = 1 - t^``beta2_decay`` and eps1 = ``eps[0]`` (None: machine epsilon of the
    parameter's dtype):  R <- b_t R + (1-b_t) mean_cols(u^2),  C <- b_t C + (1-b_t) mean_rows(u^2),
    V = R C / max(mean(R), eps1)  (fewer than two dimensions: V <- b_t V + (1-b_t) u^2);
    u <- u / max(sqrt(V), eps1).
    """

    name = "factored"
    state = ("row_var", "col_var", "variance")
    nonnegative = ("variance",)
    elementwise = False
    hyper = {"beta2_decay": Hyper(-0.8, non_positive), "eps": ADAFACTOR_EPS}

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        return factored_buffers(param, *self.state)

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"one_minus_beta2": float(step) ** float(hyper["beta2_decay"])}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        out = []
        for u, p, row, col, full in zip(updates, ctx.params, *(state[k] for k in self.state)):
            accumulate(self.square(u, ctx), row, col, full, ctx["one_minus_beta2"])
            out.append(u * inverse_root(row, col, full, u.shape, self.floor(p, ctx)))
        return out

    # where Adafactor and CAME differ, besides the decay (``scale_by_came_rms`` overrides both)
    def square(self, u: Tensor, ctx: Context) -> Tensor:
        """What the moments average: u^2."""
        return u * u

    def floor(self, p: Tensor, ctx: Context) -> Any:
        """The lower bound of mean(R) and of sqrt(V): eps1, or the machine epsilon of the parameter's
        dtype (as torch.optim.Adafactor)."""
        eps1 = ctx["eps"][0]
        return torch.finfo(p.dtype).eps if eps1 is None else eps1


class clip_by_block_rms(Transform):  # noqa: N801
    """u <- u / max(1, rms(u) / d), per parameter (optax's ``clip_by_block_rms``; Adafactor's update
    clipping, threshold ``d``; CAME's ``clip_threshold``; AdaLomo's grouped update normalization).
    ``threshold`` names the hyperparameter and ``spec`` declares it (torch.optim.Adafactor wants d >= 1,
    AdaLomo any d > 0)."""

    name = "clip"
    elementwise = False

    def __init__(self, threshold: str = "d", spec: Hyper = Hyper(1.0, number_in(1))):
        self.threshold = threshold
        self.hyper = {threshold: spec}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        d = ctx[self.threshold]
        return [u / (rms(u) / d).clamp(min=1.0) for u in updates]

    def __repr__(self) -> str:
        return f"clip_by_block_rms({self.threshold!r})"


class scale_by_param_block_rms(Transform):  # noqa: N801
    """u <- max(eps2, rms(p)) u, per parameter (optax's ``scale_by_param_block_rms``; Adafactor's
    relative step, AdaLomo's lr * max(eps2, RMS(theta)): the update's scale follows the parameter's),
    eps2 = ``eps[1]``. ``eps`` declares the (eps1, eps2) pair as the rest of the chain does."""

    name = "param_scale"
    elementwise = False

    def __init__(self, eps: Hyper = ADAFACTOR_EPS):
        self.hyper = {"eps": eps}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        eps2 = ctx["eps"][1]
        return [u * rms(p.to(u.dtype)).clamp(min=eps2) for u, p in zip(updates, ctx.params)]


class scale_by_relative_step(Transform):  # noqa: N801
    """u <- -min(lr, 1/sqrt(t)) u at step t: Adafactor's relative step size, capped by ``lr`` as in
    torch.optim.Adafactor (the paper caps it at 0.01). Like ``scale_by_learning_rate``, it ends a chain;
    decoupled weight decay scaled by ``lr`` itself goes after it (``add_decayed_weights(after_lr=True)``)."""

    name = "relative_step"
    hyper = {"lr": Hyper(1e-2, non_negative)}

    def scalars(self, hyper, step: int) -> dict[str, float]:
        return {"rho": min(float(hyper["lr"]), 1 / math.sqrt(step))}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        rho = ctx["rho"]
        return [u * -rho for u in updates]
