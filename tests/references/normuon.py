"""NorMuon written from the paper (Li et al., 2025, arXiv:2510.05491, Algorithm 1), one matrix at a time
in float64, as an independent reference for ``gradwise.NorMuon``'s matrix route; ``update_scale``
"preserve_norm" is the variant of the authors' released code (the Frobenius norm of NS(M) kept)."""
from __future__ import annotations

import math

import torch

from tests.references.muon import quintic_newton_schulz


class NorMuonReference:
    """M <- b1 M + (1-b1) G;  U <- G + b1 (M - G) (nesterov) or M;  O <- NS(U);
    v <- b2 v + (1-b2) mean_cols(O^2);  P <- O / (sqrt(v) + eps);
    W <- W (1 - lr wd) - lr * 0.2 sqrt(mn) P / ||P||_F  ("match_rms", the paper), or
    W <- W (1 - lr wd) - lr s ||O||_F P / ||P||_F  ("preserve_norm"), s = sqrt(max(1, m/n))."""

    def __init__(self, params, lr=0.02, momentum=0.95, beta2=0.95, weight_decay=0.0, nesterov=True, ns_steps=5,
                 ns_coeffs=(3.4445, -4.7750, 2.0315), update_scale="preserve_norm", eps=1e-10):
        self.params = list(params)
        self.momenta = [torch.zeros_like(p) for p in self.params]
        self.second = [torch.zeros(p.shape[0], 1, dtype=p.dtype) for p in self.params]
        self.options = dict(lr=lr, b1=momentum, b2=beta2, wd=weight_decay, nesterov=nesterov, steps=ns_steps,
                            coefficients=ns_coeffs, scale=update_scale, eps=eps)

    @torch.no_grad()
    def step(self):
        o = self.options
        for p, m, v in zip(self.params, self.momenta, self.second):
            g = p.grad
            m.copy_(o["b1"] * m + (1 - o["b1"]) * g)
            u = g + o["b1"] * (m - g) if o["nesterov"] else m
            ortho = quintic_newton_schulz(u, o["coefficients"], o["steps"], 1e-7)
            rows, cols = p.shape
            v.copy_(o["b2"] * v + (1 - o["b2"]) * (ortho ** 2).sum(dim=1, keepdim=True) / cols)
            normed = ortho / (v.sqrt() + o["eps"])
            if o["scale"] == "match_rms":
                size = 0.2 * math.sqrt(rows * cols)
            else:
                size = math.sqrt(max(1, rows / cols)) * float(torch.linalg.matrix_norm(ortho))
            p.mul_(1 - o["lr"] * o["wd"]).sub_(o["lr"] * size / (float(torch.linalg.matrix_norm(normed)) + o["eps"])
                                               * normed)
