"""Batched symmetric eigendecompositions with a fallback (a matrix whose decomposition fails keeps
what it had), and the inverse roots and eigenbases built on them."""
from __future__ import annotations

import warnings

import torch
from torch import Tensor


def finite_blocks(blocks: Tensor) -> Tensor:
    """(n,): whether every entry of each of the n (rows, cols) blocks is finite, in one pass (their min and
    max are NaN where a NaN is, infinite where an infinity is; ``isfinite().all()`` makes four)."""
    low, high = torch.aminmax(blocks.flatten(-2), dim=-1)
    return low.isfinite() & high.isfinite()


def safe_eigh(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.linalg.eigh`` of a stack (k, n, n) of symmetric matrices in one batched call; should
    it fail, each matrix alone. Returns (eigenvalues ascending, eigenvectors, ok): ``ok[i]`` is False
    where matrix i, its input or its result is not finite or did not converge."""
    try:
        lam, q = torch.linalg.eigh(a)
        return lam, q, finite_blocks(lam[:, None, :]) & finite_blocks(q)
    except RuntimeError:  # torch.linalg.LinAlgError: some matrix of the batch did not converge
        pass
    lam, q = a.new_zeros(a.shape[:-1]), a.new_zeros(a.shape)
    ok = torch.zeros(a.shape[0], dtype=torch.bool, device=a.device)
    for i in range(a.shape[0]):
        if not a[i].isfinite().all():
            continue
        try:
            lam[i], q[i] = torch.linalg.eigh(a[i])
        except RuntimeError:
            continue
        ok[i] = lam[i].isfinite().all() & q[i].isfinite().all()
    return lam, q, ok


def keep_previous(new: Tensor, ok: Tensor, previous: Tensor, what: str) -> tuple[Tensor, int]:
    """``new`` where ``ok``, else ``previous`` (in ``previous``'s dtype), with a warning; and the
    number of matrices that fell back."""
    failed = int((~ok).sum())
    if failed:
        warnings.warn(f"gradwise: the eigendecomposition of {failed} preconditioner factor(s) of size"
                      f" {new.shape[-1]} failed or was not finite; they keep their previous {what}",
                      RuntimeWarning, stacklevel=4)
        new = torch.where(ok[:, None, None], new, previous.to(new.dtype))
    return new.to(previous.dtype), failed


def inverse_roots(factors: Tensor, root: int, epsilon: Tensor | float, dtype: torch.dtype,
                  previous: Tensor) -> tuple[Tensor, int]:
    """(A + eps I)^(-1/root) for a stack of symmetric PSD matrices (k, n, n), computed in ``dtype``:
    A + eps I = Q diag(lam) Q^T, eigenvalues below eps (round-off) raised to eps, the root is
    Q diag(lam^(-1/root)) Q^T. A matrix that fails keeps its ``previous`` root. Returns (roots,
    number that fell back)."""
    eps = torch.as_tensor(epsilon, dtype=dtype, device=factors.device)
    a = factors.to(dtype) + eps * torch.eye(factors.shape[-1], dtype=dtype, device=factors.device)
    lam, q, ok = safe_eigh(a)
    roots = (q * lam.clamp(min=eps).pow(-1.0 / root).unsqueeze(-2)) @ q.mT
    return keep_previous(roots, ok & finite_blocks(roots), previous, "inverse root")


def eigenbases(factors: Tensor, dtype: torch.dtype, previous: Tensor) -> tuple[Tensor, int]:
    """Eigenvectors of each symmetric matrix, by decreasing eigenvalue, computed in ``dtype``; a
    matrix that fails keeps its ``previous`` basis. Returns (bases, number that fell back)."""
    _, q, ok = safe_eigh(factors.to(dtype))
    return keep_previous(q.flip(-1), ok, previous, "eigenbasis")
