"""LOMO and AdaLomo in float64, written from the papers (Lv et al. 2023, arXiv:2306.09782 and
arXiv:2310.10195) and the update their package ``lomo-optim`` 0.1.1 performs inside backward. That
package cannot run here: it allocates its state with ``.cuda()`` and imports ``transformers``.

Each reference steps a list of tensors from given gradients, one tensor at a time, as a hook would.
"""
from __future__ import annotations

import math

import torch


def _clip(g, clip_grad_value):
    return g.clamp(-clip_grad_value, clip_grad_value) if clip_grad_value else g


class ReferenceLOMO:
    """theta <- theta (1 - lr wd) - lr clip(g)."""

    def __init__(self, params, lr, clip_grad_value=None, weight_decay=0.0):
        self.params, self.lr, self.clip, self.wd = params, lr, clip_grad_value, weight_decay

    @torch.no_grad()
    def step(self, grads):
        for p, g in zip(self.params, grads):
            p.mul_(1 - self.lr * self.wd).sub_(self.lr * _clip(g, self.clip))


class ReferenceAdaLomo:
    """At step t: beta = 1 - t^decay_rate; G = clip(g)^2 + eps1;
    matrices (factored over the last two dims): R <- beta R + (1-beta) rowmean(G),
    C <- beta C + (1-beta) colmean(G), V = R C^T / mean(R);  others: V <- beta V + (1-beta) G;
    U = clip(g) / sqrt(V);  U <- U / max(1, RMS(U) / clip_threshold);
    alpha = lr max(eps2, RMS(theta));  theta <- theta (1 - alpha wd) - alpha U.
    """

    def __init__(self, params, lr, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8, clip_grad_value=None,
                 weight_decay=0.0):
        self.params, self.lr, self.eps, self.d, self.c = params, lr, eps, clip_threshold, decay_rate
        self.clip, self.wd, self.t = clip_grad_value, weight_decay, 0
        self.row = [p.new_zeros(p.shape[:-1]) if p.dim() >= 2 else None for p in params]
        self.col = [p.new_zeros(p.shape[:-2] + p.shape[-1:]) if p.dim() >= 2 else None for p in params]
        self.v = [p.new_zeros(p.shape) if p.dim() < 2 else None for p in params]

    @staticmethod
    def _rms(x):
        return math.sqrt(float((x * x).sum()) / x.numel())

    @torch.no_grad()
    def step(self, grads):
        self.t += 1
        beta = 1 - self.t ** self.c
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if p.numel() == 0:
                continue
            g = _clip(g, self.clip)
            G = g * g + self.eps[0]
            if p.dim() >= 2:
                self.row[i] = beta * self.row[i] + (1 - beta) * G.mean(dim=-1)
                self.col[i] = beta * self.col[i] + (1 - beta) * G.mean(dim=-2)
                V = self.row[i].unsqueeze(-1) * self.col[i].unsqueeze(-2) / self.row[i].mean(dim=-1)[..., None, None]
            else:
                self.v[i] = beta * self.v[i] + (1 - beta) * G
                V = self.v[i]
            U = g / V.sqrt()
            U = U / max(1.0, self._rms(U) / self.d)
            alpha = self.lr * max(self.eps[1], self._rms(p))
            p.mul_(1 - alpha * self.wd).sub_(alpha * U)
