"""One timed trial of an AlgoPerf submission on an arena workload, timed as AlgoPerf's ``train_once`` times it.

Before the clock: the submission is loaded and checked, ``get_batch_size(workload_name)`` fixes the batch,
``init_model_fn`` builds the model and ``init_optimizer_state`` the optimizer. Each step then calls
``data_selection`` (which draws from the input queue) and ``update_params`` (one call, one step); both count
toward ``accumulated_submission_time``, as in AlgoPerf. Before each evaluation ``prepare_for_eval`` (if the
submission has it) runs on the clock too; the evaluation itself is untimed. Evaluations follow the arena's
cadence, every ``eval_every`` steps and at the end (AlgoPerf's is every ``eval_period_time_sec``), so that these
trials and the arena's own entries are measured alike. The trial ends at the first evaluation at the target,
at the time or step budget, when ``update_params`` raises ``spec.TrainingCompleteError``, or when the validation
loss is not finite. ``update_params`` gets ``train_state`` (a read-only view) if its signature names it;
``rng`` is an int, the trial's seed and the step folded together. The record has the keys ``run_trial``'s has
(no ``train_loss``: the submission computes its own loss), so the arena's scoring, store and report take it.
"""
from __future__ import annotations

import inspect
import math
import os
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable

import torch

from gradwise.arena.algoperf_submission import (
    algoperf_imports,
    batch_size,
    file_sha256,
    hyperparameters_tuple,
    load_submission,
)
from gradwise.arena.algoperf_workload import adapt
from gradwise.arena.runner import machine, peak_rss_mb, pin_threads, reset_peak_rss, rss_now_mb, state_bytes
from gradwise.arena.workloads import Workload


def optimizer_state_bytes(optimizer_state: Any) -> int:
    """The state bytes of every ``torch.optim.Optimizer`` in the submission's optimizer state (a dict or tuple)."""
    values = optimizer_state.values() if isinstance(optimizer_state, dict) else \
        optimizer_state if isinstance(optimizer_state, (tuple, list)) else [optimizer_state]
    return sum(state_bytes(v) for v in values if isinstance(v, torch.optim.Optimizer))


def _returned(name: str, path: Path, value: Any) -> tuple:
    if not (isinstance(value, tuple) and len(value) == 3):
        raise ValueError(f"submission {str(path)!r}: {name} returned {type(value).__name__}; expected the tuple"
                         " (optimizer_state, params, model_state)")
    return value


def run_submission_trial(workload: Workload, path: str | Path, hyperparameters: dict[str, Any] | None, *,
                         seed: int, target: float, max_steps: int, max_runtime: float, step_hint: int,
                         threads: int = 1, on_eval: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Train once with the submission at ``path``; the record as ``runner.run_trial`` returns it."""
    if max_steps < 1:
        raise ValueError(f"invalid max_steps={max_steps!r}: expected >= 1")
    if not max_runtime > 0:
        raise ValueError(f"invalid max_runtime={max_runtime!r}: expected > 0 seconds")
    path = Path(path).resolve()
    pin_threads(threads)
    with algoperf_imports() as spec:
        module = load_submission(path)
        size = batch_size(module, path, workload.name)
        workload.data()  # build or load the data outside the clock
        w = adapt(spec, workload, batch_size=size, step_hint=step_hint, max_runtime=max_runtime)
        model, model_state = w.init_model_fn(seed)
        hyper = hyperparameters_tuple(hyperparameters)
        optimizer_state = module.init_optimizer_state(w, model, model_state, hyper, seed)
        queue = w.input_queue(seed)
        prepare = getattr(module, "prepare_for_eval", None)
        needs_train_state = "train_state" in inspect.signature(module.update_params).parameters
        record: dict[str, Any] = {
            "workload": workload.name, "optimizer": f"algoperf:{path.name}", "hyperparameters": hyperparameters,
            "seed": seed, "target": target, "metric": workload.metric, "max_steps": max_steps,
            "max_runtime": max_runtime, "step_hint": step_hint, "batch_size": size,
            "submission_file": str(path), "submission_sha256": file_sha256(path), "machine": machine(threads)}
        scope = reset_peak_rss()
        rss_start = rss_now_mb()
        curve: list[dict[str, float]] = []
        eval_results: list[tuple[int, dict[str, float]]] = []
        train_state = {"accumulated_submission_time": 0.0, "is_time_remaining": True,
                       "validation_goal_reached": False, "training_complete": False}
        train_time = cpu_time = 0.0
        step, hit, diverged, complete = 0, False, False, False
        while step < max_steps and train_time < max_runtime and not complete:
            wall0, cpu0 = time.perf_counter(), time.process_time()
            rng = seed * 1_000_003 + step
            batch = module.data_selection(w, queue, optimizer_state, model, model_state, hyper, step, rng)
            try:
                optimizer_state, model, model_state = _returned("update_params", path, module.update_params(
                    workload=w, current_param_container=model, current_params_types=w.model_params_types,
                    model_state=model_state, hyperparameters=hyper, batch=batch, loss_type=w.loss_type,
                    optimizer_state=optimizer_state, eval_results=eval_results, global_step=step, rng=rng,
                    **({"train_state": MappingProxyType(train_state)} if needs_train_state else {})))
            except spec.TrainingCompleteError:
                complete = True
            step += 1
            train_time += time.perf_counter() - wall0
            cpu_time += time.process_time() - cpu0
            train_state.update(accumulated_submission_time=train_time, is_time_remaining=train_time < max_runtime,
                               training_complete=complete)
            last = complete or step >= max_steps or train_time >= max_runtime
            if step % workload.eval_every == 0 or last:
                if prepare is not None:  # on the clock, as in AlgoPerf
                    wall0, cpu0 = time.perf_counter(), time.process_time()
                    optimizer_state, model, model_state = _returned("prepare_for_eval", path, prepare(
                        workload=w, current_param_container=model, current_params_types=w.model_params_types,
                        model_state=model_state, hyperparameters=hyper, loss_type=w.loss_type,
                        optimizer_state=optimizer_state, eval_results=eval_results, global_step=step, rng=rng))
                    train_time += time.perf_counter() - wall0
                    cpu_time += time.process_time() - cpu0
                    train_state["accumulated_submission_time"] = train_time
                point = {"step": step, "time": train_time, "cpu_time": cpu_time, **workload.evaluate(model)}
                curve.append(point)
                eval_results.append((step, {**{f"validation/{k}": v for k, v in point.items()},
                                            "score": train_time, "accumulated_submission_time": train_time}))
                if on_eval is not None:
                    on_eval(point)
                diverged = not math.isfinite(point["loss"])
                if not diverged and workload.reached(point[workload.metric], target):
                    hit = train_state["validation_goal_reached"] = True
                    break
                if diverged:
                    break
    values = [p[workload.metric] for p in curve]
    best = (max if workload.higher_is_better else min)(values) if values else None
    record.update({
        "reached": hit, "diverged": diverged, "steps": step, "train_time": train_time, "cpu_time": cpu_time,
        "time_to_target": train_time if hit else None, "steps_to_target": step if hit else None,
        "best_metric": best, "final_metric": values[-1] if values else None, "training_complete": complete,
        "peak_rss_mb": peak_rss_mb(scope), "peak_rss_scope": scope, "rss_start_mb": rss_start,
        "state_bytes": optimizer_state_bytes(optimizer_state), "params": sum(p.numel() for p in model.parameters()),
        "curve": curve, "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    })
    return record
