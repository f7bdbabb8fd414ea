#!/usr/bin/env python
"""A training step compiled whole (``python bench/compiled_train_step.py``): ``torch.compile(train_step)``
with forward, backward, ``optimizer.step()`` and ``zero_grad()`` inside, the pattern torch documents for its
own optimizers, for gradwise.AdamW against torch.optim.AdamW (whose step dynamo traces into the graph).

The model is a small MLP (``--width``; two hidden layers) on fixed random data, a ``LambdaLR`` scheduler
changes lr every step. Each row's compiled step runs ``WARMUP`` untimed steps (dynamo and inductor compile
there; their wall time is the row's first-call column), then rounds of ``--steps`` steps, rows interleaved;
the table gives the median milliseconds per step over rounds, as a ratio to torch's eager training step
measured in the same rounds, and the graphs dynamo compiled after the first step (0: no recompiles).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: its gradwise

from gradwise.cli_bench import WARMUP, positive_int_argument  # noqa: E402
from gradwise.help_format import HelpFormatter  # noqa: E402

#: row label -> (library, compile the training step)
ROWS = {"torch eager": ("torch", False), "torch compiled": ("torch", True),
        "gradwise eager": ("gradwise", False), "gradwise compiled": ("gradwise", True)}


def build(row: str, width: int):
    """``(train_step, counter)`` for the row: the (compiled) step of its own model, optimizer and scheduler,
    and dynamo's graph counter (None when eager)."""
    import torch
    from torch._dynamo.testing import CompileCounterWithBackend

    import gradwise

    library, compiled = ROWS[row]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width),
                                torch.nn.Tanh(), torch.nn.Linear(width, 10))
    cls = torch.optim.AdamW if library == "torch" else gradwise.AdamW
    optimizer = cls(model.parameters(), lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    inputs, targets = torch.randn(64, width), torch.randint(0, 10, (64,))

    def train_step():
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        return loss.detach()

    if not compiled:
        return train_step, None
    counter = CompileCounterWithBackend("inductor")
    return torch.compile(train_step, backend=counter), counter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/compiled_train_step.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--width", type=positive_int_argument, default=256, metavar="N", help="hidden width")
    parser.add_argument("--rounds", type=positive_int_argument, default=7, metavar="N", help="timed rounds")
    parser.add_argument("--steps", type=positive_int_argument, default=20, metavar="N", help="steps per round")
    parser.add_argument("--threads", type=positive_int_argument, default=1, metavar="T",
                        help="torch.set_num_threads for the run")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    steps, first, graphs = {}, {}, {}
    for row in ROWS:
        steps[row], counter = build(row, args.width)
        start = time.perf_counter()
        for _ in range(WARMUP):
            steps[row]()
        first[row] = time.perf_counter() - start
        graphs[row] = (counter, None if counter is None else counter.frame_count)
    times: dict[str, list[float]] = {row: [] for row in ROWS}
    rows = list(ROWS)
    for r in range(args.rounds):
        for row in rows[r % len(rows):] + rows[:r % len(rows)]:
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[row]()
            times[row].append((time.perf_counter() - start) / args.steps * 1e3)
    medians = {row: statistics.median(values) for row, values in times.items()}
    base = medians["torch eager"]
    print(f"load {os.getloadavg()[0]:.2f}, {args.threads} thread(s), width {args.width}; ms per training step")
    print(f"{'row':<20}{'ms/step':>10}{'x torch eager':>15}{'first 2 steps, s':>18}{'recompiles':>12}")
    for row in ROWS:
        counter, after_warmup = graphs[row]
        recompiles = "-" if counter is None else str(counter.frame_count - after_warmup)
        print(f"{row:<20}{medians[row]:>10.3f}{medians[row] / base:>15.2f}{first[row]:>18.1f}{recompiles:>12}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
