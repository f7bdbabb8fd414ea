#!/usr/bin/env python
"""The optimizer under FSDP2 (``python bench/distributed.py``): step time per rank against torch.optim.AdamW
under the same sharded model, bytes each rank sends per step, optimizer state per rank; 1, 2 and 4 gloo
ranks on the CPU, one thread each.

Each world size is one spawn of that many processes. Every rank ``fully_shard``s the same GPT-2-shaped
parameter set (each block a module of its own, as a training script shards it), with random gradients
set once (sharded like their parameters) and reused every step: the benchmark times the optimizer step,
not the model. torch.optim.AdamW (foreach, its default) lives through the whole run; each row's
optimizer takes ``WARMUP`` untimed steps (its state is built in the first), then steps in turn with
torch's, round after round, the order alternating, so a noisy machine slows both alike. A barrier before
each timed step starts every rank together (a step with collectives waits for the slowest rank).

Per row and rank: the median step time over torch's median in the same rounds (the table shows the
largest ratio over ranks, and the largest of each median), the bytes ``optimizer.comm_stats`` counted
per timed step, and the bytes of every tensor in ``optimizer.state`` (a DTensor by its local shard; the
state is at its peak from the first step on: it never shrinks), each beside
``gradwise.estimate_sharded``'s prediction.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

from gradwise.cli_bench import RECIPES, WARMUP  # noqa: E402
from gradwise.help_format import HelpFormatter  # noqa: E402
from gradwise.shapes import gpt2_shapes  # noqa: E402

#: row: (gradwise class, hyperparameters); AdamW's rows take the step benchmark's hyperparameters
ROWS = {
    "AdamW": RECIPES["AdamW"][:2],
    "Muon": ("Muon", {"lr": 2e-2, "weight_decay": 0.1}),
    "Shampoo": ("Shampoo", {"lr": 1e-3, "weight_decay": 0.1}),
    "Adafactor": ("Adafactor", {"lr": 1e-2}),
    "AdamW-int8": RECIPES["AdamW-int8"][:2],
}
#: the parameter set: a GPT-2 of this vocabulary, context, width and depth (about 3.6M parameters)
SHAPE = (4096, 256, 256, 4)
WORLDS = (1, 2, 4)
#: seconds a collective may wait (a rank that died), and a whole world size may take
COLLECTIVE_TIMEOUT_S, JOIN_DEADLINE_S = 300, 3000


# ------------------------------------------------------------------------------ inside each rank
class Block(torch.nn.Module):
    """Parameters of one part of the model (a transformer block, the embeddings), by their GPT-2 names."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]], generator):
        super().__init__()
        for name, shape in shapes:
            self.register_parameter(name.replace(".", "_"), torch.nn.Parameter(torch.randn(shape, generator=generator)
                                                                               * 0.02))


