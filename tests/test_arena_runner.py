"""The arena's trial runner: peak resident memory is measured per trial, not per process."""
from __future__ import annotations

import sys

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
