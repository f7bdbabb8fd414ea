"""Muon written from the paper (Jordan et al., 2024, https://kellerjordan.github.io/posts/muon/), one
matrix at a time in float64, as an independent reference for ``gradwise.Muon``'s matrix route."""
from __future__ import annotations

import math

import torch


def quintic_newton_schulz(g: torch.Tensor, coefficients, steps: int, eps: float) -> torch.Tensor:
    """X_0 = G / ||G||_F (on the wide orientation);  X <- a X + b (X X^T) X + c (X X^T)^2 X; with a list
    of (a, b, c), iteration t takes entry t and the last repeats."""
    schedule = [coefficients] if not isinstance(coefficients[0], (tuple, list)) else list(coefficients)
    tall = g.shape[0] > g.shape[1]
    x = g.T if tall else g
    x = x / max(float(torch.linalg.matrix_norm(x)), eps)
    for t in range(steps):
        a, b, c = schedule[min(t, len(schedule) - 1)]
        gram = x @ x.T
        x = a * x + b * (gram @ x) + c * (gram @ (gram @ x))
    return x.T if tall else x


#: Amsel et al., 2025 (arXiv:2505.16932), Algorithm 1, as printed there
PAPER_COEFFICIENTS = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
]


def polar_express(g: torch.Tensor, steps: int, eps: float) -> torch.Tensor:
    """The paper's Algorithm 1 in float64: X = G / (||G||_F 1.01 + eps) on the wide orientation, then the
    coefficients above, all but the last as p(x / 1.01), the last repeating after the list runs out."""
    safe = [(a / 1.01, b / 1.01**3, c / 1.01**5) for a, b, c in PAPER_COEFFICIENTS[:-1]]
    coefficients = safe + PAPER_COEFFICIENTS[-1:]
    hs = coefficients[:steps] + [coefficients[-1]] * (steps - len(coefficients))
    tall = g.shape[0] > g.shape[1]
    x = g.T if tall else g
    x = x / (float(torch.linalg.matrix_norm(x)) * 1.01 + eps)
    for a, b, c in hs:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
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
            if o["coefficients"] == "polar_express":
                ortho = polar_express(u, o["steps"], o["eps"])
            else:
                ortho = quintic_newton_schulz(u, o["coefficients"], o["steps"], o["eps"])
            rows, cols = p.shape
            if o["adjust"] == "match_rms_adamw":
                scale = 0.2 * math.sqrt(max(rows, cols))
            else:
                scale = math.sqrt(max(1, rows / cols))
            p.mul_(1 - o["lr"] * o["weight_decay"]).sub_(o["lr"] * scale * ortho)
