"""Lookahead as written in the paper (Zhang et al., 2019, Algorithm 1), around any torch optimizer."""
from __future__ import annotations

import torch


class ReferenceLookahead:
    """Run ``inner``; after every k-th of its steps: slow <- slow + alpha (fast - slow), fast <- slow."""

    def __init__(self, inner: torch.optim.Optimizer, k: int, alpha: float):
        self.inner, self.k, self.alpha, self.count = inner, k, alpha, 0
        self.params = [p for g in inner.param_groups for p in g["params"]]
        self.slow = [p.detach().clone() for p in self.params]

    def zero_grad(self):
        self.inner.zero_grad()

    @torch.no_grad()
    def step(self):
        self.inner.step()
        self.count += 1
        if self.count % self.k == 0:
            for p, slow in zip(self.params, self.slow):
                slow += self.alpha * (p - slow)
                p.copy_(slow)
