"""On least squares with rotated ill-conditioning, Shampoo and SOAP reach a tight target in far fewer
steps than AdamW at any learning rate of the same grid (the full sweep: bench/convergence.py)."""
from __future__ import annotations

import pytest
import torch

import gradwise
from bench.convergence import LR_GRID, problem, steps_to_target

TARGET = 1e-6  # loss <= 1e-6 x initial loss
SPEEDUP = 4  # AdamW may not reach the target within 4x the steps Shampoo or SOAP needed


@pytest.mark.slow
def test_shampoo_and_soap_beat_adamw_tuned_on_the_grid():
    torch.set_num_threads(1)
    x, y, w0 = problem(32, 64, 256, 2.5, seed=0)
    # the matrix methods at one lr of the grid each (the sweep tunes them; here one suffices)
    shampoo = steps_to_target(lambda p: gradwise.Shampoo(p, lr=1.0, weight_decay=0.0, precondition_frequency=10),
                              x, y, w0, TARGET, 3000)
    soap = steps_to_target(lambda p: gradwise.SOAP(p, lr=0.03, weight_decay=0.0, precondition_frequency=10),
                           x, y, w0, TARGET, 3000)
    assert shampoo is not None and soap is not None
    budget = SPEEDUP * max(shampoo, soap)
    for lr in LR_GRID:
        adamw = steps_to_target(lambda p: gradwise.AdamW(p, lr=lr, weight_decay=0.0), x, y, w0, TARGET, budget)
        assert adamw is None, f"AdamW at lr={lr:g} reached the target in {adamw} steps (Shampoo {shampoo}, SOAP {soap})"
