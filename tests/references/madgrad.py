"""MADGRAD (Defazio & Jelassi, 2021, arXiv:2101.11075), Algorithm 1, one tensor at a time in float64,
for the tests: written from the paper, independently of ``gradwise.transforms.madgrad``."""
from __future__ import annotations

import math

import torch


class MadgradReference:
    """x_{t+1} = (1 - c) x_t + c z_{t+1}, z_{t+1} = x0 - s_{t+1} / (nu_{t+1}^(1/3) + eps),
    s and nu the lambda-weighted sums of g and g^2, lambda_t = lr sqrt(t), c = 1 - momentum."""

    def __init__(self, params, lr, momentum=0.9, eps=1e-6):
        self.params = [p.detach().double().clone() for p in params]
        self.x0 = [p.clone() for p in self.params]
        self.s = [torch.zeros_like(p) for p in self.params]
        self.nu = [torch.zeros_like(p) for p in self.params]
        self.lr, self.momentum, self.eps, self.t = lr, momentum, eps, 0

    def step(self, grads):
        self.t += 1
        lamb = self.lr * math.sqrt(self.t)
        c = 1 - self.momentum
        for i, g in enumerate(grads):
            g = g.double()
            x = self.params[i]
            if self.momentum == 0:  # the iterate is z: its starting point follows x
                self.x0[i] = x + self.s[i] / (self.nu[i] ** (1 / 3) + self.eps)
            self.s[i] = self.s[i] + lamb * g
            self.nu[i] = self.nu[i] + lamb * g * g
            z = self.x0[i] - self.s[i] / (self.nu[i] ** (1 / 3) + self.eps)
            self.params[i] = (1 - c) * x + c * z
        return self.params
