#!/usr/bin/env python
"""Steps to a tight target on least squares with rotated ill-conditioning, each optimizer tuned on
one learning-rate grid.

The problem: min_W 0.5/n ||X W^T - Y||_F^2 with X = U diag(s) V^T, U and V random orthogonal and s
log-spaced over ``decades`` decades (10^2.5 by default: the Hessian's condition number is 10^5), and
Y = X W*^T, so the minimum is 0. The ill-conditioning is rotated: no coordinate axis lines up with
it, so a diagonal preconditioner (Adam) cannot undo it while a Kronecker-factored one can. Gradients
are full-batch and exact. Each (optimizer, lr) run stops when loss <= ``target`` * initial loss, or
after ``max_steps``; each optimizer's row reports its best lr and the steps it needed there.
Run as ``python bench/convergence.py`` (``--help`` lists the options).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

import torch

import gradwise

#: name -> (class, fixed hyperparameters). Shampoo, SOAP, KLShampoo and KLSOAP recompute their preconditioners
#: every 10 steps, PSGDKron fits its own on pytorch-optimizer's schedule; weight decay is off everywhere (the problem
#: is unregularized).
OPTIMIZERS = {
    "AdamW": (gradwise.AdamW, dict(weight_decay=0.0, betas=(0.9, 0.999))),
    "Shampoo": (gradwise.Shampoo, dict(weight_decay=0.0, precondition_frequency=10)),
    "SOAP": (gradwise.SOAP, dict(weight_decay=0.0, precondition_frequency=10)),
    "Muon": (gradwise.Muon, dict(weight_decay=0.0, ns_dtype=torch.float32)),
    "PSGDKron": (gradwise.PSGDKron, dict(weight_decay=0.0)),
    "KLShampoo": (gradwise.KLShampoo, dict(weight_decay=0.0, precondition_frequency=10)),
    "KLSOAP": (gradwise.KLSOAP, dict(weight_decay=0.0, precondition_frequency=10)),
    "MicroAdam": (gradwise.MicroAdam, dict(weight_decay=0.0)),  # the authors' window of 10, 1% Top-K
    # the other recipes of issue 16 at their defaults (AdamC without weight decay is AdamW, BAdam on one tensor is
    # its inner optimizer, MeZO steps from closures: none of the three is here); FRUGAL with AdamW on a rank-8
    # subspace, signSGD on the rest
    "ADOPT": (gradwise.ADOPT, dict(weight_decay=0.0)),
    "AdEMAMix": (gradwise.AdEMAMix, dict(weight_decay=0.0)),
    "MARS": (gradwise.MARS, dict(weight_decay=0.0)),
    "SPAM": (gradwise.SPAM, dict(weight_decay=0.0)),
    "NorMuon": (gradwise.NorMuon, dict(weight_decay=0.0, ns_dtype=torch.float32)),
    "FRUGAL": (gradwise.FRUGAL, dict(weight_decay=0.0, rank=8)),
    "SubsetNorm": (gradwise.SubsetNorm, dict(weight_decay=0.0)),
}
LR_GRID = [10 ** (k / 2) for k in range(-8, 2)]  # 1e-4, 3e-4, ..., 1, 3


def problem(rows: int, cols: int, n: int, decades: float, seed: int):
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(n, cols, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(cols, cols, generator=gen))
    s = torch.logspace(0, -decades, cols) * math.sqrt(n)
    x = (u * s) @ v.T
    w_star = torch.randn(rows, cols, generator=gen)
    return x, x @ w_star.T, torch.zeros(rows, cols)


def steps_to_target(make, x, y, w0, target: float, max_steps: int) -> int | None:
    w = w0.clone().requires_grad_()
    optimizer = make([w])
    n = x.shape[0]
    with torch.no_grad():
        initial = 0.5 / n * (x @ w.T - y).square().sum()
    for step in range(1, max_steps + 1):
        with torch.no_grad():
            residual = x @ w.T - y
            loss = 0.5 / n * residual.square().sum()
            if not torch.isfinite(loss):
                return None
            if loss <= target * initial:
                return step - 1
            w.grad = residual.T @ x / n
        optimizer.step()
    return None


def sweep(args, advance=lambda: None) -> list[dict]:
    """One row per optimizer: its best lr on ``LR_GRID`` and the steps it needed; ``advance`` is called
    after each (optimizer, lr) run."""
    torch.set_num_threads(1)
    x, y, w0 = problem(args.rows, args.cols, args.samples, args.decades, args.seed)
    rows = []
    for name in args.optimizers:
        cls, fixed = OPTIMIZERS[name]
        results = {}
        for lr in LR_GRID:
            results[lr] = steps_to_target(lambda p: cls(p, lr=lr, compile=False, **fixed), x, y, w0,
                                          args.target, args.max_steps)
            advance()
        reached = {lr: s for lr, s in results.items() if s is not None}
        best = min(reached, key=reached.get) if reached else None
        rows.append(dict(optimizer=name, best_lr=best, steps=reached.get(best),
                         grid={f"{lr:.0e}": s for lr, s in results.items()}))
    return rows


def main(argv=None) -> int:
    from bench._progress import progress
    from gradwise.help_format import HelpFormatter

    parser = argparse.ArgumentParser(prog="bench/convergence.py", description=__doc__.split("\nRun as")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--rows", type=int, default=32, help="rows of W (outputs)")
    parser.add_argument("--cols", type=int, default=64, help="columns of W (inputs)")
    parser.add_argument("--samples", type=int, default=256, help="rows of X")
    parser.add_argument("--decades", type=float, default=2.5, help="singular values of X span 10^decades")
    parser.add_argument("--target", type=float, default=1e-6, help="stop at loss <= target * initial loss")
    parser.add_argument("--max-steps", type=int, default=20000, help="steps per run at most")
    parser.add_argument("--seed", type=int, default=0, help="seed of X, W* and W0")
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS),
                        help="the optimizers swept")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    with progress("bench/convergence.py", len(args.optimizers) * len(LR_GRID), "(optimizer, lr) runs") as advance:
        rows = sweep(args, advance)
    if args.json:
        print(json.dumps(dict(args=vars(args), rows=rows)))
        return 0
    adamw = next((r["steps"] for r in rows if r["optimizer"] == "AdamW"), None)
    print(f"least squares {args.rows}x{args.cols}, {args.samples} samples, singular values over 10^{args.decades},"
          f" target loss <= {args.target:g} x initial, at most {args.max_steps} steps,"
          f" lr grid {LR_GRID[0]:g}..{LR_GRID[-1]:g}")
    print(f"{'optimizer':<10}{'best lr':>10}{'steps':>8}{'vs AdamW':>10}   steps per lr (- : not reached)")
    for r in rows:
        ratio = f"{adamw / r['steps']:.1f}x" if adamw and r["steps"] else "-"
        grid = " ".join(f"{lr}:{s if s is not None else '-'}" for lr, s in r["grid"].items())
        best = f"{r['best_lr']:.0e}" if r["best_lr"] else "-"
        print(f"{r['optimizer']:<10}{best:>10}{r['steps'] if r['steps'] is not None else '-':>8}{ratio:>10}   {grid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
