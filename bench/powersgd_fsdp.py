#!/usr/bin/env python
"""PowerSGD in FSDP2's reduce-scatter against plain FSDP2: bytes per step per worker, and steps to the target.

``python bench/powersgd_fsdp.py``: an arena workload (``--workload``, default ``teacher_student``) on ``--workers``
gloo ranks of the CPU, one thread each; the model ``fully_shard``'ed per Linear layer and whole; the arena's
AdamW at its self-tuning point (warmup and cosine schedule over ``--max-steps``) stepping the shards; worker
``r`` on batches ``r, r + N, ...`` of the seed's stream, as the arena's multi-worker trials; every row, for
every seed of ``--seeds``, in the same run:

* ``FSDP2``: FSDP2's own reduce-scatter, counted (``register_powersgd_fsdp`` with ``start_powerSGD_iter``
  past the run: every reduction the same reduce-scatter of the same buffer as FSDP2's);
* ``PowerSGD r=R``: rank-R PowerSGD after 2 plain reductions (the arena's ``PowerSGD[r=R]`` start).

Per row and seed: the steps to the workload's target (validated every ``eval_every`` steps, on every rank;
``miss`` and the best value within ``--max-steps`` otherwise); the bytes a worker sends in its last step, for
the gradients (the reduce-scatter, or PowerSGD's collectives) and for the parameters (FSDP2's all-gathers, in
forward and again in backward, which PowerSGD leaves alone; counted by a custom all-gather around torch's),
and FSDP2's over the row's, of the gradients and of both; everything sent in training (evaluations' all-gathers
left out); and the seconds (wall time on this machine at its load: not a speed claim).
"""

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: its gradwise

from gradwise.arena.multiworker import shard  # noqa: E402
from gradwise.arena.submissions import SELF_TUNING, build_optimizer  # noqa: E402
from gradwise.arena.workloads import get_workload  # noqa: E402
from gradwise.core.collectives import Traffic  # noqa: E402
from gradwise.distributed.powersgd_fsdp import register_powersgd_fsdp  # noqa: E402
from gradwise.help_format import HelpFormatter  # noqa: E402


class CountedAllGather:
    """FSDP2's parameter all-gather (torch's ``AllGather`` protocol, its default collective), each call's
    contribution counted as ``Traffic`` counts an all-gather (this rank's shard once: on 2 workers, the link's
    bytes)."""

    def __init__(self, traffic: Traffic) -> None:
        self.traffic = traffic

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        self.traffic.record("all_gather", input_tensor.nbytes)
        return dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)


def _train(row: str, seed: int, rank: int, world: int, args: argparse.Namespace) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    workload = get_workload(args.workload)
    model = workload.init_model(seed)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=args.reshard_after_forward)
    fully_shard(model, mesh=mesh)
    gathers = Traffic()
    for module in model.modules():
        if isinstance(module, FSDPModule) and any(True for _ in module.parameters(recurse=False)):
            module.set_custom_all_gather(CountedAllGather(gathers))
    rank_r = None if row == "FSDP2" else int(row.split("r=")[1])
    counted = register_powersgd_fsdp(model, rank=rank_r or 1, start_powerSGD_iter=2 if rank_r else args.max_steps + 1)
    optimizer, schedule = build_optimizer("AdamW", dict(SELF_TUNING["AdamW"]), model.parameters(), args.max_steps)
    batches = shard(workload.batches(workload.batch_size, seed), rank, world)
    best = math.inf if not workload.higher_is_better else -math.inf
    hit, start, gradients, parameters = None, time.perf_counter(), [0, 0], [0, 0]  # [last step's, in training]
    for step in range(1, args.max_steps + 1):
        before = counted.comm_stats["bytes_sent"], gathers.summary()["bytes_sent"]
        x, y = next(batches)
        loss = workload.loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        for sent, now, was in ((gradients, counted.comm_stats["bytes_sent"], before[0]),
                               (parameters, gathers.summary()["bytes_sent"], before[1])):
            sent[0], sent[1] = now - was, sent[1] + now - was
        if step % workload.eval_every and step < args.max_steps:
            continue
        value = workload.evaluate(model)[workload.metric]  # its all-gathers are not training's
        best = max(best, value) if workload.higher_is_better else min(best, value)
        reached = torch.tensor([float(workload.reached(value, workload.target))])
        dist.all_reduce(reached, op=dist.ReduceOp.MIN)  # every rank stops at the same step
        if reached.item():
            hit = step
            break
    return {"steps": hit, "best": best, "gradient_bytes": gradients, "parameter_bytes": parameters,
            "seconds": time.perf_counter() - start, "target": workload.target, "metric": workload.metric}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    get_workload(args.workload).data()  # built before any row's clock
    results = {f"{row} | seed {seed}": _train(row, seed, rank, world, args)
               for seed in args.seeds for row in args.rows.split(",")}
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/powersgd_fsdp.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--workload", default="teacher_student", help="an arena workload")
    parser.add_argument("--workers", type=int, default=2, help="gloo ranks")
    parser.add_argument("--rows", default="FSDP2,PowerSGD r=1,PowerSGD r=4", help="rows, comma-separated")
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1000],
                        help="seeds, comma-separated (each row runs once per seed)")
    parser.add_argument("--max-steps", type=int, default=4500, help="steps at most per row (the schedule's length)")
    parser.add_argument("--no-reshard-after-forward", dest="reshard_after_forward", action="store_false",
                        help="fully_shard(reshard_after_forward=False): one all-gather per step, not two (each rank"
                             " then holds whole parameters from forward to backward)")
    args = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "results.json")
        mp.spawn(_rank, args=(args.workers, port, args, out), nprocs=args.workers)
        results = json.loads(Path(out).read_text())
    first = next(iter(results.values()))
    print(f"{args.workload} (target {first['metric']} {first['target']:.6g}), {args.workers} workers, at most"
          f" {args.max_steps} steps, reshard_after_forward={args.reshard_after_forward}; started {started},"
          f" load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    print("bytes a worker sends per step (the last step's): gradients (the reduce-scatter or PowerSGD), parameters"
          " (FSDP2's all-gathers), both; FSDP2's over the row's; everything sent in training; wall seconds")
    print(f"{'row':<24} {'steps to target':>22} {'gradients':>10} {'parameters':>11} {'both':>10} {'FSDP2/row':>15}"
          f" {'sent in training':>17} {'s':>6}")
    for name, row in results.items():
        fsdp2 = results.get(f"FSDP2 | {name.split(' | ')[1]}")
        both = row["gradient_bytes"][0] + row["parameter_bytes"][0]
        ratio = "-" if fsdp2 is None else (f"{fsdp2['gradient_bytes'][0] / row['gradient_bytes'][0]:.1f}x /"
                                           f" {(fsdp2['gradient_bytes'][0] + fsdp2['parameter_bytes'][0]) / both:.2f}x")
        steps = str(row["steps"]) if row["steps"] else f"miss (best {row['best']:.5g})"
        print(f"{name:<24} {steps:>22} {row['gradient_bytes'][0]:>10,} {row['parameter_bytes'][0]:>11,} {both:>10,}"
              f" {ratio:>15} {row['gradient_bytes'][1] + row['parameter_bytes'][1]:>17,} {row['seconds']:>6.1f}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