def sharded_model(mesh):
    """The parameter set, a block per module, ``fully_shard``ed over ``mesh`` (``mesh`` None: not sharded),
    with a fixed random gradient for every parameter."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    generator = torch.Generator().manual_seed(0)
    parts: dict[str, list] = {}
    for name, shape in gpt2_shapes(*SHAPE):
        parts.setdefault(name.split(".")[1] if name.startswith("h.") else "outer", []).append((name, shape))
    model = torch.nn.ModuleDict({key: Block(shapes, generator) for key, shapes in parts.items()})
    if mesh is not None:
        for block in model.values():  # (no root to shard: every parameter is in a block)
            fully_shard(block, mesh=mesh)
    for p in model.parameters():
        if isinstance(p, DTensor):
            local = torch.randn(p.to_local().shape, generator=generator) * 1e-3
            p.grad = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
        else:
            p.grad = torch.randn(p.shape, generator=generator) * 1e-3
    return model


def _state_bytes(optimizer) -> int:
    from gradwise.core.params import local

    return sum(local(v).nbytes for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))


def _timed(opt, barrier) -> float:
    barrier()
    start = time.perf_counter()
    opt.step()
    return (time.perf_counter() - start) * 1e3


def _rank(rank: int, world: int, port: int, rows: list[str], steps: int, directory: str) -> None:
    import torch.distributed as dist

    import gradwise

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        from torch.distributed.device_mesh import init_device_mesh

        model = sharded_model(init_device_mesh("cpu", (world,)))
        reference = torch.optim.AdamW(model.named_parameters(), **RECIPES["AdamW"][1])
        for _ in range(WARMUP):
            reference.step()
        results, pooled = {}, []  # pooled: torch's times over every row's rounds
        for row in rows:
            name, hyper = ROWS[row]
            opt = getattr(gradwise, name)(model.named_parameters(), compile=False, **hyper)  # names: Muon's route
            try:
                for _ in range(WARMUP):
                    opt.step()
            except NotImplementedError as error:
                results[row] = {"refused": str(error).split(";")[0]}
                continue
            sent = opt.comm_stats["bytes_sent"]
            times, torch_times = [], []
            for r in range(steps):
                order = [(times, opt), (torch_times, reference)]
                for out, o in order if r % 2 == 0 else order[::-1]:
                    out.append(_timed(o, dist.barrier))
            pooled += torch_times
            results[row] = {"ms": statistics.median(times), "torch_ms": statistics.median(torch_times),
                            "sent": (opt.comm_stats["bytes_sent"] - sent) // steps, "state": _state_bytes(opt)}
            del opt
        torch_ms = statistics.median(pooled or [_timed(reference, dist.barrier)])  # (every row refused: one step)
        results["torch AdamW"] = {"ms": torch_ms, "torch_ms": torch_ms,
                                  "sent": 0, "state": _state_bytes(reference)}
        Path(directory, f"{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ the parent
def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, rows: list[str], steps: int) -> list[dict]:
    """Every rank's results for ``world`` ranks (one spawn; a rank's failure is raised here)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="gradwise-bench-distributed-") as directory:
        context = mp.start_processes(_rank, args=(world, _free_port(), rows, steps, directory), nprocs=world,
                                     join=False, start_method="spawn")
        deadline = time.monotonic() + JOIN_DEADLINE_S
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world} ranks still running after {JOIN_DEADLINE_S} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        return [json.loads(Path(directory, f"{r}.json").read_text()) for r in range(world)]


def predicted(row: str, world: int):
    """``gradwise.estimate_sharded`` of the row on the benchmark's (unsharded) model."""
    import gradwise

    name, hyper = ROWS[row]
    return gradwise.estimate_sharded(sharded_model(None), name, world_size=world, **hyper)


def render(results: dict[int, list[dict]], rows: list[str]) -> str:
    lines = [f"{'row':<12}{'ranks':>6}{'x torch AdamW':>15}{'ms':>9}{'torch ms':>10}{'sent B/step':>14}"
             f"{'(estimate)':>14}"
             f"{'state B/rank':>14}{'(estimate)':>14}"]
    for world, ranks in results.items():
        for row in [*rows, "torch AdamW"]:
            mine = [r[row] for r in ranks]
            if "refused" in mine[0]:
                lines.append(f"{row:<12}{world:>6}  refused: {mine[0]['refused']}")
                continue
            ratio = max(r["ms"] / r["torch_ms"] for r in mine)
            ms, torch_ms = max(r["ms"] for r in mine), max(r["torch_ms"] for r in mine)
            sent, state = max(r["sent"] for r in mine), max(r["state"] for r in mine)
            guess = predicted(row, world) if row in ROWS else None  # torch's own AdamW: nothing to predict
            sent_guess, state_guess = (f"{max(guess.sent):,}", f"{max(guess.state):,}") if guess else ("-", "-")
            lines.append(f"{row:<12}{world:>6}{ratio:>15.2f}{ms:>9.1f}{torch_ms:>10.1f}{sent:>14,}{sent_guess:>14}{state:>14,}"
                         f"{state_guess:>14}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/distributed.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--worlds", default=",".join(map(str, WORLDS)), help="world sizes, comma-separated")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"rows, comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    bad = [r for r in rows if r not in ROWS]
    if bad or not rows:
        parser.error(f"argument --rows: {bad} not among {list(ROWS)}")
    results = {int(w): run_world(int(w), rows, args.steps) for w in args.worlds.split(",")}
    print(f"GPT-2-shaped {SHAPE} parameter set, eager, gloo on CPU, 1 thread per rank; max over ranks")
    print(render(results, rows))
    if args.json:
        Path(args.json).write_text(json.dumps({str(w): r for w, r in results.items()}, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
