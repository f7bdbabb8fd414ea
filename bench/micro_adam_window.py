#!/usr/bin/env python
"""Why MicroAdam stalls on bench/convergence.py's least squares: its relative loss after a number of steps, beside
the same window without compression (k_init=1: every entry kept, no error to feed back) and AdamW, at a few lrs.

MicroAdam recomputes v_hat from the last m gradients only, so once t > m, v_hat ~ (1-b2) sum of m squares instead
of the mean square of about 1/(1-b2) of them: each entry in the window steps by about a constant times lr,
whatever its gradient (a sign-like step), and a constant lr stalls at a floor set by lr. The last column is that
step: the mean |p_t+1 - p_t| / lr over the entries that moved, in the last 100 steps.
Run as ``python bench/micro_adam_window.py`` (``--help`` lists the options).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

import torch

import gradwise

#: name -> (class, fixed hyperparameters); weight decay is off (the problem is unregularized)
VARIANTS = {
    "AdamW": (gradwise.AdamW, dict(weight_decay=0.0)),
    "MicroAdam": (gradwise.MicroAdam, dict(weight_decay=0.0)),  # the authors' m=10, k_init=0.01
    "MicroAdam k_init=1": (gradwise.MicroAdam, dict(weight_decay=0.0, k_init=1.0)),  # the window, uncompressed
}


def run(make, x, y, w0, steps: int) -> tuple[float, float, float]:
    """(final loss, best loss) / initial loss, and the mean |step| / lr of the moved entries in the last 100 steps."""
    w = w0.clone().requires_grad_()
    optimizer = make([w])
    n, lr = x.shape[0], optimizer.param_groups[0]["lr"]

    def loss() -> float:
        with torch.no_grad():
            return 0.5 / n * (x @ w.T - y).square().sum().item()

    initial, best, moves = loss(), 1.0, []
    for step in range(steps):
        with torch.no_grad():
            w.grad = (x @ w.T - y).T @ x / n
        before = w.detach().clone()
        optimizer.step()
        best = min(best, loss() / initial)
        if step >= steps - 100:
            moved = w.detach() != before
            moves.append(((w.detach() - before).abs().sum() / moved.sum().clamp(min=1) / lr).item())
    return loss() / initial, best, sum(moves) / len(moves)


def main(argv=None) -> int:
    from bench._progress import progress
    from bench.convergence import problem
    from gradwise.help_format import HelpFormatter

    parser = argparse.ArgumentParser(prog="bench/micro_adam_window.py", description=__doc__.split("\nRun as")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="steps per run")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1], help="the learning rates")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), help="the rows")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    x, y, w0 = problem(32, 64, 256, 2.5, 0)  # bench/convergence.py's default problem
    print(f"least squares 32x64 (bench/convergence.py's), {args.steps} steps: loss / initial at the end and at best,"
          " mean |step| / lr of the moved entries over the last 100 steps")
    rows = []
    with progress("bench/micro_adam_window.py", len(args.lrs) * len(args.variants), "runs") as advance:
        for lr in args.lrs:
            for name in args.variants:
                cls, fixed = VARIANTS[name]
                rows.append((lr, name, *run(lambda p: cls(p, lr=lr, compile=False, **fixed), x, y, w0, args.steps)))
                advance()
    for lr, name, final, best, move in rows:
        print(f"lr {lr:<8g}{name:<20}{final:>12.3e}{best:>12.3e}{move:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
