"""AlgoPerf's two tuning rulesets as study plans, and the loop that works through them.

- **self-tuning**: one fixed hyperparameter point per optimizer (``submissions.SELF_TUNING``), the same on every
  workload, with 1.5x the workload's step and time budget; one trial per study, ``studies`` studies (seeds).
- **external tuning**: ``trials`` points per study drawn by quasi-random Halton search through Optuna's
  ``QMCSampler`` (scrambled, seeded by the study index, so each study draws its own points), ``studies``
  studies; the workload's time is the median over studies of the fastest trial. A list-form space gives its
  first ``trials`` points to every study instead. ``external_entry`` tunes over the entry's shipped space.
  ``tuner`` (``gradwise.arena.tuners``) decides which of the points train their whole budget: all (``halton``),
  those Hyperband keeps (``hyperband``), or the Top-K after one epoch of each (``one-epoch``).

An entry is an optimizer with hyperparameters or a space, or an AlgoPerf submission file (``submission_entry``):
then its ``tuning_search_space.json`` makes it external, none self-tuning, and its trials run through
``algoperf_trial`` with ``step_hint`` = the workload's step hint times ``budget_scale``.

``workers_per_trial=N`` (``--workers-per-trial``) runs each trial on N gloo workers (``multiworker``): a recipe
data-parallel, or a low-communication entry (``low_comm``: DiLoCo, Streaming DiLoCo, DeMo, PowerSGD, which always
run on workers). The submission is then named ``NAME@N`` and scored on the measured time plus the simulated
``link``'s cost of its collectives (``gradwise.arena.link``). Self-tuning or external: a low-communication
entry's space is over its inner optimizer's keys and its method's (``low_comm.check_space``).
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from gradwise.arena import low_comm
from gradwise.arena.algoperf_submission import (
    algoperf_imports,
    batch_size,
    check_file,
    file_sha256,
    find_search_space,
    load_space,
    load_submission,
    submission_name,
)
from gradwise.arena.algoperf_trial import run_submission_trial
from gradwise.arena.link import Link
from gradwise.arena.multiworker import run_workers_trial
from gradwise.arena.runner import run_trial
from gradwise.arena.shipped_spaces import shipped_space
from gradwise.arena.store import Claimed, Store
from gradwise.arena.submissions import check_hyperparameters, check_search_space, self_tuning_point
from gradwise.arena.tuners import TOP, Pruning, check_tuner, resolve_slot, screen_steps, slots, top_k
from gradwise.arena.workloads import Workload, get_workload

SELF_TUNING_BUDGET = 1.5
RULESETS = ("self", "external")


@dataclass
class Entry:
    """A submission: a display name, the optimizer, and either fixed hyperparameters or a search space; or an
    AlgoPerf submission file (``module``) with its search space or none."""

    name: str
    optimizer: str
    hyperparameters: dict[str, Any] | None = None
    space: dict[str, dict] | list[dict[str, Any]] | None = None
    module: str | None = None

    @property
    def ruleset(self) -> str:
        return "external" if self.space is not None else "self"


def self_tuning_entry(optimizer: str) -> Entry:
    """The entry at its self-tuning point (``submissions.SELF_TUNING``; a variant at its recipe's; a
    low-communication entry at ``low_comm.self_tuning_point``)."""
    if low_comm.parse(optimizer) is not None:
        return Entry(optimizer, optimizer, hyperparameters=low_comm.self_tuning_point(optimizer))
    return Entry(optimizer, optimizer, hyperparameters=self_tuning_point(optimizer))


def external_entry(optimizer: str) -> Entry:
    """The entry tuned over its shipped search space (``shipped_spaces``; a variant over its recipe's)."""
    return Entry(optimizer, optimizer, space=shipped_space(optimizer))


def submission_entry(path: str | Path, search_space: str | Path | None = None, workloads: list[str] = ()) -> Entry:
    """An AlgoPerf submission file; its search space is ``search_space`` or ``tuning_search_space.json`` beside
    it (external tuning), or none (self-tuning). The file is loaded and its functions and its batch size for
    each of ``workloads`` are checked now, before any study is written."""
    path = check_file(path)
    with algoperf_imports():
        module = load_submission(path)
        for w in workloads:
            batch_size(module, path, w)
    space_file = Path(search_space) if search_space else find_search_space(path)
    space = load_space(space_file) if space_file is not None else None
    return Entry(submission_name(path), f"algoperf:{path.name}", space=space, module=str(path))


@dataclass
class StudyPlan:
    name: str
    entry: Entry
    workload: str
    spec: dict[str, Any]
    points: list[dict[str, Any]]
    seeds: list[int]
    distributions: dict[str, BaseDistribution] = field(default_factory=dict)


def distributions(space: dict[str, dict]) -> dict[str, BaseDistribution]:
    result: dict[str, BaseDistribution] = {}
    for key, spec in sorted(space.items()):
        if "feasible_points" in spec:
            result[key] = CategoricalDistribution(spec["feasible_points"])
        else:
            result[key] = FloatDistribution(spec["min"], spec["max"], log=spec.get("scaling") == "log")
    return result


def halton_points(space: dict[str, dict], n: int, seed: int) -> list[dict[str, Any]]:
    """The first ``n`` points of a scrambled Halton sequence over ``space``, drawn by Optuna's QMCSampler."""
    dists = distributions(space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.QMCSampler(qmc_type="halton", scramble=True, seed=seed)
    study = optuna.create_study(sampler=sampler)  # in memory: only holds the sampler's sequence counter
    return [sampler.sample_relative(study, None, dists) for _ in range(n)]


def plan(entry: Entry, workload: str, *, studies: int, trials: int = 1, budget_scale: float = 1.0,
         suite: str = "custom", target: float | None = None, self_tuning_budget: bool = True,
         time_limit: bool = True, tuner: str = "halton", workers_per_trial: int = 1,
         link: Link | None = None) -> list[StudyPlan]:
    """The studies one submission runs on one workload (``target`` overrides the workload's). Without
    ``time_limit`` a trial runs its whole step budget however long it takes (target setting: its results must
    not depend on the machine's load). ``tuner`` other than ``halton`` needs an optimizer with a search space.
    ``workers_per_trial`` > 1, or a low-communication entry, runs each trial on that many gloo workers with the
    simulated ``link`` (default ``Link()``: 1 Gbit/s)."""
    if studies < 1 or trials < 1:
        raise ValueError(f"invalid studies={studies!r}, trials={trials!r}: expected >= 1")
    on_workers = workers_per_trial != 1 or low_comm.parse(entry.optimizer) is not None
    if on_workers:
        entry = _on_workers(entry, workers_per_trial, tuner)
    if check_tuner(tuner) != "halton" and (entry.space is None or entry.module is not None):
        raise ValueError(f"invalid tuner={tuner!r} for {entry.name!r}: a multi-fidelity tuner chooses among the"
                         " points of an optimizer's search space (external tuning); a self-tuning entry or an"
                         " AlgoPerf submission file runs tuner='halton'")
    if not budget_scale > 0:
        raise ValueError(f"invalid budget_scale={budget_scale!r}: expected > 0")
    w = get_workload(workload)
    target = w.check_target(w.target if target is None else target)
    scale = budget_scale * (SELF_TUNING_BUDGET if entry.ruleset == "self" and self_tuning_budget else 1.0)
    max_steps = max(1, round(w.step_hint * scale))
    max_runtime = w.max_runtime * scale if time_limit else math.inf
    result = []
    for j in range(studies):
        if entry.space is not None:
            check_search_space(None if entry.module else entry.optimizer, entry.space)
            if isinstance(entry.space, list):  # AlgoPerf's list form: the first `trials` points
                points, dists = [dict(p) for p in entry.space[:trials]], {}
            else:
                points, dists = halton_points(entry.space, trials, seed=j), distributions(entry.space)
        else:
            if low_comm.parse(entry.optimizer) is not None:
                low_comm.check_hyperparameters(entry.optimizer, entry.hyperparameters or {})
            elif entry.module is None:
                check_hyperparameters(entry.optimizer, entry.hyperparameters or {})
            points, dists = [dict(entry.hyperparameters or {})], {}
        spec = {"suite": suite, "ruleset": entry.ruleset, "submission": entry.name, "optimizer": entry.optimizer,
                "workload": workload, "study": j, "trials": len(points), "target": target,
                "metric": w.metric, "max_steps": max_steps, "max_runtime": max_runtime,
                "space": entry.space, "hyperparameters": entry.hyperparameters}
        if entry.module is not None:  # a changed file is another submission: a resumed run refuses it
            spec.update(module=entry.module, sha256=file_sha256(entry.module),
                        step_hint=max(1, round(w.step_hint * budget_scale)))
        if on_workers:  # a single-worker spec stays as it was, so older stores resume
            link = link or Link()
            spec.update(workers_per_trial=workers_per_trial, link_bandwidth=link.bandwidth,
                        link_latency=link.latency)
        if tuner != "halton":  # halton's spec stays as it was, so stores made before tuners resume
            spec["tuner"] = tuner
        if tuner == "one-epoch":
            spec.update(screen_steps=screen_steps(w, max_steps), screened=len(points))
            points = points + slots(top_k(len(points)))
        name = f"{suite}/{entry.ruleset}/{entry.name}/{workload}/study{j}"
        seeds = [1000 * j + i for i in range(len(points))]
        result.append(StudyPlan(name, entry, workload, spec, points, seeds, dists))
    return result


def work(store: Store, plans: list[StudyPlan], *, threads: int = 1,
         on_trial: Callable[[StudyPlan, Claimed | None, dict | None], None] | None = None,
         on_eval: Callable[[dict], None] | None = None) -> int:
    """Prepare every study, then run waiting trials until none is left; returns the trials this worker ran.
    Safe to run in several processes at once against one store."""
    for p in plans:
        store.prepare(p.name, p.spec, p.points, p.seeds, p.distributions)
        store.recover(p.name)
    workloads: dict[str, Workload] = {}
    ran = 0
    for p in plans:
        w = workloads.setdefault(p.workload, get_workload(p.workload))
        while (claimed := store.claim(p.name)) is not None:
            if on_trial is not None:
                on_trial(p, claimed, None)
            budget = {"seed": claimed.seed, "target": p.spec["target"], "max_steps": p.spec["max_steps"],
                      "max_runtime": p.spec["max_runtime"], "threads": threads, "on_eval": on_eval}
            try:
                if "workers_per_trial" in p.spec:
                    record = run_workers_trial(
                        p.workload, p.entry.optimizer, claimed.hyperparameters, workers=p.spec["workers_per_trial"],
                        link=Link(p.spec["link_bandwidth"], p.spec["link_latency"]), **budget)
                elif p.entry.module is not None:
                    point = claimed.hyperparameters if p.entry.space is not None else None  # self-tuning: None
                    record = run_submission_trial(w, p.entry.module, point, step_hint=p.spec["step_hint"], **budget)
                else:
                    budget = _tuned(budget, store, p, claimed, w)  # first: a one-epoch slot resolves its point
                    record = run_trial(w, p.entry.optimizer, claimed.hyperparameters, **budget)
            except BaseException as error:
                state = TrialState.WAITING if isinstance(error, KeyboardInterrupt) else TrialState.FAIL
                store.storage.set_trial_user_attr(claimed.trial_id, "error", repr(error))
                store.storage.set_trial_state_values(claimed.trial_id, state)
                raise
            record.update({"study": p.name, "study_index": p.spec["study"], "index": claimed.index,
                           "submission": p.entry.name, "ruleset": p.entry.ruleset})
            store.finish(claimed, json.loads(json.dumps(record)), p.distributions)
            ran += 1
            if on_trial is not None:
                on_trial(p, claimed, record)
    return ran


def _on_workers(entry: Entry, workers: int, tuner: str) -> Entry:
    """``entry`` as a multi-worker submission, ``NAME@N`` (``NAME@N{point}``); checked first."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"invalid workers_per_trial={workers!r}: expected an int >= 1 (gloo workers per trial)")
    if entry.module is not None or tuner != "halton":
        what = "an AlgoPerf submission file" if entry.module is not None else f"tuner={tuner!r}"
        raise ValueError(f"invalid workers_per_trial={workers} for {entry.name!r}: {what} runs in one process;"
                         " multi-worker trials run an optimizer entry (a point or a search space) with"
                         " tuner='halton'")
    head, brace, point = entry.name.partition("{")  # a --hyperparameters entry: NAME@N{point}
    return replace(entry, name=f"{head}@{workers}{brace}{point}")


def _tuned(budget: dict[str, Any], store: Store, p: StudyPlan, claimed: Claimed, w: Workload) -> dict[str, Any]:
    """``budget`` as the study's tuner sets it for this trial: Hyperband's pruning callback; one-epoch's
    screening budget, or a slot's point and seed (``claimed`` is updated, so the trial is recorded as run)."""
    tuner = p.spec.get("tuner", "halton")
    if tuner == "hyperband":
        return {**budget, "prune": Pruning(store.storage, p.name, claimed.trial_id, w, p.spec["max_steps"])}
    if tuner == "one-epoch":
        if TOP not in claimed.hyperparameters:
            return {**budget, "stop_after": p.spec["screen_steps"]}
        point, seed = resolve_slot(store.storage, p.name, claimed.hyperparameters[TOP], p.spec["screened"], w)
        claimed.hyperparameters, claimed.seed = point, seed
        return {**budget, "seed": seed}
    return budget
