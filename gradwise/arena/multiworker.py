"""A multi-worker trial: one arena trial on ``N`` gloo workers of this machine, its communication counted.

``run_workers_trial`` spawns ``N`` processes (``torch.multiprocessing``, spawn, ``threads`` torch threads each)
in one gloo group. Every worker builds the workload's model from the trial's seed (the same start everywhere)
and the entry (``gradwise.arena.low_comm.build``: a recipe data-parallel, or DiLoCo, Streaming DiLoCo, DeMo,
PowerSGD). The data: every worker draws the seed's batch stream and worker ``r`` trains on batches ``r, r + N,
r + 2N, ...``, so one step of the N workers sees N consecutive batches of the single-worker stream: the global
batch is N x the workload's. Worker 0 keeps the clock (training only, as ``runner.run_trial``), evaluates every
``eval_every`` steps (DiLoCo at its outer copy) and decides; its decision (target hit, budget spent, loss not
finite) reaches the others in a one-number broadcast at each evaluation, outside the clock and not counted.

The record is ``run_trial``'s plus ``workers`` and what worker 0 sent (``gradwise.core.collectives.Traffic``'s
payload, and ``wire_bytes``, what a ring puts on the link: ``gradwise.arena.link``), in total and per step,
and the simulated link: ``time_to_target`` (what the arena scores) and each curve point's ``time`` are the
measured training time plus ``link_time``, the link's cost of the collectives so far; ``measured_time`` is
the training time alone. The time budget is checked at evaluations, against that simulated time.
"""
from __future__ import annotations

import gc
import math
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gradwise.arena import low_comm
from gradwise.arena.link import Link
from gradwise.arena.runner import (
    has_modes,
    machine,
    peak_rss_mb,
    pin_threads,
    reset_peak_rss,
    rss_now_mb,
    state_bytes,
)


@dataclass(frozen=True)
class Job:
    """What every worker needs (picklable: the workload by name)."""

    workload: str
    optimizer: str
    hyperparameters: dict[str, Any]
    seed: int
    target: float
    max_steps: int
    max_runtime: float
    workers: int
    threads: int
    link: Link
    port: int


def shard(batches: Iterator, rank: int, workers: int) -> Iterator:
    """Batches ``rank, rank + workers, ...`` of ``batches``."""
    while True:
        for r in range(workers):
            batch = next(batches)
            if r == rank:
                yielded = batch
        yield yielded


def run_workers_trial(workload: str, optimizer: str, hyperparameters: dict[str, Any], *, seed: int,
                      target: float, max_steps: int, max_runtime: float, workers: int, threads: int = 1,
                      link: Link = Link(), on_eval: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Train once on ``workers`` gloo workers; returns worker 0's record (see the module's docstring)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"invalid workers={workers!r}: expected an int >= 1 (gloo workers per trial)")
    if max_steps < 1:
        raise ValueError(f"invalid max_steps={max_steps!r}: expected >= 1")
    if not max_runtime > 0:
        raise ValueError(f"invalid max_runtime={max_runtime!r}: expected > 0 seconds")
    if not isinstance(link, Link):
        raise TypeError(f"invalid link={link!r}: expected a gradwise.arena.link.Link")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = Job(workload, optimizer, dict(hyperparameters), seed, target, max_steps, max_runtime, workers, threads,
              link, port)
    queue = mp.get_context("spawn").SimpleQueue()
    context = mp.start_processes(_worker, args=(job, queue), nprocs=workers, join=False, start_method="spawn")
    record = None
    while True:
        done = context.join(timeout=0.2)  # raises if a worker failed
        while not queue.empty():
            kind, payload = queue.get()
            if kind == "eval" and on_eval is not None:
                on_eval(payload)
            elif kind == "record":
                record = payload
        if done:
            break
    if record is None:
        raise RuntimeError(f"the {workers} workers of a {optimizer} trial on {workload} ended without a record")
    return record


