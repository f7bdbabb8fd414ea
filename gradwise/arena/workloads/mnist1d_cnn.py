"""``mnist1d_cnn``: MNIST-1D (Greydanus, 2020) generated procedurally by the ``mnist1d`` package, 1-D CNN.

20,000 samples from ``mnist1d.data.make_dataset`` with the package's default arguments and seed 42
(16,000 train / 4,000 validation); nothing is downloaded. The generated arrays are cached as .npz under the
arena cache directory together with their sha256, which the trial record carries.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import nn

from gradwise.arena.workloads.base import Data, Workload
from gradwise.arena.workloads.cache import cache_dir

SAMPLES = 20_000


class MNIST1DCNN(Workload):
    name = "mnist1d_cnn"
    description = "MNIST-1D (20k procedurally generated, 16k/4k), 3 x conv1d(64) + fc, val accuracy"
    metric = "accuracy"
    higher_is_better = True
    target = 0.95
    step_hint = 3000
    max_runtime = 180.0
    batch_size = 128
    eval_every = 100
    loss_type = "softmax_cross_entropy"
    samples = SAMPLES

    def make_data(self) -> Data:
        path = cache_dir() / f"mnist1d_{self.samples}_seed42.npz"
        if not path.exists():
            from mnist1d.data import get_dataset_args, make_dataset

            args = get_dataset_args()
            args.num_samples, args.seed = self.samples, 42
            d = make_dataset(args)
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, x=d["x"], y=d["y"], x_test=d["x_test"], y_test=d["y_test"])
            tmp.replace(path)
        d = np.load(path)
        self.sha256 = hashlib.sha256(b"".join(np.ascontiguousarray(d[k]).tobytes()
                                              for k in ("x", "y", "x_test", "y_test"))).hexdigest()
        f = lambda a: torch.tensor(a, dtype=torch.float32).unsqueeze(1)  # noqa: E731
        return Data(f(d["x"]), torch.tensor(d["y"], dtype=torch.long),
                    f(d["x_test"]), torch.tensor(d["y_test"], dtype=torch.long))

    def init_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Conv1d(1, 64, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv1d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv1d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(64 * 5, 10))
