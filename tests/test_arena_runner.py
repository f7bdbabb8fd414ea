"""The arena's trial runner: peak resident memory is measured per trial, not per process; the clock counts
training only, never evaluation."""
from __future__ import annotations

import sys
import time

import pytest
import torch
from torch import nn

from gradwise.arena.runner import run_trial
from gradwise.arena.workloads.lstsq import LstsqIllConditioned

BIG = 256 * 2**20  # bytes the hungry trial's model touches on every forward pass


class Hungry(nn.Module):
    """A linear model whose forward pass also fills (and frees) a BIG-byte tensor."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        scratch = torch.ones(BIG // 4)  # written, so its pages are resident
        return self.inner(x) + 0 * scratch[0]


class HungryLstsq(LstsqIllConditioned):
    def init_model(self, seed: int) -> nn.Module:
        return Hungry(super().init_model(seed))


def _trial(workload) -> dict:
    return run_trial(workload, "SGD", {"lr": 0.1}, seed=0, target=float("-inf"), max_steps=3, max_runtime=60.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM can be reset on Linux only")
def test_peak_memory_is_per_trial_in_one_process():
    plain, hungry = LstsqIllConditioned(), HungryLstsq()
    plain.data(), hungry.data()  # both datasets resident before either trial, so only the scratch differs
    big = _trial(hungry)  # the hungry trial first: a per-process peak would carry over to the next trial
    small = _trial(plain)
    assert big["peak_rss_scope"] == small["peak_rss_scope"] == "trial"
    assert big["peak_rss_mb"] - small["peak_rss_mb"] > 0.8 * BIG / 2**20
    assert big["peak_rss_mb"] - big["rss_start_mb"] > 0.8 * BIG / 2**20
    assert small["peak_rss_mb"] - small["rss_start_mb"] < 0.2 * BIG / 2**20


class SlowEvalLstsq(LstsqIllConditioned):
    """Evaluates every 2 steps, and each evaluation also burns CPU for EVAL_S seconds; it stamps its own start
    and end on the wall clock and the process CPU clock, the clocks the runner times training with."""

    eval_every = 2
    EVAL_S = 0.03

    def __init__(self):
        super().__init__()
        self.stamps: list[tuple[float, float, float, float]] = []  # wall start, wall end, cpu start, cpu end

    def evaluate(self, model):
        wall, cpu = time.perf_counter(), time.process_time()
        result = super().evaluate(model)
        while time.perf_counter() < wall + self.EVAL_S:
            sum(range(1000))
        self.stamps.append((wall, time.perf_counter(), cpu, time.process_time()))
        return result


def test_evaluation_is_not_counted_in_the_training_time():
    """Between two evaluations the clock may only advance by time spent outside both of them: each clock's
    advance is at most the gap between the end of one evaluation and the start of the next, as both clocks
    measured it (no threshold: the inequalities hold however loaded the machine is, and any evaluation time
    added to the clock breaks them by that evaluation's own duration)."""
    workload = SlowEvalLstsq()
    workload.data()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    record = run_trial(workload, "SGD", {"lr": 0.1}, seed=0, target=float("-inf"), max_steps=6, max_runtime=60.0)
    curve, stamps = record["curve"], workload.stamps
    assert [p["step"] for p in curve] == [2, 4, 6] and len(stamps) == 3
    starts = [(wall0, cpu0)] + [(s[1], s[3]) for s in stamps]  # where each clock may start advancing again
    for point, (wall_free, cpu_free), previous, stamp in zip(curve, starts, [{"time": 0.0, "cpu_time": 0.0}]
                                                              + curve, stamps):
        assert point["time"] - previous["time"] <= stamp[0] - wall_free + 1e-9, point
        assert point["cpu_time"] - previous["cpu_time"] <= stamp[2] - cpu_free + 1e-9, point
    assert record["train_time"] == curve[-1]["time"] and record["cpu_time"] == curve[-1]["cpu_time"]


class KeptLstsq(LstsqIllConditioned):
    """Keeps the trial's model, and a copy of its weights at each evaluation."""

    eval_every = 2

    def __init__(self):
        super().__init__()
        self.model, self.evaluated = None, []

    def init_model(self, seed: int) -> nn.Module:
        self.model = super().init_model(seed)
        return self.model

    def evaluate(self, model):
        self.evaluated.append([p.detach().clone() for p in model.parameters()])
        return super().evaluate(model)


@pytest.mark.parametrize("optimizer, hyperparameters", [
    ("ScheduleFreeAdamW", {"lr": 0.01, "warmup_factor": 0.0}),
    ("AdamW", {"lr": 0.01}),
])
def test_evaluation_runs_at_the_optimizers_evaluation_point(optimizer, hyperparameters):
    """Schedule-Free takes gradients at y and is evaluated at x: the runner evaluates in eval mode and trains on
    in train mode. The same 4 steps replayed by hand, with the trial's switches after steps 2 and 4, give the
    weights each evaluation saw, and the trial ends at its last evaluation's point. For Schedule-Free that
    point is not the training weights; for AdamW the two points are the same weights."""
    from gradwise.arena.submissions import build_optimizer

    workload = KeptLstsq()
    run_trial(workload, optimizer, hyperparameters, seed=0, target=float("-inf"), max_steps=4, max_runtime=60.0)
    ended = [p.detach().clone() for p in workload.model.parameters()]
    assert all(torch.equal(p, q) for p, q in zip(workload.evaluated[-1], ended))
    model = workload.init_model(0)
    opt, schedule = build_optimizer(optimizer, hyperparameters, model.parameters(), 4)
    batches = workload.batches(workload.batch_size, 0)
    for step in range(1, 5):
        opt.train()
        x, y = next(batches)
        loss = workload.loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
        if step % 2 == 0:
            training = [p.detach().clone() for p in model.parameters()]
            opt.eval()
            evaluated = workload.evaluated[step // 2 - 1]
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), evaluated)), step
            moved = not all(torch.equal(p, q) for p, q in zip(evaluated, training))
            assert moved == (optimizer == "ScheduleFreeAdamW")


class Named(nn.Module):
    """lstsq's linear model under a module name: ``head`` (an output head by Muon's rule) or ``body``."""

    def __init__(self, inner: nn.Module, name: str):
        super().__init__()
        self.add_module(name, inner)
        self.name = name

    def forward(self, x):
        return getattr(self, self.name)(x)


class NamedLstsq(LstsqIllConditioned):
    def __init__(self, name: str):
        super().__init__()
        self.module_name = name

    def init_model(self, seed: int) -> nn.Module:
        return Named(super().init_model(seed), self.module_name)


def test_the_optimizer_gets_the_parameters_names():
    """Muon keeps heads and embeddings on AdamW by name (the authors' split): a trial hands it named parameters, so
    the 1 x 100 weight named ``head.weight`` holds AdamW's two moments, and the same weight as ``body.weight``
    one momentum, on Muon's rule."""
    def state_bytes(name: str) -> int:
        record = run_trial(NamedLstsq(name), "Muon", {"lr": 0.01}, seed=0, target=float("-inf"), max_steps=2,
                           max_runtime=60.0)
        return record["state_bytes"]

    head, body = state_bytes("head"), state_bytes("body")
    assert head - body == 100 * 4, (head, body)