def _worker(rank: int, job: Job, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job.port))
    pin_threads(job.threads)
    dist.init_process_group("gloo", rank=rank, world_size=job.workers)
    try:
        record = _train(rank, job, queue)
        if rank == 0:
            queue.put(("record", record))
        gc.collect()  # DDP and its hook freed here, not in a gloo thread
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _train(rank: int, job: Job, queue) -> dict[str, Any] | None:
    from gradwise.arena.workloads import get_workload

    workload = get_workload(job.workload)
    workload.data()  # outside the clock
    model = workload.init_model(job.seed)
    method = low_comm.build(job.optimizer, job.hyperparameters, model, job.max_steps)
    batches = shard(workload.batches(workload.batch_size, job.seed), rank, job.workers)
    record: dict[str, Any] = {"workload": workload.name, "optimizer": job.optimizer,
                              "hyperparameters": job.hyperparameters, "seed": job.seed, "target": job.target,
                              "metric": workload.metric, "max_steps": job.max_steps, "max_runtime": job.max_runtime,
                              "machine": machine(job.threads), "workers": job.workers, "link": job.link.describe(),
                              "data": f"worker r of {job.workers} trains on batches r, r + {job.workers}, ... of the"
                                      f" seed's stream: a global batch of {job.workers} x {workload.batch_size}"}
    scope, rss_start = reset_peak_rss(), rss_now_mb()
    curve: list[dict[str, float]] = []
    train_time = cpu_time = link_time = 0.0
    step, hit, diverged, train_loss = 0, False, False, math.nan
    model.train()
    modes = has_modes(method.optimizer)
    stop = torch.zeros(1)
    while step < job.max_steps:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        if modes:
            method.optimizer.train()
        x, y = next(batches)
        loss = workload.loss(method.module(x), y)
        method.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        method.optimizer.step()
        method.schedule.step()
        train_loss = float(loss.detach())
        train_time += time.perf_counter() - wall0
        cpu_time += time.process_time() - cpu0
        step += 1
        diverged = diverged or not math.isfinite(train_loss)
        if step % workload.eval_every and step < job.max_steps:
            continue
        if rank == 0:
            if modes:
                wall, cpu = time.perf_counter(), time.process_time()
                method.optimizer.eval()
                train_time += time.perf_counter() - wall
                cpu_time += time.process_time() - cpu
            link_time = job.link.seconds(method.traffic, job.workers)
            point = {"step": step, "time": train_time + link_time, "measured_time": train_time,
                     "link_time": link_time, "cpu_time": cpu_time, "train_loss": train_loss,
                     **({} if diverged else _evaluate(workload, model, method.eval_point))}
            curve.append(point)
            queue.put(("eval", point))
            hit = not diverged and workload.reached(point[workload.metric], job.target)
            stop.fill_(float(hit or diverged or point["time"] >= job.max_runtime))
        dist.broadcast(stop, src=0)
        if stop.item():
            break
    if rank != 0:
        return None
    values = [p[workload.metric] for p in curve if workload.metric in p]
    best = (max if workload.higher_is_better else min)(values) if values else None
    traffic = method.traffic.summary()
    wire = job.link.wire_bytes(method.traffic, job.workers)
    record.update({
        "reached": hit, "diverged": diverged, "pruned": False, "steps": step, "train_time": train_time + link_time,
        "measured_time": train_time, "link_time": link_time, "cpu_time": cpu_time,
        "time_to_target": train_time + link_time if hit else None,
        "measured_time_to_target": train_time if hit else None, "steps_to_target": step if hit else None,
        "best_metric": best, "final_metric": values[-1] if values else None,
        "bytes_sent": traffic["bytes_sent"], "bytes_per_step": traffic["bytes_sent"] / step,
        "wire_bytes": wire, "wire_bytes_per_step": wire / step, "collectives": traffic["collectives"],
        "traffic": traffic, "peak_rss_mb": peak_rss_mb(scope), "peak_rss_scope": scope, "rss_start_mb": rss_start,
        "state_bytes": _state_bytes(method.optimizer), "params": sum(p.numel() for p in model.parameters()),
        "curve": curve, "loadavg_end": [round(v, 2) for v in os.getloadavg()],
    })
    return record


@torch.no_grad()
def _evaluate(workload, model: torch.nn.Module, point: list[torch.Tensor] | None) -> dict[str, float]:
    """The workload's evaluation of ``model``, at ``point`` (DiLoCo's outer copy) where one is given."""
    if point is None:
        return workload.evaluate(model)
    params = list(model.parameters())
    own = [p.detach().clone() for p in params]
    for p, q in zip(params, point):
        p.copy_(q)
    try:
        return workload.evaluate(model)
    finally:
        for p, q in zip(params, own):
            p.copy_(q)


def _state_bytes(optimizer) -> int:
    """The bytes of the optimizer's per-parameter state (DiLoCo: its inner optimizer's and outer copy's)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return state_bytes(optimizer)
    return state_bytes(optimizer.inner) + sum(s.numel() * s.element_size() for s in optimizer.synced) \
        + sum(state_bytes(o) for o in optimizer.outer)
