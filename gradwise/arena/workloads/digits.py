"""``digits_cnn``: scikit-learn's bundled 8x8 digits (1797 images, 10 classes), a small CNN; seconds-long."""
from __future__ import annotations

import torch
from torch import nn

from gradwise.arena.workloads.base import Data, Workload


class DigitsCNN(Workload):
    name = "digits_cnn"
    description = "sklearn digits 8x8, 2 conv + fc CNN, val accuracy (fixed 80/20 split)"
    metric = "accuracy"
    higher_is_better = True
    target = 0.975
    step_hint = 600
    max_runtime = 20.0
    batch_size = 64
    eval_every = 25
    loss_type = "softmax_cross_entropy"

    def make_data(self) -> Data:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        n_train = int(0.8 * len(y))
        train, val = order[:n_train], order[n_train:]
        return Data(x[train], y[train], x[val], y[val])

    def init_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))
