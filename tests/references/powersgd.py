"""PowerSGD's compression of the workers' mean (Vogels et al. 2019, Algorithm 1), every worker in one process.

For each matrix ``W`` (``(shape[0], rest)``, rank ``r = min(rank, n, m)``) and each worker ``w`` with its own
error ``e_w`` (zero at first) and the workers' common warm start ``Q`` (a Gaussian draw seeded by the
parameter's index)::

    M_w = delta_w + e_w;   P = orthonormal basis of sum_w M_w Q;   Q = (sum_w M_w^T P) / W
    mean = P Q^T;          e_w = M_w - P Q^T

and the plain mean for every tensor of fewer than two dimensions. Written from the paper, not from gradwise's
code: the workers' sums taken here in worker order, the basis by ``torch.linalg.qr``.
"""
from __future__ import annotations

import torch


class PowerSGDMeans:
    """``simulate``'s ``compress``: the compressed mean of a fragment's pseudo-gradients."""

    def __init__(self, rank: int, params, workers: int) -> None:
        self.rank, self.workers = rank, workers
        self.q, self.errors = {}, {}
        for i, p in enumerate(params):
            if p.dim() >= 2:
                n, m = p.shape[0], p.numel() // p.shape[0]
                g = torch.Generator().manual_seed(i)
                self.q[i] = torch.randn(m, min(rank, n, m), generator=g, dtype=torch.float64).to(p.dtype)
                self.errors[i] = [torch.zeros(n, m, dtype=p.dtype) for _ in range(workers)]

    @torch.no_grad()
    def __call__(self, indices, synced, worker_params) -> dict[int, torch.Tensor]:
        means = {}
        for i in indices:
            deltas = [synced[i] - params[i] for params in worker_params]
            if i not in self.q:
                means[i] = sum(deltas[1:], deltas[0]) / self.workers
                continue
            ms = [e + d.reshape(e.shape) for e, d in zip(self.errors[i], deltas)]
            p = torch.linalg.qr(sum((m @ self.q[i] for m in ms[1:]), ms[0] @ self.q[i])).Q
            self.q[i] = sum((m.T @ p for m in ms[1:]), ms[0].T @ p) / self.workers
            approx = p @ self.q[i].T
            self.errors[i] = [m - approx for m in ms]
            means[i] = approx.view_as(synced[i])
        return means


def worker_gradients(model: torch.nn.Module, params: list[torch.Tensor], workers: int, backward) -> list[list]:
    """Each worker's gradients at ``params``, one process: for worker ``w``, ``model``'s parameters set to
    ``params``, then ``backward(model, w)``; the workers' gradients, in worker order."""
    grads = []
    for worker in range(workers):
        with torch.no_grad():
            for p, value in zip(model.parameters(), params):
                p.copy_(value)
        model.zero_grad()
        backward(model, worker)
        grads.append([p.grad.clone() for p in model.parameters()])
    return grads
