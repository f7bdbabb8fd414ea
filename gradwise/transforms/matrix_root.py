"""Inverse roots of symmetric positive semi-definite matrices by eigendecomposition, batched, with a
fallback: a matrix whose eigendecomposition fails keeps its previous root."""
from __future__ import annotations

import warnings

import torch
from torch import Tensor


def inverse_roots(factors: Tensor, root: int, epsilon: Tensor | float, dtype: torch.dtype,
                  previous: Tensor) -> tuple[Tensor, int]:
    """(A + eps I)^(-1/root) for a stack of symmetric matrices (k, n, n), in ``dtype``.

    A = Q diag(lam) Q^T by one batched ``torch.linalg.eigh`` of A + eps I; eigenvalues below eps
    (round-off can make them so, or negative) are raised to eps; the root is Q diag(lam^(-1/root)) Q^T.
    Should the batched call fail, each matrix is retried alone; a matrix that still fails, or whose
    input or result is not finite, keeps its ``previous`` root. Returns (roots in ``previous``'s
    dtype, number of matrices that fell back).
    """
    eps = torch.as_tensor(epsilon, dtype=dtype, device=factors.device)
    a = factors.to(dtype)
    eye = torch.eye(a.shape[-1], dtype=dtype, device=a.device)
    a = a + eps * eye
    try:
        roots = _roots(a, root, eps)
        ok = roots.isfinite().all(dim=(-2, -1))
    except RuntimeError:  # torch.linalg.LinAlgError: some matrix of the batch did not converge
        roots, ok = _one_by_one(a, root, eps)
    failed = int((~ok).sum())
    if failed:
        warnings.warn(f"gradwise: the eigendecomposition of {failed} preconditioner factor(s) of size"
                      f" {a.shape[-1]} failed or was not finite; they keep their previous inverse root",
                      RuntimeWarning, stacklevel=3)
        roots = torch.where(ok[:, None, None], roots, previous.to(dtype))
    return roots.to(previous.dtype), failed


def _roots(a: Tensor, root: int, eps: Tensor) -> Tensor:
    lam, q = torch.linalg.eigh(a)
    lam = lam.clamp(min=eps).pow(-1.0 / root)
    return (q * lam.unsqueeze(-2)) @ q.mT


def _one_by_one(a: Tensor, root: int, eps: Tensor) -> tuple[Tensor, Tensor]:
    roots, ok = torch.empty_like(a), torch.zeros(a.shape[0], dtype=torch.bool, device=a.device)
    for i in range(a.shape[0]):
        if not a[i].isfinite().all():
            continue
        try:
            roots[i] = _roots(a[i], root, eps)
        except RuntimeError:
            continue
        ok[i] = roots[i].isfinite().all()
    return roots, ok
