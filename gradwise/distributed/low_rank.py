"""PowerSGD on DiLoCo's pseudo-gradients: ``pseudo_gradient_codec="powersgd"`` (``"powersgd-r4"``: rank 4).

Vogels, Karimireddy, Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", applied at each sync to what the workers average: each worker's pseudo-gradient ``delta``
of a matrix (a tensor seen as ``(shape[0], rest)``, ``n x m``), plus its own error of the last sync (error
feedback), is compressed to rank ``r = min(rank, n, m)`` with one power-iteration step warm-started from
the last sync's ``Q`` (Algorithm 1 of the paper; the same rule as torch's DDP hook)::

    M = delta + error                      (this worker's; error 0 at first)
    P = M Q               all-reduced (summed), then orthonormalized (``torch.linalg.qr``)
    Q = M^T P             all-reduced, divided by the workers   (kept: the next sync's warm start)
    mean ~ P Q^T;         error <- M - P Q^T

and every other tensor (vectors, scalars) is averaged whole. ``Q`` starts as the same Gaussian draw on every
worker (seeded by the parameter's index). At ``rank >= min(n, m)`` the projection ``P P^T`` is the identity on
the mean's columns: the uncompressed mean, to rounding. The two all-reduces of a matrix depend on each other
(``Q`` needs ``P``'s sum), so they block: no overlapped sync. Sent per worker and sync, per device and dtype:
one all-reduce of the vectors' ``numel``, one of ``sum n r`` (P) and one of ``sum m r`` (Q) elements.
"""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from gradwise.core.collectives import Traffic, all_reduce

_TAG = re.compile(r"powersgd(?:-r(\d+))?")


def powersgd_rank(codec: Any) -> int | None:
    """The rank a ``pseudo_gradient_codec`` asks for (``"powersgd"``: 1, torch's default; ``"powersgd-r4"``:
    4), None for any other codec; a ``ValueError`` for a PowerSGD tag spelled wrong."""
    if not isinstance(codec, str) or not codec.lower().startswith("powersgd"):
        return None
    match = _TAG.fullmatch(codec.lower())
    if match is None or (match[1] is not None and int(match[1]) < 1):
        raise ValueError(f"invalid pseudo_gradient_codec={codec!r}: PowerSGD is spelled 'powersgd' (rank 1) or"
                         " 'powersgd-r<rank >= 1>', e.g. 'powersgd-r4'")
    return int(match[1] or 1)


def _matrix(p: Tensor) -> tuple[int, int] | None:
    """``(n, m)`` of a tensor compressed as a matrix (two dimensions or more), None for one sent whole."""
    return (p.shape[0], p.numel() // p.shape[0]) if p.dim() >= 2 and p.numel() else None


class PowerSGDPseudoGradients:
    """Each matrix's warm-start ``Q`` and this worker's error feedback; ``mean`` averages a bucket."""

    def __init__(self, rank: int, params: list[Tensor], seed: int = 0) -> None:
        self.rank = rank
        self.q: dict[int, Tensor] = {}
        self.error: dict[int, Tensor] = {}
        for i, p in enumerate(params):
            shape = _matrix(p)
            if shape is not None:
                n, m = shape
                g = torch.Generator().manual_seed(seed + i)
                self.q[i] = torch.randn(m, min(rank, n, m), generator=g, dtype=torch.float64).to(p.device, p.dtype)
                self.error[i] = torch.zeros(n, m, dtype=p.dtype, device=p.device)

    @torch.no_grad()
    def mean(self, deltas: dict[int, Tensor], group: Any, world: int, traffic: Traffic) -> dict[int, Tensor]:
        """The workers' mean of ``deltas`` (parameter index -> this worker's pseudo-gradient, one device and
        dtype): matrices compressed, the rest exact; up to three all-reduces, counted in ``traffic``."""
        matrices = [i for i in deltas if i in self.q]
        whole = [i for i in deltas if i not in self.q]
        means: dict[int, Tensor] = {}
        if whole:
            flat = _summed(torch.cat([deltas[i].reshape(-1) for i in whole]), group, world, traffic).div_(world)
            for i, piece in zip(whole, flat.split([deltas[i].numel() for i in whole])):
                means[i] = piece.view_as(deltas[i])
        if not matrices:
            return means
        ms = {i: self.error[i].add(deltas[i].reshape(self.error[i].shape)) for i in matrices}
        ps = _summed(torch.cat([(ms[i] @ self.q[i]).reshape(-1) for i in matrices]), group, world,
                     traffic)
        ps = [torch.linalg.qr(p.view(ms[i].shape[0], -1)).Q
              for i, p in zip(matrices, ps.split([ms[i].shape[0] * self.q[i].shape[1] for i in matrices]))]
        qs = _summed(torch.cat([(ms[i].T @ p).reshape(-1) for i, p in zip(matrices, ps)]), group, world,
                     traffic).div_(world)
        for i, p, q in zip(matrices, ps, qs.split([self.q[i].numel() for i in matrices])):
            self.q[i] = q.view_as(self.q[i]).clone()
            approx = p @ self.q[i].T
            self.error[i] = ms[i] - approx
            means[i] = approx.view_as(deltas[i])
        return means

    def state_dict(self) -> dict[str, Any]:
        """``{"rank", "q": [...], "error": [...]}``, the matrices in parameter order."""
        return {"rank": self.rank, "q": [self.q[i].clone() for i in sorted(self.q)],
                "error": [self.error[i].clone() for i in sorted(self.error)]}

    def check(self, state: dict[str, Any]) -> None:
        """A ``ValueError`` unless ``state`` is one of this model's at this rank (nothing is written)."""
        ok = state.get("rank") == self.rank and [t.shape for t in state.get("q", [])] == \
            [self.q[i].shape for i in sorted(self.q)] and [t.shape for t in state.get("error", [])] == \
            [self.error[i].shape for i in sorted(self.error)]
        if not ok:
            raise ValueError(f"DiLoCo.load_state_dict: the state's PowerSGD state (rank {state.get('rank')!r}) is"
                             f" not one of this model's at rank {self.rank}; build it with the saved codec")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, q, e in zip(sorted(self.q), state["q"], state["error"]):
            self.q[i], self.error[i] = q.clone(), e.clone()


def _summed(flat: Tensor, group: Any, world: int, traffic: Traffic) -> Tensor:
    """``flat`` summed over the workers in place (one worker: itself, nothing sent)."""
    return all_reduce(flat, "sum", group, traffic) if world > 1 else flat
