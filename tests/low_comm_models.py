"""Models shared by the low-communication tests (DiLoCo, DeMo; 2 and 4 gloo ranks), and their checkpoint
round trip through ``torch.distributed.checkpoint``."""
from __future__ import annotations

import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

#: DeMo's final-step variants every DeMo reference test runs: (label, keyword arguments)
DEMO_VARIANTS = (("signum, weight decay", {"weight_decay": 0.1, "sign": True}),
                 ("q itself", {"weight_decay": 0.0, "sign": False}),
                 ("Adam-like final step", {"weight_decay": 0.1, "sign": False, "adam_beta2": 0.99}))


class IntegerQuadratic(torch.nn.Module):
    """``0.5 |w - t|^2`` with integer weights and targets: with lr 0.5 every step's arithmetic is exact."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randint(-8, 9, (3, 4), generator=g).float())
        self.b = torch.nn.Parameter(torch.randint(-8, 9, (5,), generator=g).float())


def integer_quadratic_backward(model, step: int, rank: int) -> None:
    """The gradient of ``IntegerQuadratic`` toward integer targets drawn from the step and the rank."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    loss = sum(0.5 * (p - torch.randint(-8, 9, p.shape, generator=g).float()).square().sum()
               for p in model.parameters())
    loss.backward()


class ConvNet(torch.nn.Module):
    """A 3-d weight (4, 2, 3), vectors, and matrices whose dims DeMo's chunk does not divide."""

    def __init__(self, dtype=torch.float64):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(2, 4, 3).to(dtype)
        self.out = torch.nn.Linear(12, 3).to(dtype)

    def forward(self, x):
        return self.out(torch.tanh(self.conv(x)).flatten(1))


def dcp_round_trip(key: str, directory: str, saved: tuple, fresh: tuple) -> None:
    """``saved``, a ``(model, optimizer)`` pair, saved with ``torch.distributed.checkpoint`` under ``key`` (each
    worker's own, or its group's: their states differ) and loaded into ``fresh``, another pair, in place
    (DCP loads into the fresh state_dicts, which are then loaded into the pair); every rank waits for the others,
    then rank 0 removes ``directory``."""
    (model, optimizer), (fresh_model, fresh_optimizer) = saved, fresh
    dcp.save({key: {"model": model.state_dict(), "optimizer": optimizer.state_dict()}}, checkpoint_id=directory)
    target = {key: {"model": fresh_model.state_dict(), "optimizer": fresh_optimizer.state_dict()}}
    dcp.load(target, checkpoint_id=directory)
    fresh_model.load_state_dict(target[key]["model"])
    fresh_optimizer.load_state_dict(target[key]["optimizer"])
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(directory)
