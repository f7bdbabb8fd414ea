"""Muon's matrix step: orthogonalize the update by a quintic Newton-Schulz iteration, then rescale it
by the matrix's shape (Jordan et al., 2024, "Muon: an optimizer for hidden layers in neural
networks", https://kellerjordan.github.io/posts/muon/; Liu et al., 2025, arXiv:2502.16982). The
iteration takes one (a, b, c) or a schedule of them, Polar Express's included (``polar_express.py``)."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

from gradwise.core.hyper import Hyper, choice, int_in, positive
from gradwise.core.transform import Context, Transform
from gradwise.transforms.polar_express import coefficient_schedule, iteration_coefficients, norm_factor

#: (a, b, c) of the quintic from the Muon reference: the largest slope at zero for which five
#: iterations still map every singular value in (0, 1] into about [0.7, 1.2].
MUON_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_DTYPES = (None, torch.bfloat16, torch.float16, torch.float32, torch.float64)
ADJUST_LR_FNS = (None, "original", "match_rms_adamw", "none")


def newton_schulz(x: Tensor, coefficients: Any, steps: int, eps: Any) -> Tensor:
    """Orthogonalize a stack of matrices ``x`` of shape (k, rows, cols) with rows <= cols:
    X <- X / max(||X||_F, eps) (a named schedule's X / (s ||X||_F + eps): Polar Express's s = 1.01), then
    ``steps`` times X <- a_t X + (b_t A + c_t A^2) X with A = X X^T and (a_t, b_t, c_t) the t-th of
    ``coefficients`` (one triple for all, a schedule whose last entry repeats, or a name).
    Each iteration is three batched matmuls over the whole stack; a stack of one runs torch.optim.Muon's
    2-D kernels (addmm) and gives its bfloat16 result bit for bit; in a larger stack ``baddbmm`` rounds
    differently from torch's per-matrix ``addmm`` for about 1 in 130 matrices of side 32 or less (README, Muon)."""
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    factor = norm_factor(coefficients)
    x = x / (norm.clamp(min=eps) if factor is None else norm * factor + eps)
    lone = x.shape[0] == 1
    x, multiply_add = (x[0], torch.addmm) if lone else (x, torch.baddbmm)
    for a, b, c in iteration_coefficients(coefficients, steps):
        gram = x @ x.mT
        x = multiply_add(x, multiply_add(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x[None] if lone else x


class orthogonalize_by_newton_schulz(Transform):  # noqa: N801
    """U <- NS(U): the nearest semi-orthogonal matrix to each 2-D update, approximately (U S' V^T
    with S' near 1 instead of U V^T, which the quintic trades for speed).

    Tall matrices are transposed so the Gram matrix is the smaller one, and updates of the same
    shape are stacked and iterated together (batched matmuls), not one by one. ``ns_dtype`` is the
    dtype of the iteration: bfloat16 as in torch.optim.Muon and the reference, None for the update's.
    ``ns_coefficients``: one (a, b, c) for every iteration (Jordan's by default), a sequence of them, one
    per iteration (the last repeats), or ``"polar_express"``: Amsel et al.'s schedule and normalization.
    Only 2-D updates are accepted: route other parameters elsewhere (``route``). ``eps`` names the
    hyperparameter of the normalization's floor (NorMuon's ``eps`` is its own: there it is ``ns_eps``).
    """

    name = "newton_schulz"
    elementwise = False
    reads_params = False
    batched = True
    hyper = {
        "ns_coefficients": Hyper(MUON_COEFFICIENTS, coefficient_schedule(), static=True),
        "ns_steps": Hyper(5, int_in(1, 99), static=True),
        "eps": Hyper(1e-7, positive),
        "ns_dtype": Hyper(torch.bfloat16, choice(NS_DTYPES, "None: the update's dtype"), static=True),
    }

    def __init__(self, eps: str = "eps"):
        self.eps = eps
        if eps != "eps":
            self.hyper = {(eps if k == "eps" else k): v for k, v in type(self).hyper.items()}

    def init(self, param: Tensor, group) -> dict[str, Tensor]:
        _check_matrix(param)  # so that the optimizer refuses it before a step's first write
        return {}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        for u in updates:
            _check_matrix(u)
        dtype = ctx["ns_dtype"]
        by_shape: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, u in enumerate(updates):
            by_shape[tuple(sorted(u.shape))].append(i)
        out: list[Tensor] = list(updates)
        for members in by_shape.values():
            first = _wide(updates[members[0]])
            # stacked straight into the iteration's dtype: one pass, not a float32 stack and then its copy
            stack = first.new_empty((len(members), *first.shape), dtype=dtype or first.dtype)
            for row, i in zip(stack, members):
                row.copy_(_wide(updates[i]))
            ortho = newton_schulz(stack, ctx["ns_coefficients"], ctx["ns_steps"], ctx[self.eps])
            for i, o in zip(members, ortho.to(updates[members[0]].dtype).unbind()):
                out[i] = o.mT if updates[i].shape[0] > updates[i].shape[1] else o
        return out

    def __repr__(self) -> str:
        return f"orthogonalize_by_newton_schulz({'' if self.eps == 'eps' else repr(self.eps)})"


def _wide(u: Tensor) -> Tensor:
    return u.mT if u.shape[0] > u.shape[1] else u


class scale_by_shape(Transform):  # noqa: N801
    """U <- s U for an (A, B) matrix: s = sqrt(max(1, A/B)) for ``adjust_lr_fn`` None or "original"
    (Jordan's Muon: every update then has about the RMS of a square one), s = 0.2 sqrt(max(A, B))
    for "match_rms_adamw" (Liu et al.: the update's RMS matches AdamW's, so AdamW's lr and weight
    decay carry over), s = 1 for "none". Applied after weight decay is not the same: torch.optim.Muon
    scales only the orthogonalized update, so this link sits before ``add_decayed_weights``.
    """

    name = "shape_scale"
    elementwise = False
    reads_params = False
    hyper = {"adjust_lr_fn": Hyper(None, choice(ADJUST_LR_FNS), static=True)}

    def update(self, updates: list[Tensor], state, ctx: Context) -> list[Tensor]:
        return [u * shape_scale(ctx["adjust_lr_fn"], u.shape) for u in updates]


def shape_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    rows, cols = shape[0], shape[1]
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


def _check_matrix(t: Tensor) -> None:
    if t.dim() != 2:
        raise ValueError(f"orthogonalize_by_newton_schulz: got a tensor of shape {tuple(t.shape)};"
                         " it orthogonalizes 2-D matrices only (route others to another chain)")
