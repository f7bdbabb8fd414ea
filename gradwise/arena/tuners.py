"""Multi-fidelity tuning for the external ruleset: which of a study's points get their whole step budget.

- ``halton``: every point trains its whole budget (AlgoPerf's quasi-random search; the default).
- ``hyperband``: Hyperband (Li et al. 2018, "Hyperband: A Novel Bandit-Based Approach to Hyperparameter
  Optimization"; LITERATURE.md ¶130) as Optuna's ``HyperbandPruner`` runs it, asynchronously: brackets of
  successive halving with reduction factor ``REDUCTION``, from one evaluation interval to the whole step budget.
  A trial reports its validation metric at every evaluation and stops at a rung where it is not in the top
  ``1 / REDUCTION`` of the trials of its bracket that reached that rung before it.
- ``one-epoch``: the one-epoch Top-K baseline ("Is One Epoch All You Need For Multi-Fidelity Hyperparameter
  Optimization?", ¶132): every point first trains one epoch of the training set (at most a tenth of the step
  budget: an epoch of the Shakespeare corpus is far longer than the budget), the first steps of its whole run
  (the learning-rate schedule is the whole budget's), then the ``K = ceil(n / REDUCTION)``
  best by the validation metric at the end of that screening train their whole budget, from scratch with the
  screening's seed. A study holds the ``n`` screening trials and ``K`` slots, each resolved to the next best
  screened point when a worker claims it (after every screening trial has finished, in any process).

The compute a tuner spends is its trials' steps (``tuner_steps``); the score is AlgoPerf's, from the trials that
reached the target (a screening or pruned trial that reached it counts as any other).
"""
from __future__ import annotations

import math
import time
from typing import Any

import optuna
from optuna.trial import TrialState

from gradwise.arena.workloads import Workload

TUNERS = ("halton", "hyperband", "one-epoch")
REDUCTION = 3
#: a one-epoch study's full-budget slot: the point ``{TOP: j}`` becomes the ``j``-th best screened point
TOP = "gradwise:top"
#: how often a worker holding a slot looks for screening trials still running elsewhere
POLL_S = 1.0


def check_tuner(tuner: str) -> str:
    if tuner not in TUNERS:
        raise ValueError(f"invalid tuner={tuner!r}: expected one of {', '.join(TUNERS)}")
    return tuner


def screen_steps(workload: Workload, max_steps: int) -> int:
    """The one-epoch tuner's screening budget: one epoch, at most a tenth of ``max_steps``, at least 1."""
    epoch = len(workload.data().train_x) // workload.batch_size
    return max(1, min(epoch, max_steps // 10))


def top_k(points: int) -> int:
    return max(1, math.ceil(points / REDUCTION))


def slots(k: int) -> list[dict[str, int]]:
    return [{TOP: j} for j in range(k)]


def oriented(workload: Workload, value: float) -> float:
    """A metric as Optuna's minimizing pruner compares it (accuracy negated; a non-finite one is the worst)."""
    value = -value if workload.higher_is_better else value
    return value if math.isfinite(value) else math.inf


class Pruning:
    """A hyperband trial's ``prune`` callback for ``run_trial``: report each evaluation, ask the pruner."""

    def __init__(self, storage: optuna.storages.BaseStorage, study: str, trial_id: int, workload: Workload,
                 max_steps: int) -> None:
        pruner = optuna.pruners.HyperbandPruner(min_resource=min(workload.eval_every, max_steps),
                                                max_resource=max_steps, reduction_factor=REDUCTION)
        self.trial = optuna.trial.Trial(optuna.load_study(study_name=study, storage=storage, pruner=pruner),
                                        trial_id)
        self.workload = workload

    def __call__(self, point: dict[str, Any]) -> bool:
        if self.workload.metric not in point:  # a diverged step: the trial stops on its own
            return False
        self.trial.report(oriented(self.workload, point[self.workload.metric]), point["step"])
        return self.trial.should_prune()


def resolve_slot(storage: optuna.storages.BaseStorage, study: str, slot: int, screened: int,
                 workload: Workload) -> tuple[dict[str, Any], int]:
    """The hyperparameters and seed of the ``slot``-th best of the ``screened`` screening trials (their final
    metric; ties go to the earlier trial), waiting for screening trials other workers still run."""
    study_id = storage.get_study_id_from_name(study)
    while True:
        trials = [t for t in storage.get_all_trials(study_id, deepcopy=False) if t.user_attrs["index"] < screened]
        if all(t.state == TrialState.COMPLETE for t in trials):
            break
        time.sleep(POLL_S)
    records = sorted((t.user_attrs["record"] for t in trials), key=lambda r: (
        oriented(workload, r["final_metric"]) if r["final_metric"] is not None else math.inf, r["seed"]))
    best = records[slot]
    return dict(best["hyperparameters"]), int(best["seed"])


def tuner_steps(records: list[dict[str, Any]]) -> int:
    """The training steps a study's trials took: the compute its tuner spent."""
    return sum(int(r["steps"]) for r in records)
