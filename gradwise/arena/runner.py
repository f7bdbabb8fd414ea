"""One timed trial: train a workload with an optimizer until the target or the budget.

The clock (AlgoPerf's ``accumulated_submission_time``) counts training only: drawing the batch, forward,
backward, the optimizer step and the LR schedule, and the optimizer's switch to its evaluation point and back
(Schedule-Free's ``eval()``/``train()``; AlgoPerf times ``prepare_for_eval``). Evaluation runs untimed every
``eval_every`` steps (and at the end), in the optimizer's eval mode; the trial stops at the first evaluation
that reaches the target, or when the training time or the step budget is spent, or when the loss is not finite.
The record holds wall and CPU training time, steps to target, peak resident memory (and its growth over the
trial's start, after the data are loaded), optimizer state bytes, the curve, the seed, and the machine (torch
version, CPU model, threads, load average).

Peak memory is per trial on Linux: writing ``5`` to ``/proc/self/clear_refs`` resets the process's high-water
mark (VmHWM) before the trial, and VmHWM is read after it (``peak_rss_scope: "trial"``). Where that reset is
not possible, the record holds the process's peak since it started (``getrusage``) and says so
(``peak_rss_scope: "process"``): a trial then also carries the peaks of the trials before it in that process.
"""
from __future__ import annotations

import math
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any, Callable

import torch

from gradwise.arena.submissions import build_optimizer
from gradwise.arena.workloads import Workload


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(threads: int) -> dict[str, Any]:
    return {"torch": torch.__version__, "python": platform.python_version(), "cpu_model": cpu_model(),
            "cpus": os.cpu_count(), "threads": threads, "host": platform.node(),
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


def pin_threads(threads: int) -> None:
    if threads < 1:
        raise ValueError(f"invalid threads={threads!r}: expected >= 1")
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


def reset_peak_rss() -> str:
    """Start a new peak-memory window; returns its scope: ``"trial"`` if VmHWM was reset (Linux), else
    ``"process"`` (the peak then counts from the process's start)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return "process"
    return "trial" if _status_mb("VmHWM") is not None else "process"


def _status_mb(field: str) -> float | None:
    """A ``/proc/self/status`` memory field (VmHWM: peak, VmRSS: current resident set) in MiB, or None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mb(scope: str) -> float:
    """The peak resident set size in MiB over the window ``reset_peak_rss`` opened (see its scope)."""
    if scope == "trial":
        peak = _status_mb("VmHWM")
        if peak is not None:
            return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return maxrss / 2**20 if platform.system() == "Darwin" else maxrss / 1024


def rss_now_mb() -> float | None:
    """The current resident set size in MiB (Linux), or None."""
    return _status_mb("VmRSS")


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of every tensor in the optimizer's per-parameter state."""
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


def has_modes(optimizer) -> bool:
    """Whether the optimizer has a training and an evaluation point (``train()``/``eval()``: gradwise's
    optimizers, schedulefree's): the runner evaluates in eval mode, switching on the clock, as AlgoPerf times
    a submission's ``prepare_for_eval``. For all but Schedule-Free the switch moves nothing."""
    return callable(getattr(optimizer, "eval", None)) and callable(getattr(optimizer, "train", None))


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall, CPU) seconds ``fn()`` took."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def run_trial(workload: Workload, optimizer: str, hyperparameters: dict[str, Any], *, seed: int,
              target: float, max_steps: int, max_runtime: float, threads: int = 1,
              on_eval: Callable[[dict], None] | None = None,
              prune: Callable[[dict], bool] | None = None, stop_after: int | None = None) -> dict[str, Any]:
    """Train once; returns the trial record (JSON-serializable; ``time_to_target`` is None on a miss).
    ``prune(point)``, asked after each evaluation that misses the target, stops the trial when it says so
    before the budget's end (a multi-fidelity tuner's early stop; the record says ``pruned``). ``stop_after``
    ends the trial after that many steps of a ``max_steps`` budget (its learning-rate schedule unchanged): the
    first steps of the whole run, as a one-epoch screening trains them."""
    if max_steps < 1:
        raise ValueError(f"invalid max_steps={max_steps!r}: expected >= 1")
    if not max_runtime > 0:
        raise ValueError(f"invalid max_runtime={max_runtime!r}: expected > 0 seconds")
    if stop_after is not None and not 1 <= stop_after <= max_steps:
        raise ValueError(f"invalid stop_after={stop_after!r}: expected None or 1 to max_steps ({max_steps})")
    pin_threads(threads)
    workload.data()  # build or load the data outside the clock
    model = workload.init_model(seed)
    opt, schedule = build_optimizer(optimizer, hyperparameters, model.named_parameters(), max_steps)
    batches = workload.batches(workload.batch_size, seed)
    record: dict[str, Any] = {"workload": workload.name, "optimizer": optimizer,
                              "hyperparameters": hyperparameters, "seed": seed, "target": target,
                              "metric": workload.metric, "max_steps": max_steps, "max_runtime": max_runtime,
                              "machine": machine(threads)}
    scope = reset_peak_rss()
    rss_start = rss_now_mb()
    curve: list[dict[str, float]] = []
    train_time = cpu_time = 0.0
    step, hit, diverged, pruned, train_loss = 0, False, False, False, math.nan
    model.train()
    modes = has_modes(opt)
    steps = max_steps if stop_after is None else stop_after
    while step < steps and train_time < max_runtime:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        if modes:
            opt.train()  # back from the last evaluation's point (nothing to do on the first step)
        x, y = next(batches)
        loss = workload.loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
        train_loss = float(loss.detach())
        train_time += time.perf_counter() - wall0
        cpu_time += time.process_time() - cpu0
        step += 1
        diverged = not math.isfinite(train_loss)
        last = diverged or step >= steps or train_time >= max_runtime
        if step % workload.eval_every == 0 or last:
            wall, cpu = _timed(opt.eval) if modes else (0.0, 0.0)  # Schedule-Free: evaluate at x, not at y
            train_time, cpu_time = train_time + wall, cpu_time + cpu
            point = {"step": step, "time": train_time, "cpu_time": cpu_time, "train_loss": train_loss,
                     **({} if diverged else workload.evaluate(model))}
            curve.append(point)
            if on_eval is not None:
                on_eval(point)
            if not diverged and workload.reached(point[workload.metric], target):
                hit = True
                break
            if prune is not None and prune(point) and not last:
                pruned = True
                break
        if diverged:
            break
    values = [p[workload.metric] for p in curve if workload.metric in p]
    best = (max if workload.higher_is_better else min)(values) if values else None
    record.update({
        "reached": hit, "diverged": diverged, "pruned": pruned, "steps": step, "train_time": train_time,
        "cpu_time": cpu_time,
        "time_to_target": train_time if hit else None, "steps_to_target": step if hit else None,
        "best_metric": best, "final_metric": values[-1] if values else None,
        "peak_rss_mb": peak_rss_mb(scope), "peak_rss_scope": scope, "rss_start_mb": rss_start,
        "state_bytes": state_bytes(opt), "params": sum(p.numel() for p in model.parameters()), "curve": curve,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    })
    return record
