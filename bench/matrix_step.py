#!/usr/bin/env python
"""Step time of the matrix optimizers on a GPT-2-shaped set: the plain step and the step that
recomputes the preconditioner, measured apart, and the amortized step at several frequencies.

For each row (Shampoo, SOAP, Muon; blocks batched or one at a time) the optimizer runs with its
preconditioner recomputed every second step, so plain steps and recomputing steps alternate; their
medians give the amortized step at frequency f as ((f - 1) plain + recompute) / f (Muon has no
recomputation: its rows are one plain median). torch.optim.AdamW(foreach=True) steps between them,
interleaved, for the ratio. Gradients are random and fixed. Shampoo uses ``max_preconditioner_dim``
1024 (Distributed Shampoo's own default; its README's 8192 would make one 8192 x 8192 eigh per
embedding block), SOAP the same block limit. Run as ``python bench/matrix_step.py``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

import torch

import gradwise
from bench.step import count_label
from gradwise.shapes import SIZES, gpt2_shapes

FREQUENCIES = (1, 10, 100)
#: --blocks: Shampoo's and SOAP's ``batch_blocks`` (Muon always batches same-shaped matrices)
BLOCKS = {"batched": True, "one-by-one": False}
ROWS = {
    "Shampoo": lambda batch, dim: (gradwise.Shampoo, dict(lr=1e-3, precondition_frequency=2,
                                                          start_preconditioning_step=1,
                                                          max_preconditioner_dim=dim, batch_blocks=batch)),
    "SOAP": lambda batch, dim: (gradwise.SOAP, dict(lr=3e-3, precondition_frequency=2, max_precond_dim=dim,
                                                    batch_blocks=batch)),
    "Muon": lambda batch, dim: (gradwise.Muon, dict(lr=0.02)),
}


def _ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def build(cls, shapes, values, grads, hyper):
    params = []
    for (name, _), value, grad in zip(shapes, values, grads):
        p = torch.nn.Parameter(value.clone())
        p.grad = grad
        params.append((name, p))
    return cls(params, compile=False, **hyper)


def measure(args, log=print, advance=lambda: None) -> list[dict]:
    """One row per (recipe, blocks): plain, recomputing and amortized step times; ``advance`` is called
    after each optimizer step."""
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    shapes = gpt2_shapes(*SIZES[args.size])
    values = [torch.randn(s, generator=gen) * 0.02 for _, s in shapes]
    grads = [torch.randn(s, generator=gen) * 1e-3 for _, s in shapes]
    numel = sum(v.numel() for v in values)
    log(f"{args.size}: {count_label(numel)} parameters, {len(shapes)} tensors, {args.threads} thread(s)")
    reference = torch.optim.AdamW([torch.nn.Parameter(v.clone()) for v in values], lr=1e-3, foreach=True)
    for p, g in zip(reference.param_groups[0]["params"], grads):
        p.grad = g
    reference.step()
    rows = []
    for name in args.recipes:
        for batch in ((True,) if name == "Muon" else [BLOCKS[b] for b in args.blocks]):
            cls, hyper = ROWS[name](batch, args.max_dim)
            opt = build(cls, shapes, values, grads, hyper)
            opt.step(), advance(), opt.step(), advance()  # warm-up: state allocation, first bases
            plain, recompute, torch_ms = [], [], []
            for step in range(3, 3 + 2 * args.rounds):
                t = _ms(opt.step)
                advance()
                # Shampoo (start 1, every 2) recomputes at odd steps; SOAP (every 2) at even ones
                recomputes = name != "Muon" and (step % 2 == (1 if name == "Shampoo" else 0))
                (recompute if recomputes else plain).append(t)
                torch_ms.append(_ms(reference.step))
            p, ref = statistics.median(plain), statistics.median(torch_ms)
            r = statistics.median(recompute) if recompute else None
            row = dict(recipe=name, blocks="batched" if batch else "one by one", plain_ms=p, recompute_ms=r,
                       torch_adamw_ms=ref)
            for f in FREQUENCIES:
                row[f"f{f}_ms"] = p if r is None else ((f - 1) * p + r) / f
            rows.append(row)
            log(f"{name:<8} {row['blocks']:<11} plain {p:9.1f} ms  recompute {'-' if r is None else f'{r:.1f}':>9} ms  "
                + "  ".join(f"f={f}: {row[f'f{f}_ms']:9.1f} ms ({row[f'f{f}_ms'] / ref:5.1f}x AdamW)"
                            for f in FREQUENCIES)
                + f"  [torch AdamW foreach {ref:.1f} ms]")
            del opt
    return rows


def main(argv=None) -> int:
    from bench._progress import progress
    from gradwise.help_format import HelpFormatter

    parser = argparse.ArgumentParser(prog="bench/matrix_step.py", description=__doc__.split(" Run as")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--size", choices=tuple(SIZES), default="25m", help="GPT-2 parameter set")
    parser.add_argument("--rounds", type=int, default=2, help="plain and recomputing steps timed, each")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--max-dim", type=int, default=1024, help="max_preconditioner_dim / max_precond_dim")
    parser.add_argument("--recipes", nargs="+", default=list(ROWS), choices=list(ROWS), help="the rows measured")
    parser.add_argument("--blocks", nargs="+", default=list(BLOCKS), choices=list(BLOCKS),
                        help="Shampoo's and SOAP's blocks: batched across parameters, one at a time, or both")
    args = parser.parse_args(argv)
    rows = sum(1 if name == "Muon" else len(args.blocks) for name in args.recipes)
    with progress("bench/matrix_step.py", rows * (2 + 2 * args.rounds), "optimizer steps") as advance:
        measure(args, advance=advance)
    return 0


if __name__ == "__main__":
    sys.exit(main())
