"""The ``Workload`` interface: data, model, loss, evaluation, target, budget, batch size and eval period.

A workload is fixed by its name: the data split, the model's architecture and the target are not up to the
submission. ``init_model(seed)`` and the batch order (``batches``) depend only on the trial's seed, so a trial
is reproducible step by step on the same machine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Data:
    """Tensors for training and validation (inputs, targets)."""

    train_x: Tensor
    train_y: Tensor
    val_x: Tensor
    val_y: Tensor


class Workload:
    """Base class. Subclasses set the class attributes and implement ``make_data`` and ``init_model``.

    Attributes:
        name: the registry name.
        metric: the validation metric compared with ``target`` (``"accuracy"``, ``"loss"``, ``"mse"``).
        higher_is_better: whether the target is reached from below (accuracy) or above (losses).
        target: the validation target; the committed ``targets.json`` overrides this draft value.
        step_hint: the step budget (AlgoPerf's max steps); self-tuning gets 1.5x.
        max_runtime: the training-time budget in seconds on 2 CPU cores (self-tuning gets 1.5x).
        batch_size: the default batch size.
        eval_every: steps between (untimed) evaluations.
        loss_type: AlgoPerf's loss type, for the record.
        floor: the best value a loss-like metric can take; a target at or below it is refused.
        analytic_target: the target follows from the problem itself, so ``set-targets`` leaves it alone.
    """

    name: str = ""
    description: str = ""
    metric: str = "loss"
    higher_is_better: bool = False
    target: float = 0.0
    step_hint: int = 1000
    max_runtime: float = 60.0
    batch_size: int = 64
    eval_every: int = 50
    loss_type: str = "softmax_cross_entropy"
    eval_batch_size: int = 4096
    floor: float = 0.0  # the best value a loss-like metric can take (e.g. the label-noise variance)
    analytic_target: bool = False  # the target follows from the problem (e.g. a known optimum), not from tuning

    def __init__(self) -> None:
        self._data: Data | None = None

    # -- data -------------------------------------------------------------------------------------------
    def make_data(self) -> Data:
        raise NotImplementedError

    def data(self) -> Data:
        """The fixed split, built once per process."""
        if self._data is None:
            self._data = self.make_data()
        return self._data

    def batches(self, batch_size: int, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
        """Endless shuffled minibatches (without replacement within an epoch), seeded by the trial."""
        data = self.data()
        n = data.train_x.shape[0]
        generator = torch.Generator().manual_seed(seed)
        while True:
            order = torch.randperm(n, generator=generator)
            for start in range(0, n - batch_size + 1, batch_size):
                index = order[start:start + batch_size]
                yield data.train_x[index], data.train_y[index]

    # -- model, loss, evaluation ------------------------------------------------------------------------
    def init_model(self, seed: int) -> nn.Module:
        raise NotImplementedError

    def loss(self, output: Tensor, y: Tensor) -> Tensor:
        return nn.functional.cross_entropy(output, y)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Validation loss and metric over the whole validation split, in eval mode."""
        data = self.data()
        was_training = model.training
        model.eval()
        total_loss, correct, n = 0.0, 0, data.val_x.shape[0]
        for start in range(0, n, self.eval_batch_size):
            x, y = data.val_x[start:start + self.eval_batch_size], data.val_y[start:start + self.eval_batch_size]
            out = model(x)
            total_loss += float(self.loss(out, y)) * x.shape[0]
            if self.metric == "accuracy":
                correct += int((out.argmax(-1) == y).sum())
        model.train(was_training)
        result = {"loss": total_loss / n}
        if self.metric == "accuracy":
            result["accuracy"] = correct / n
        if self.metric == "mse":
            result["mse"] = result["loss"]
        return result

    def check_target(self, target: float) -> float:
        """The target, if some model could reach it: accuracy in (0, 1], a loss above ``floor``. A target of
        +-inf (no target: train the whole budget, as target setting does) is allowed too."""
        target = float(target)
        if math.isinf(target):
            return target
        ok = 0 < target <= 1 if self.metric == "accuracy" else target > self.floor
        if not ok:
            allowed = "0 < target <= 1" if self.metric == "accuracy" else f"target > {self.floor:g} (the floor)"
            raise ValueError(f"unreachable target={target!r} for workload {self.name!r} ({self.metric}):"
                             f" expected {allowed}")
        return target

    def reached(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target

    def describe(self) -> dict:
        return {"name": self.name, "metric": self.metric, "higher_is_better": self.higher_is_better,
                "target": self.target, "step_hint": self.step_hint, "max_runtime": self.max_runtime,
                "batch_size": self.batch_size, "eval_every": self.eval_every, "loss_type": self.loss_type}
