#!/usr/bin/env python
"""Agreement with other libraries' Muon and SOAP: how far apart the trajectories are, step by step,
and how many steps each needs on the rotated least-squares problem of ``bench/convergence.py``.

Needs ``pytorch-optimizer`` and ``heavyball`` (install them with ``pip install --no-deps``; heavyball
also needs ``opt-einsum``); a library that is missing is skipped with a note. Trajectories: the same
parameters and the same random gradients for 30 steps; each row prints the largest relative
difference ||ours - theirs|| / ||theirs|| over the tensors at steps 1, 10 and 30.
Run as ``python bench/peers.py``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

import torch

import gradwise
from bench.convergence import LR_GRID, problem, steps_to_target

STEPS = 30


def trajectory(make, shapes, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in shapes]
    optimizer, out = make(params), []
    for t in range(STEPS):
        g = torch.Generator().manual_seed(100 + t)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g, dtype=dtype)
        optimizer.step()
        out.append([p.detach().clone() for p in params])
    return out


def distance(ours, theirs) -> list[float]:
    return [max(float((a - b).norm() / b.norm()) for a, b in zip(x, y)) for x, y in zip(ours, theirs)]


def peers():
    found = {}
    for module in ("pytorch_optimizer", "heavyball"):
        try:
            found[module] = importlib.import_module(module)
        except ImportError as error:
            print(f"{module}: not installed ({error}); skipped")
    return found


def main(argv=None) -> int:
    from gradwise.help_format import HelpFormatter

    argparse.ArgumentParser(prog="bench/peers.py", description=__doc__.split("\nRun as")[0],
                            formatter_class=HelpFormatter).parse_args(argv)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    libs = peers()
    shapes = [(16, 16), (16, 32), (32, 16)]
    muon = trajectory(lambda p: gradwise.Muon(p, lr=0.02, weight_decay=0.0), shapes)
    soap = trajectory(lambda p: gradwise.SOAP(p, lr=3e-3, weight_decay=0.0), shapes)
    rows = []
    if "pytorch_optimizer" in libs:
        po = libs["pytorch_optimizer"]
        rows.append(("Muon", "pytorch_optimizer.Muon(use_muon=True, lr=0.02, weight_decay=0)", muon,
                     trajectory(lambda p: po.Muon([dict(params=p, use_muon=True)], lr=0.02, weight_decay=0.0), shapes)))
        rows.append(("SOAP", "pytorch_optimizer.SOAP(lr=3e-3, weight_decay=0)", soap,
                     trajectory(lambda p: po.SOAP(p, lr=3e-3, weight_decay=0.0), shapes)))
    if "heavyball" in libs:
        hb = libs["heavyball"]
        rows.append(("Muon", "heavyball.Muon(lr=0.02, betas=(0.95, 0.99), weight_decay=0)", muon,
                     trajectory(lambda p: hb.Muon(p, lr=0.02, betas=(0.95, 0.99), weight_decay=0.0,
                                                  compile_step=False), shapes)))
        rows.append(("SOAP",
                     "heavyball.SOAP(lr=3e-3, betas=(0.95, 0.95), shampoo_beta=0.95, precondition_frequency=10)",
                     soap, trajectory(lambda p: hb.SOAP(p, lr=3e-3, betas=(0.95, 0.95), shampoo_beta=0.95,
                                                        weight_decay=0.0, precondition_frequency=10,
                                                        compile_step=False), shapes)))
    print(f"trajectories: {shapes} float32, random gradients, {STEPS} steps; max relative distance at steps 1, 10, 30")
    for name, label, ours, theirs in rows:
        d = distance(ours, theirs)
        print(f"  gradwise.{name:<5} vs {label:<95} {d[0]:.1e} {d[9]:.1e} {d[-1]:.1e}")
    x, y, w0 = problem(32, 64, 256, 2.5, seed=0)
    makers = {"gradwise.SOAP": lambda lr: (lambda p: gradwise.SOAP(p, lr=lr, weight_decay=0.0, compile=False))}
    if "pytorch_optimizer" in libs:
        makers["pytorch_optimizer.SOAP"] = lambda lr: (lambda p: libs["pytorch_optimizer"].SOAP(
            p, lr=lr, weight_decay=0.0))
    if "heavyball" in libs:
        makers["heavyball.SOAP"] = lambda lr: (lambda p: libs["heavyball"].SOAP(
            p, lr=lr, weight_decay=0.0, precondition_frequency=10, compile_step=False))
    print("rotated least squares (bench/convergence.py defaults, 3000 steps at most): best lr and steps to target")
    for name, make in makers.items():
        results = {lr: steps_to_target(make(lr), x, y, w0, 1e-6, 3000) for lr in LR_GRID}
        reached = {lr: s for lr, s in results.items() if s is not None}
        best = min(reached, key=reached.get) if reached else None
        print(f"  {name:<24} best lr {best if best is None else f'{best:.0e}'}  steps {reached.get(best)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
