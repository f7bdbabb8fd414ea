"""The quick suite's baselines reach lstsq_ill_conditioned's analytic target within its fitted budget.

A target no baseline reaches scores every submission as a miss; lstsq's budget was fitted so that the arena's
reference (torch.AdamW at its self-tuning point) reaches 1e-3 of L(0) (``workloads/lstsq.py``). These are real
trials on the quick suite's plan (its self-tuning budget, 1.5 x the step hint), with no time limit so the
machine's load cannot decide them. The other quick targets come from set-targets' tuned runs (targets.json).
"""
from __future__ import annotations

import pytest
import torch

from gradwise.arena.rulesets import plan, self_tuning_entry
from gradwise.arena.runner import run_trial
from gradwise.arena.suites import SUITES
from gradwise.arena.workloads import get_workload

WORKLOAD = "lstsq_ill_conditioned"


@pytest.mark.parametrize("optimizer", SUITES["quick"]["optimizers"])
def test_quick_baseline_reaches_lstsq_target_within_its_self_tuning_budget(optimizer):
    torch.set_num_threads(1)
    p = plan(self_tuning_entry(optimizer), WORKLOAD, studies=1, suite="quick", time_limit=False)[0]
    w = get_workload(WORKLOAD)
    assert p.spec["max_steps"] == round(1.5 * w.step_hint) and p.spec["target"] == w.target
    record = run_trial(w, optimizer, p.points[0], seed=p.seeds[0], target=p.spec["target"],
                       max_steps=p.spec["max_steps"], max_runtime=p.spec["max_runtime"])
    assert record["reached"], (optimizer, record["best_metric"], record["steps"])
    assert record["steps_to_target"] <= p.spec["max_steps"]
