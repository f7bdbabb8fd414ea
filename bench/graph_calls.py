#!/usr/bin/env python
"""Where a compiled step's time goes outside its graphs (``python bench/graph_calls.py``): each recipe's compiled step
on a GPT-2-shaped set, interleaved with torch.optim.AdamW(fused=True), split into its graphs' calls and the rest.

A step's time inside the compiled graphs is timed around inductor's ``CompiledFxGraph.__call__`` (the kernel and its
generated wrapper); the rest is split into the time before the first graph (the step's checks, bucketing, packing,
its calls' arguments and guard checks), between one graph's end and the next one's start (torch's path from a call
to its kernel, dynamo's guards where they are checked there), and after the last. Torch's step is split the same way
around ``torch._fused_adamw_``, its one kernel call ("x kernel": the graphs' time over that call's). A diagnostic:
the timers wrap torch's own functions for the run. Medians over ``--rounds`` rounds of one step of each, the order
alternating.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: its gradwise

from gradwise.cli_bench import RECIPES, WARMUP, names_argument, positive_int_argument  # noqa: E402
from gradwise.help_format import HelpFormatter  # noqa: E402
from gradwise.shapes import SIZES, gpt2_parameters  # noqa: E402

COLUMNS = ("step ms", "x fused", "graphs ms", "x kernel", "calls", "before ms", "between ms", "after ms")


class Spans:
    """The start and end of every call of the wrapped functions during one step."""

    def __init__(self):
        self.marks: list[tuple[float, float]] = []

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.marks.append((start, time.perf_counter()))
        return timed

    def step(self, optimizer) -> dict[str, float]:
        """One step of ``optimizer``: its seconds, in the calls, before, between and after them."""
        self.marks.clear()
        start = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        marks = self.marks or [(end, end)]
        return {"step": end - start, "graphs": sum(b - a for a, b in self.marks), "calls": len(self.marks),
                "before": marks[0][0] - start, "after": end - marks[-1][1],
                "between": sum(marks[i + 1][0] - marks[i][1] for i in range(len(marks) - 1))}


def measure(recipe: str, size: str, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds (and calls) of the recipe's compiled step and of torch's fused AdamW, interleaved."""
    import torch
    from torch._inductor import output_code

    import gradwise

    name, hyper, _ = RECIPES[recipe]
    ours = getattr(gradwise, name)(gpt2_parameters(size), **hyper, compile=True)
    theirs = torch.optim.AdamW(gpt2_parameters(size), **RECIPES["AdamW"][1], fused=True)
    for _ in range(WARMUP):
        ours.step()
        theirs.step()
    spans = Spans()
    graph_call, fused_kernel = output_code.CompiledFxGraph.__call__, torch._fused_adamw_
    output_code.CompiledFxGraph.__call__ = spans.wrap(graph_call)
    torch._fused_adamw_ = spans.wrap(fused_kernel)
    try:
        rows = {"ours": [], "theirs": []}
        for i in range(rounds):
            for key, optimizer in (("ours", ours), ("theirs", theirs))[::1 if i % 2 else -1]:
                rows[key].append(spans.step(optimizer))
    finally:
        output_code.CompiledFxGraph.__call__, torch._fused_adamw_ = graph_call, fused_kernel
    return tuple({k: statistics.median(r[k] for r in rows[key]) for k in rows[key][0]} for key in ("ours", "theirs"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/graph_calls.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="25m", help="parameter set")
    parser.add_argument("--recipes", type=names_argument(tuple(RECIPES)), default=["AdamW", "AdamW-bf16"],
                        metavar="NAMES", help=f"recipes, comma-separated, of {sorted(RECIPES)}")
    parser.add_argument("--rounds", type=positive_int_argument, default=30, metavar="N", help="timed rounds")
    parser.add_argument("--threads", type=positive_int_argument, default=1, metavar="T",
                        help="torch.set_num_threads for the run")
    args = parser.parse_args(argv)
    import os

    import torch

    torch.set_num_threads(args.threads)
    print(f"{args.size} set, {args.threads} thread(s), load {os.getloadavg()[0]:.2f}; medians of {args.rounds} "
          "steps of each, interleaved with torch.optim.AdamW(fused=True)")
    print(f"{'row':<20}" + "".join(f"{c:>11}" for c in COLUMNS))
    for recipe in args.recipes:
        ours, theirs = measure(recipe, args.size, args.rounds)
        for label, row in ((recipe, ours), ("torch AdamW fused", theirs)):
            cells = (row["step"] * 1e3, row["step"] / theirs["step"], row["graphs"] * 1e3,
                     row["graphs"] / theirs["graphs"], int(row["calls"]), row["before"] * 1e3, row["between"] * 1e3,
                     row["after"] * 1e3)
            print(f"{label:<20}" + "".join(f"{c:>11.2f}" if isinstance(c, float) else f"{c:>11}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
