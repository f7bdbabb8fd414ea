"""The Kronecker factors of PSGD's preconditioner P = (Q_L^T Q_L) (x) (Q_R^T Q_R) for stacks of matrices
G (n, rows, cols), fitted on the Lie group of upper-triangular (or diagonal) matrices (Li, 2018,
arXiv:1512.04202 and "Preconditioner on matrix Lie group for SGD", arXiv:1809.10232).

A factor is upper-triangular, stored (n, d, d), or diagonal, stored as a row (n, 1, d); a stack of
vectors has a left factor only (``right`` is None). Q G Q'^T is ``apply_left(Q, G)`` then
``apply_right(G, Q')``; the whitening fit takes a pair (G, V) with V ~ N(0, I) (``fit_factors``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.linalg import solve_triangular, vector_norm


def matrix_view(shape: torch.Size) -> tuple[int, int]:
    """The matrix a parameter is seen as: (d0, d1 * ...), or (numel, 1) for a vector or a scalar."""
    return (shape[0], math.prod(shape[1:])) if len(shape) >= 2 else (math.prod(shape), 1)


def diagonal_sides(sides: tuple[int, ...], ndim: int, group) -> list[bool]:
    """Which of a parameter's factor sides are diagonal, by pytorch-optimizer's rules (the group's
    ``max_size_triangular``, ``min_ndim_triangular`` and ``memory_save_mode``); ``ndim``: the parameter's."""
    mode, longest = group["memory_save_mode"], max(range(len(sides)), key=lambda k: (sides[k], k), default=0)
    diag = [mode == "all_diag" or size == 1 or size > group["max_size_triangular"]
            or ndim < group["min_ndim_triangular"] for size in sides]
    if sides and (mode == "one_diag" or (mode == "smart_one_diag" and len(sides) == 2 and sides[0] != sides[1])):
        diag[longest] = True
    return diag


def triangular(q: Tensor) -> bool:
    return q.shape[-2] > 1


def apply_left(q: Tensor, x: Tensor) -> Tensor:
    """Q x (a diagonal row scales the rows of x)."""
    return q @ x if triangular(q) else q.mT * x


def apply_right(x: Tensor, q: Tensor | None) -> Tensor:
    """x Q^T (a diagonal row scales the columns of x); x itself without a right factor."""
    if q is None:
        return x
    return x @ q.mT if triangular(q) else x * q


def precondition(left: Tensor, right: Tensor | None, g: Tensor) -> Tensor:
    """P g = Q_L^T Q_L g Q_R^T Q_R."""
    x = left.mT @ (left @ g) if triangular(left) else (left * left).mT * g
    if right is None:
        return x
    return (x @ right.mT) @ right if triangular(right) else x * (right * right)


def norm_lower_bound(a: Tensor) -> Tensor:
    """(n,): a lower bound of the spectral norm of each (d, d) matrix of ``a`` (which it scales in place): the
    norm of a times its largest row or column, normalized, as pytorch-optimizer's (and the authors') estimate."""
    max_abs = a.abs().amax(dim=(-2, -1))
    a.div_(torch.where(max_abs > 0, max_abs, 1.0)[:, None, None])
    tiny = torch.finfo(a.dtype).tiny
    aa = a * a
    value0, i = aa.sum(-2).max(-1)
    value1, j = aa.sum(-1).max(-1)
    x0 = a.gather(-1, i[:, None, None].expand(-1, a.shape[-2], 1)).mT @ a
    bound0 = vector_norm((x0 / vector_norm(x0, dim=-1, keepdim=True).clamp_min(tiny)) @ a.mT, dim=(-2, -1))
    x1 = a @ a.gather(-2, j[:, None, None].expand(-1, 1, a.shape[-1])).mT
    bound1 = vector_norm(a.mT @ (x1 / vector_norm(x1, dim=-2, keepdim=True).clamp_min(tiny)), dim=(-2, -1))
    return max_abs * torch.where(value0 > value1, bound0, bound1)


def fit_factors(left: Tensor, right: Tensor | None, g: Tensor, v: Tensor, lr: Tensor, eps: float) -> None:
    """One step of the fit, in place: with A = Q_L G Q_R^T and B = Q_L^-T V Q_R^-1, each factor moves
    along the relative gradient of E[|P^(1/2) g|^2 + |P^(-1/2) v|^2]:
    Q <- Q - lr triu(A A^T - B B^T) / (||A A^T + B B^T||_lb + eps) Q  (triangular; A^T A, B^T B on the
    right side, ||.||_lb ``norm_lower_bound``), or Q <- Q - lr (a - b) Q / (max |a + b| + eps) with a, b
    the row (column) sums of A^2, B^2 (diagonal)."""
    a = apply_right(apply_left(left, g), right)
    b = solve_triangular(left.mT, v, upper=False) if triangular(left) else v / left.mT
    if right is not None:
        b = solve_triangular(right, b, upper=True, left=False) if triangular(right) else b / right
    for q, dim in ((left, -1), (right, -2)):
        if q is None:
            continue
        if triangular(q):
            aa, bb = (a @ a.mT, b @ b.mT) if dim == -1 else (a.mT @ a, b.mT @ b)
            step = torch.triu((aa - bb) * lr) / (norm_lower_bound(aa + bb) + eps)[:, None, None]
            q.sub_(step @ q)
        else:
            aa, bb = (a * a).sum(dim, keepdim=True), (b * b).sum(dim, keepdim=True)
            aa, bb = (aa.mT, bb.mT) if dim == -1 else (aa, bb)
            step = (aa - bb) * lr * q
            q.sub_(step / ((aa + bb).abs().amax(-1, keepdim=True) + eps))


def balance(left: Tensor, right: Tensor) -> None:
    """Rescale the two factors of each matrix to the same largest entry (their geometric mean), in place;
    the preconditioner does not change."""
    norms = [q.abs().amax(dim=(-2, -1), keepdim=True) for q in (left, right)]
    mean = (norms[0] * norms[1]) ** 0.5
    left.mul_(mean / norms[0])
    right.mul_(mean / norms[1])
