"""Muon written from the paper (Jordan et al., 2024, https://kellerjordan.github.io/posts/muon/), one
matrix at a time in float64, as an independent reference for ``gradwise.Muon``'s matrix route."""
from __future__ import annotations

import math

import torch


def quintic_newton_schulz(g: torch.Tensor, coefficients, steps: int, eps: float) -> torch.Tensor:
    """X_0 = G / ||G||_F (on the wide orientation);  X <- a X + b (X X^T) X + c (X X^T)^2 X."""
    a, b, c = coefficients
    tall = g.shape[0] > g.shape[1]
    x = g.T if tall else g
    x = x / max(float(torch.linalg.matrix_norm(x)), eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + b * (gram @ x) + c * (gram @ (gram @ x))
    return x.T if tall else x


class MuonReference:
    """Muon on a list of 2-D float64 tensors: B <- mu B + (1-mu) G; U <- G + mu (B - G) (nesterov) or B;
    W <- W (1 - lr wd) - lr s NS(U), s = sqrt(max(1, rows/cols)) or 0.2 sqrt(max(rows, cols))."""

    def __init__(self, params, lr, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7, ns_steps=5, adjust_lr_fn=None):
        self.params = list(params)
        self.buffers = [torch.zeros_like(p) for p in self.params]
        self.options = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                            coefficients=ns_coefficients, eps=eps, steps=ns_steps, adjust=adjust_lr_fn)

    @torch.no_grad()
    def step(self):
        o = self.options
        for p, buf in zip(self.params, self.buffers):
            g = p.grad
            buf.copy_(o["momentum"] * buf + (1 - o["momentum"]) * g)
            u = g + o["momentum"] * (buf - g) if o["nesterov"] else buf
            ortho = quintic_newton_schulz(u, o["coefficients"], o["steps"], o["eps"])
            rows, cols = p.shape
            if o["adjust"] == "match_rms_adamw":
                scale = 0.2 * math.sqrt(max(rows, cols))
            else:
                scale = math.sqrt(max(1, rows / cols))
            p.mul_(1 - o["lr"] * o["weight_decay"]).sub_(o["lr"] * scale * ortho)
