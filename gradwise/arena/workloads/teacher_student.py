"""``teacher_student``: MLP regression against a frozen random teacher with label noise.

x ~ N(0, I_32); a 2-hidden-layer tanh teacher (width 64, weights N(0, 1/fan_in)) whose output is normalized to
unit variance; y = teacher(x) + sigma * noise with sigma = 0.1, so the Bayes floor of the validation MSE is
sigma^2 = 0.01. The student is an MLP 32-256-256-1 (ReLU). Draft target: validation MSE <= sigma^2 + 0.04 on
noisy labels; ``targets.json`` holds the measured one.
"""
from __future__ import annotations

import torch
from torch import nn

from gradwise.arena.workloads.base import Data, Workload

SIGMA = 0.1


class TeacherStudent(Workload):
    name = "teacher_student"
    description = "MLP 32-256-256-1 regressing a unit-variance tanh teacher, label noise 0.1 (floor 0.01)"
    metric = "mse"
    higher_is_better = False
    target = SIGMA ** 2 + 0.04
    step_hint = 3000
    max_runtime = 40.0
    batch_size = 128
    eval_every = 100
    loss_type = "mean_squared_error"
    floor = SIGMA ** 2

    def make_data(self) -> Data:
        g = torch.Generator().manual_seed(1)
        dims = [32, 64, 64, 1]
        weights = [torch.randn(a, b, generator=g) / a ** 0.5 for a, b in zip(dims[:-1], dims[1:])]
        x = torch.randn(60_000, 32, generator=g)
        h = x
        for i, w in enumerate(weights):
            h = h @ w
            if i < len(weights) - 1:
                h = torch.tanh(h)
        y = (h - h.mean()) / h.std()
        y = y + SIGMA * torch.randn(y.shape, generator=g)
        return Data(x[:50_000], y[:50_000], x[50_000:], y[50_000:])

    def init_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))

    def loss(self, output, y):
        return nn.functional.mse_loss(output, y)
