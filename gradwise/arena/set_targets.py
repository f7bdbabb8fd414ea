"""Target setting the AlgoPerf way, scaled down: tune AdamW, NAdamW, SGD with Nesterov momentum and heavy-ball
momentum (``trials`` Halton points each, the whole step budget, no target), take the best algorithm and point
by best validation metric, retrain it over ``seeds`` seeds, and set the target to the median over seeds of the
best validation metric. Every trial runs its whole step budget with no time limit, so the targets depend on the
step budget and the seeds, not on the machine's load. Results go to ``targets.json`` with the date, machine and
thread count."""
from __future__ import annotations

import json
import math
import multiprocessing
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from typing import Any, Callable

from gradwise.arena.rulesets import Entry, plan, work
from gradwise.arena.store import Store
from gradwise.arena.targets import TARGETS_FILE, load_targets
from gradwise.arena.workloads import get_workload

#: The four target-setting algorithms and their search spaces (after AlgoPerf's paper baselines).
TARGET_SETTERS: dict[str, tuple[str, dict[str, dict]]] = {
    "AdamW": ("AdamW", {"lr": {"min": 3e-4, "max": 1e-2, "scaling": "log"},
                        "one_minus_beta1": {"min": 0.02, "max": 0.2, "scaling": "log"},
                        "weight_decay": {"min": 1e-3, "max": 0.3, "scaling": "log"},
                        "warmup_factor": {"feasible_points": [0.02, 0.05, 0.1]}}),
    "NAdamW": ("NAdamW", {"lr": {"min": 3e-4, "max": 1e-2, "scaling": "log"},
                          "one_minus_beta1": {"min": 0.02, "max": 0.2, "scaling": "log"},
                          "weight_decay": {"min": 1e-3, "max": 0.3, "scaling": "log"},
                          "warmup_factor": {"feasible_points": [0.02, 0.05, 0.1]}}),
    "Nesterov": ("SGD", {"lr": {"min": 1e-2, "max": 1.0, "scaling": "log"},
                         "momentum": {"min": 0.8, "max": 0.98, "scaling": "linear"},
                         "nesterov": {"feasible_points": [True]},
                         "weight_decay": {"min": 1e-7, "max": 1e-4, "scaling": "log"}}),
    "HeavyBall": ("SGD", {"lr": {"min": 1e-2, "max": 1.0, "scaling": "log"},
                          "momentum": {"min": 0.8, "max": 0.98, "scaling": "linear"},
                          "weight_decay": {"min": 1e-7, "max": 1e-4, "scaling": "log"}}),
}


def _best(values: list[float], higher: bool) -> float:
    return max(values) if higher else min(values)


def _helper(url: str, plans: list, threads: int) -> None:
    work(Store(url), plans, threads=threads)


def _work(store: Store, plans: list, *, threads: int, workers: int, on_trial: Callable | None) -> None:
    """Run every trial of ``plans``, ``workers`` at once (this process and ``workers - 1`` spawned helpers)."""
    for p in plans:  # prepared here first, so the helpers find every study ready
        store.prepare(p.name, p.spec, p.points, p.seeds, p.distributions)
    context = multiprocessing.get_context("spawn")
    helpers = [context.Process(target=_helper, args=(store.url, plans, threads)) for _ in range(workers - 1)]
    for h in helpers:
        h.start()
    try:
        work(store, plans, threads=threads, on_trial=on_trial)
    finally:
        for h in helpers:
            h.join()
    if any(h.exitcode for h in helpers):
        raise RuntimeError(f"{sum(bool(h.exitcode) for h in helpers)} target-setting worker(s) failed")


def set_target(store: Store, workload: str, *, trials: int, seeds: int, threads: int = 1, workers: int = 1,
               budget_scale: float = 1.0, on_trial: Callable | None = None) -> dict[str, Any]:
    """Run the procedure for one workload (resumable through ``store``) and return its targets.json entry."""
    w = get_workload(workload)
    if w.analytic_target:
        raise ValueError(f"workload {workload!r} has an analytic target ({w.metric} <= {w.target:g}); set-targets"
                         " applies to workloads whose target comes from tuning")
    no_target = math.inf if w.higher_is_better else -math.inf
    tuning = {label: plan(Entry(f"target:{label}", optimizer, space=space), workload, studies=1, trials=trials,
                          suite="targets", target=no_target, budget_scale=budget_scale, time_limit=False)[0]
              for label, (optimizer, space) in TARGET_SETTERS.items()}
    _work(store, list(tuning.values()), threads=threads, workers=workers, on_trial=on_trial)
    records = {s["name"]: s["records"] for s in store.studies()}
    candidates = [(label, TARGET_SETTERS[label][0], r) for label, p in tuning.items()
                  for r in records.get(p.name, []) if r["best_metric"] is not None]
    if not candidates:
        raise ValueError(f"target setting for {workload!r}: no trial produced a finite validation metric")
    label, optimizer, best = (max if w.higher_is_better else min)(
        candidates, key=lambda c: c[2]["best_metric"])
    entry = Entry(f"target:{label}:best", optimizer, hyperparameters=best["hyperparameters"])
    plans = plan(entry, workload, studies=seeds, suite="targets", target=no_target, self_tuning_budget=False,
                 budget_scale=budget_scale, time_limit=False)
    _work(store, plans, threads=threads, workers=workers, on_trial=on_trial)
    names = {p.name for p in plans}
    per_seed = [r["best_metric"] for s in store.studies() if s["name"] in names for r in s["records"]]
    return {"target": float(median(per_seed)), "metric": w.metric, "algorithm": label,
            "hyperparameters": best["hyperparameters"], "per_seed_best": per_seed,
            "tuning_best": {lab: _best([r["best_metric"] for lb, _, r in candidates if lb == lab],
                                       w.higher_is_better) for lab in TARGET_SETTERS
                            if any(lb == lab for lb, _, _ in candidates)},
            "trials_per_algorithm": trials, "seeds": seeds, "step_budget": plans[0].spec["max_steps"],
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "machine": {**best["machine"], "loadavg_range": _load_range(store, workload)}}


def _load_range(store: Store, workload: str) -> list[float]:
    """The lowest and highest 1-minute load average seen at the start of this workload's target trials."""
    loads = [r["machine"]["loadavg"][0] for s in store.studies() if s["spec"]["suite"] == "targets"
             and s["spec"]["workload"] == workload for r in s["records"]]
    return [min(loads), max(loads)]


def write_targets(entries: dict[str, dict], path: Path = TARGETS_FILE) -> None:
    """Merge ``entries`` into ``targets.json`` atomically (write a temporary file, then rename)."""
    targets = load_targets(path)
    targets.update(entries)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(targets, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
