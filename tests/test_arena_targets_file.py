"""The committed ``targets.json``: each entry is what set-targets' procedure makes of its own numbers, and the
workloads read it.

set-targets takes the best algorithm by tuning metric, retrains its point over ``seeds`` seeds and sets the
target to the median of the seeds' best metrics; an entry edited by hand, or left from another run's figures,
breaks one of these relations."""
from __future__ import annotations

from statistics import median

import pytest

from gradwise.arena.targets import load_targets
from gradwise.arena.workloads import get_workload

TARGETS = load_targets()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_committed_target_is_the_median_over_seeds_of_the_best_algorithm_and_the_workload_uses_it(name):
    entry = TARGETS[name]
    w = get_workload(name)
    assert entry["metric"] == w.metric and w.target == entry["target"]
    assert len(entry["per_seed_best"]) == entry["seeds"] and entry["target"] == median(entry["per_seed_best"])
    best = (max if w.higher_is_better else min)(entry["tuning_best"].values())
    assert entry["tuning_best"][entry["algorithm"]] == best, entry["tuning_best"]
