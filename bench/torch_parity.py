#!/usr/bin/env python
"""How far float32 runs stay from torch.optim's own for-loop implementation, beside torch's foreach and fused.

Each optimizer takes the same float32 weights (0.01 * randn) and the same gradients (randn, a new draw
each step) for ``--steps`` steps at ``--lr``, with weight decay 0.01. The table shows
max |p - p_loop| / max |p_loop|, p_loop being torch's for-loop result, for gradwise (eager, and compiled
with ``--compiled``) and for torch's foreach and fused variants, so that gradwise's rounding error can be
read against the spread torch itself has between its implementations.
Runs in a few seconds (about a minute with ``--compiled``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

import torch

import gradwise
from gradwise.help_format import HelpFormatter

#: name: (torch class, gradwise class, keywords both take, torch variants beside the for-loop); every
#: optimizer decays weights by 0.01, so both sides take the same value whatever their defaults
PAIRS = {
    "SGD (momentum 0.9, nesterov)": (torch.optim.SGD, gradwise.SGD, dict(momentum=0.9, nesterov=True),
                                     ("foreach", "fused")),
    "Adam": (torch.optim.Adam, gradwise.Adam, {}, ("foreach", "fused")),
    "AdamW": (torch.optim.AdamW, gradwise.AdamW, {}, ("foreach", "fused")),
    "AdamW amsgrad": (torch.optim.AdamW, gradwise.AdamW, dict(amsgrad=True), ("foreach", "fused")),
    "NAdam (decoupled)": (torch.optim.NAdam, gradwise.NAdamW, dict(decoupled_weight_decay=True), ("foreach",)),
    "Adafactor": (torch.optim.Adafactor, gradwise.Adafactor, {}, ("foreach",)),
}
WEIGHT_DECAY = 0.01


def trajectory(make, steps: int, numel: int) -> torch.Tensor:
    weights = torch.nn.Parameter(0.01 * torch.randn(numel, generator=torch.Generator().manual_seed(0)))
    optimizer = make([weights])
    gradients = torch.Generator().manual_seed(1)
    for _ in range(steps):
        weights.grad = torch.randn(numel, generator=gradients)
        optimizer.step()
    return weights.detach()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/torch_parity.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=1e-2, help="learning rate of every optimizer")
    parser.add_argument("--numel", type=int, default=1000, help="elements of the one float32 parameter")
    parser.add_argument("--compiled", action="store_true", help="also run gradwise's compiled path")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    columns = ["gradwise eager"] + (["gradwise compiled"] if args.compiled else []) + ["torch foreach", "torch fused"]
    print(f"max |p - torch for-loop| / max |torch for-loop|, float32, {args.steps} steps, lr {args.lr},"
          f" {args.numel} elements")
    print(f"{'optimizer':<30}" + "".join(f"{c:>20}" for c in columns))
    for name, (torch_cls, ours, kwargs, variants) in PAIRS.items():
        kwargs = {**kwargs, "weight_decay": WEIGHT_DECAY}
        reference = trajectory(lambda ps: torch_cls(ps, lr=args.lr, foreach=False, **kwargs), args.steps, args.numel)
        runs = {"gradwise eager": lambda ps: ours(ps, lr=args.lr, compile=False, **kwargs)}
        if args.compiled:
            runs["gradwise compiled"] = lambda ps: ours(ps, lr=args.lr, compile=True, **kwargs)
        for variant in variants:
            runs[f"torch {variant}"] = lambda ps, v=variant: torch_cls(ps, lr=args.lr, **{v: True}, **kwargs)
        scale = reference.abs().max().item()
        cells = []
        for column in columns:
            if column not in runs:
                cells.append(f"{'-':>20}")
                continue
            error = (trajectory(runs[column], args.steps, args.numel) - reference).abs().max().item() / scale
            cells.append(f"{error:>20.2e}")
        print(f"{name:<30}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
