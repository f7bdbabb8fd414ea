"""AlgoPerf scoring on hand-computed cases: ratios, profiles, scores, ties, misses, > 4x slower, speedups."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gradwise.arena import scoring

INF = math.inf

# Three submissions on two workloads. Best: w1 = 10 s (A), w2 = 10 s (B).
# A: ratios 1, 2.  B: 1.5, 1.  C: 50/10 = 5 > 4 -> inf, and a miss -> inf.
TIMES = {"A": {"w1": 10.0, "w2": 20.0}, "B": {"w1": 15.0, "w2": 10.0}, "C": {"w1": 50.0, "w2": INF}}


def test_ratios_by_hand():
    r = scoring.performance_ratios(TIMES)
    assert r == {"A": {"w1": 1.0, "w2": 2.0}, "B": {"w1": 1.5, "w2": 1.0}, "C": {"w1": INF, "w2": INF}}


def test_profile_by_hand():
    r = scoring.performance_ratios(TIMES)
    assert [scoring.profile(r["A"], t) for t in (1.0, 1.5, 1.99, 2.0, 4.0)] == [0.5, 0.5, 0.5, 1.0, 1.0]
    assert [scoring.profile(r["B"], t) for t in (1.0, 1.49, 1.5)] == [0.5, 0.5, 1.0]
    assert scoring.profile(r["C"], 4.0) == 0.0


def test_scores_by_hand():
    # A: ((4-1) + (4-2)) / (3 * 2) = 5/6;  B: ((4-1.5) + (4-1)) / 6 = 11/12;  C: 0.
    s = scoring.scores(TIMES)
    assert list(s) == ["B", "A", "C"]
    assert s["A"] == pytest.approx(5 / 6, abs=1e-12)
    assert s["B"] == pytest.approx(11 / 12, abs=1e-12)
    assert s["C"] == 0.0


def test_score_matches_algoperf_trapezoid_on_100_points():
    r = scoring.performance_ratios(TIMES)
    for name in r:
        taus, rho = scoring.profile_curve(r[name])
        trapz = float(np.trapezoid(rho, taus)) / 3.0
        assert abs(trapz - scoring.benchmark_score(r[name])) < 0.01


def test_tie_both_get_ratio_one():
    times = {"A": {"w": 7.0}, "B": {"w": 7.0}}
    assert scoring.scores(times) == {"A": 1.0, "B": 1.0}


def test_more_than_four_times_slower_counts_as_a_miss():
    slow = scoring.scores({"best": {"w": 1.0}, "slow": {"w": 4.01}, "missed": {"w": INF}})
    assert slow["slow"] == slow["missed"] == 0.0
    exactly4 = scoring.performance_ratios({"best": {"w": 1.0}, "x": {"w": 4.0}})
    assert exactly4["x"]["w"] == 4.0  # in the profile at tau = 4, adds no area
    assert scoring.profile(exactly4["x"], 4.0) == 1.0


def test_unreached_workload_counts_for_everyone_and_missing_workload_is_a_miss():
    times = {"A": {"w1": 2.0, "w2": INF}, "B": {"w1": 4.0}}
    r = scoring.performance_ratios(times)
    assert r["A"] == {"w1": 1.0, "w2": INF} and r["B"] == {"w1": 2.0, "w2": INF}
    s = scoring.scores(times)
    assert s["A"] == pytest.approx(3 / 6) and s["B"] == pytest.approx(2 / 6)


def test_workload_time_median_over_studies_of_fastest_trial():
    assert scoring.workload_time([[30.0, INF, 20.0], [INF, INF], [10.0]]) == 20.0
    assert scoring.workload_time([[INF], [INF], [5.0]]) == INF  # a majority of misses is a miss
    assert scoring.workload_time([[3.0], [1.0]]) == 2.0


def test_gmean_speedup_without_a_time_budget():
    """--no-time-limit: a miss has no finite time; the speedup is 0, inf, neutral or undefined."""
    budgets = {"w1": INF, "w2": INF}
    assert scoring.gmean_speedup({"w1": 2.0, "w2": INF}, {"w1": 8.0, "w2": INF}, budgets) == 2.0  # sqrt(4 x 1)
    assert scoring.gmean_speedup({"w1": 2.0, "w2": INF}, {"w1": 8.0, "w2": 3.0}, budgets) == 0.0
    assert scoring.gmean_speedup({"w1": 2.0, "w2": 5.0}, {"w1": 8.0, "w2": INF}, budgets) == INF
    assert math.isnan(scoring.gmean_speedup({"w1": INF, "w2": 5.0}, {"w1": 8.0, "w2": INF}, budgets))


def test_gmean_speedup_by_hand():
    # w1: 10 / 5 = 2;  w2: the miss becomes budget + 1 = 31 -> 20 / 31.
    got = scoring.gmean_speedup({"w1": 5.0, "w2": INF}, {"w1": 10.0, "w2": 20.0}, {"w1": 100, "w2": 30})
    assert got == pytest.approx(math.sqrt(2 * 20 / 31), rel=1e-12)
    assert scoring.gmean_speedup({"w": 3.0}, {"w": 3.0}, {"w": 9}) == 1.0


@pytest.mark.parametrize("call, text", [
    (lambda: scoring.performance_ratios({"A": {"w": -1.0}}), "A/w=-1.0"),
    (lambda: scoring.performance_ratios({"A": {"w": float("nan")}}), "A/w=nan"),
    (lambda: scoring.performance_ratios({"A": {"w": 1.0}}, r_max=1), "r_max=1"),
    (lambda: scoring.workload_time([]), "studies=[]"),
    (lambda: scoring.gmean_speedup({"w": 1.0}, {"w": 1.0}, {}), "no budget for workload 'w'"),
])
def test_bad_input(call, text):
    with pytest.raises(ValueError, match=text.replace("[", r"\[").replace("]", r"\]")):
        call()
