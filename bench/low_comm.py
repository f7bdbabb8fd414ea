#!/usr/bin/env python
"""Bytes each worker sends per step with DeMo and PowerSGD, against data-parallel AdamW, on an arena model.

``python bench/low_comm.py``: the workload's model (``--workload``, default the Shakespeare char-level
transformer) on ``--workers`` gloo ranks of the CPU, one thread each, each worker on its own batches, for
``--steps`` steps of every row, all rows in the same run:

* ``DDP AdamW``: torch.optim.AdamW under DistributedDataParallel, the gradients all-reduced; its bytes are
  counted by a comm hook around torch's all-reduce hook (each bucket's ``numel x 4`` bytes);
* ``DeMo s=64 k=K``: gradwise.DeMo (no DDP: its own all-gather of each block's top-k DCT components);
* ``PowerSGD r=R``: torch's PowerSGD hook under DDP (``gradwise.distributed.powersgd``), two plain steps
  first, then rank-R compression; its row is the compressed steps' bytes;
* ``DiLoCo H=N`` (``bf16``, ``int8``: the pseudo-gradients' dtype or codec): gradwise.DiLoCo over AdamW, a
  sync every N steps; its row is the mean over the run's steps (a sync's bytes / N when N divides them).

Per row: the bytes this worker sent in the last step (every row's steady state), the ratio of DDP
AdamW's bytes to the row's, and the mean training loss of the last step over the workers (a sanity check
that every row trains, not a comparison of quality: a few steps only).
"""

import argparse
import gc
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: its gradwise

import gradwise  # noqa: E402
from gradwise.arena.workloads import get_workload  # noqa: E402
from gradwise.core.collectives import Traffic  # noqa: E402
from gradwise.distributed.powersgd import register_powersgd  # noqa: E402
from gradwise.help_format import HelpFormatter  # noqa: E402


def _counted_allreduce(traffic: Traffic, bucket) -> torch.futures.Future[torch.Tensor]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    traffic.record("all_reduce", bucket.buffer().nbytes)
    return allreduce_hook(None, bucket)


def _row(name: str, model: torch.nn.Module, lr: float):
    """(the module to call, the optimizer, a function returning the bytes sent so far)."""
    if name == "DDP AdamW":
        ddp, traffic = torch.nn.parallel.DistributedDataParallel(model), Traffic()
        ddp.register_comm_hook(traffic, _counted_allreduce)
        return ddp, torch.optim.AdamW(model.parameters(), lr=lr), lambda: sum(traffic.bytes_sent.values())
    if name.startswith("DiLoCo"):
        sync_every, *encoding = name.split("H=")[1].split()
        options = {"bf16": {"pseudo_gradient_dtype": torch.bfloat16}, "int8": {"pseudo_gradient_codec": "int8"}}
        diloco = gradwise.DiLoCo(torch.optim.AdamW(model.parameters(), lr=lr), sync_every=int(sync_every),
                                 **(options[encoding[0]] if encoding else {}))
        return model, diloco, lambda: diloco.comm_stats["bytes_sent"]
    if name.startswith("DeMo"):
        topk = int(name.split("k=")[1])
        demo = gradwise.DeMo(model.parameters(), lr=lr, chunk=64, topk=topk)
        return model, demo, lambda: demo.comm_stats["bytes_sent"]
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    counted = register_powersgd(ddp, rank=int(name.split("r=")[1]), start_powerSGD_iter=2)
    return ddp, torch.optim.AdamW(model.parameters(), lr=lr), lambda: counted.comm_stats["bytes_sent"]


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    workload = get_workload(args.workload)
    results = {}
    for name in args.rows.split(","):
        model = workload.init_model(seed=0)
        module, optimizer, sent = _row(name, model, args.lr)
        batches = workload.batches(workload.batch_size, seed=rank)
        totals = [0]  # bytes sent after each step (DDP's hooks send in backward, DeMo in step)
        for _ in range(args.steps):
            x, y = next(batches)
            loss = workload.loss(module(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            totals.append(sent())
        last = totals[-1] / args.steps if name.startswith("DiLoCo") else totals[-1] - totals[-2]
        mean_loss = torch.tensor(loss.item())
        dist.all_reduce(mean_loss)
        results[name] = {"bytes": last, "loss": mean_loss.item() / world,
                         "parameters": sum(p.numel() for p in model.parameters())}
        # DDP and its comm hook freed now, in this thread: garbage-collected in a gloo thread, they abort it
        del module, optimizer, sent
        gc.collect()
        dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/low_comm.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--workload", default="shakespeare_charlm", help="an arena workload")
    parser.add_argument("--workers", type=int, default=2, help="gloo ranks")
    parser.add_argument("--steps", type=int, default=4, help="steps per row (>= 3: PowerSGD's plain steps first)")
    parser.add_argument("--rows", default="DDP AdamW,DeMo s=64 k=32,DeMo s=64 k=4,PowerSGD r=4",
                        help="rows, comma-separated")
    parser.add_argument("--lr", type=float, default=1e-3, help="every row's learning rate")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: expected >= 3 (PowerSGD compresses from its third step)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "results.json")
        mp.spawn(_rank, args=(args.workers, port, args, out), nprocs=args.workers)
        results = json.loads(Path(out).read_text())
    load = os.getloadavg()[0]
    baseline = results["DDP AdamW"]["bytes"] if "DDP AdamW" in results else None
    print(f"{args.workload}: {next(iter(results.values()))['parameters']} parameters, {args.workers} workers,"
          f" {args.steps} steps per row; load average {load:.2f}")
    print(f"{'row':<18} {'bytes/step/worker':>18} {'DDP AdamW / row':>16} {'last loss':>10}")
    for name, row in results.items():
        ratio = f"{baseline / row['bytes']:.1f}x" if baseline and row["bytes"] else "-"
        print(f"{name:<18} {row['bytes']:>18,.0f} {ratio:>16} {row['loss']:>10.4f}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
