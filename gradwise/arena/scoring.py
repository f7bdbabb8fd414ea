"""AlgoPerf scoring: per-workload times, performance ratios, profiles, the benchmark score and the speedup.

Pure functions on plain floats (no torch, no numpy), following AlgoPerf's rules (Dahl et al. 2023,
arXiv:2306.07179, and its ``scoring/performance_profile.py``):

- per-workload time ``t_{s,w}`` = median over studies of the fastest trial of each study; a miss is ``inf``
  and takes part in the median;
- performance ratio ``r_{s,w} = t_{s,w} / min_s' t_{s',w}``; a time more than ``r_max`` times the best counts
  as ``inf`` (worth exactly as much as a miss), and a workload nobody reached is ``inf`` for everyone;
- profile ``rho_s(tau) = |{w : r_{s,w} <= tau}| / n``;
- benchmark score ``B_s = 1/(r_max - 1) * integral_1^r_max rho_s(tau) dtau``. The profile is a step function,
  so the integral is exact: each workload with ratio r <= r_max adds (r_max - r) / ((r_max - 1) n).
  (AlgoPerf integrates 100 sample points with the trapezoid rule; the exact area differs from it by < 1/100.)
- geometric-mean speedup against a reference submission: ``gmean_w(t_ref,w / t_s,w)``, with a miss replaced
  by ``budget + 1`` as in AlgoPerf's ``compute_speedups.py``.
"""
from __future__ import annotations

import math
from statistics import median
from typing import Mapping, Sequence

INF = math.inf
R_MAX = 4.0

Times = Mapping[str, Mapping[str, float]]  # submission -> workload -> seconds (inf: missed)


def _check_time(name: str, t: float) -> float:
    t = float(t)
    if math.isnan(t) or t <= 0:
        raise ValueError(f"invalid time {name}={t!r}: expected a positive number of seconds or inf (a miss)")
    return t


def workload_time(studies: Sequence[Sequence[float]]) -> float:
    """Median over studies of the fastest trial in each study (``inf`` for a study with no hit)."""
    if not studies:
        raise ValueError("invalid studies=[]: expected at least one study of trial times")
    best = [min((_check_time("trial time", t) for t in trials), default=INF) for trials in studies]
    return float(median(best))


def performance_ratios(times: Times, r_max: float = R_MAX) -> dict[str, dict[str, float]]:
    """``r_{s,w}`` for every submission and every workload any submission entered; a workload a submission
    did not run is a miss. Ratios above ``r_max`` become ``inf``."""
    if r_max <= 1:
        raise ValueError(f"invalid r_max={r_max!r}: expected a number > 1")
    workloads = sorted({w for per in times.values() for w in per})
    best = {w: min((_check_time(f"{s}/{w}", per[w]) for s, per in times.items() if w in per), default=INF)
            for w in workloads}
    ratios: dict[str, dict[str, float]] = {}
    for s, per in times.items():
        ratios[s] = {}
        for w in workloads:
            t = per.get(w, INF)
            r = t / best[w] if math.isfinite(best[w]) else INF
            ratios[s][w] = r if r <= r_max else INF
    return ratios


def profile(ratios: Mapping[str, float], tau: float) -> float:
    """``rho(tau)``: the fraction of workloads whose ratio is at most ``tau``."""
    if not ratios:
        raise ValueError("invalid ratios={}: expected at least one workload")
    return sum(r <= tau for r in ratios.values()) / len(ratios)


def profile_curve(ratios: Mapping[str, float], r_max: float = R_MAX, points: int = 100) -> tuple[list, list]:
    """``(taus, rho)`` sampled on ``points`` evenly spaced values of tau in [1, r_max], for plots."""
    taus = [1 + (r_max - 1) * i / (points - 1) for i in range(points)]
    return taus, [profile(ratios, t) for t in taus]


def benchmark_score(ratios: Mapping[str, float], r_max: float = R_MAX) -> float:
    """The normalized area under the profile on [1, r_max], computed exactly."""
    if not ratios:
        raise ValueError("invalid ratios={}: expected at least one workload")
    area = sum(r_max - r for r in ratios.values() if r <= r_max)
    return area / ((r_max - 1) * len(ratios))


def scores(times: Times, r_max: float = R_MAX) -> dict[str, float]:
    """Benchmark score of every submission, best first."""
    ratios = performance_ratios(times, r_max)
    result = {s: benchmark_score(r, r_max) for s, r in ratios.items()}
    return dict(sorted(result.items(), key=lambda kv: -kv[1]))


def gmean_speedup(times: Mapping[str, float], reference: Mapping[str, float],
                  budgets: Mapping[str, float]) -> float:
    """Geometric mean over the reference's workloads of ``t_ref / t_s``; a miss (either side) counts as
    ``budget + 1`` seconds. Above 1: faster than the reference. Without a time budget (``inf``, a run with
    ``--no-time-limit``) a miss has no finite time: both missing counts as a ratio of 1, the submission alone
    missing makes the speedup 0, the reference alone missing makes it ``inf`` (and both, on two workloads,
    ``nan``: no speedup is defined)."""
    if not reference:
        raise ValueError("invalid reference={}: expected at least one workload")
    logs, unbounded = [], set()
    for w, t_ref in reference.items():
        if w not in budgets:
            raise ValueError(f"invalid budgets: no budget for workload {w!r}; have {sorted(budgets)}")
        cap = float(budgets[w]) + 1
        t_s = times.get(w, INF)
        t_ref, t_s = (min(_check_time(w, t), cap) for t in (t_ref, t_s))
        if t_ref == t_s == INF:
            logs.append(0.0)
        elif INF in (t_ref, t_s):
            unbounded.add(INF if t_ref == INF else 0.0)
        else:
            logs.append(math.log(t_ref / t_s))
    if unbounded:
        return unbounded.pop() if len(unbounded) == 1 else math.nan
    return math.exp(sum(logs) / len(logs))
