#!/usr/bin/env python
"""The external ruleset's tuners side by side (``python bench/tuners.py``): the compute each spends (its
trials' training steps) and the score it reaches, on one workload and one search space, over several studies.

Each tuner (Halton search, Hyperband through Optuna's pruner, the one-epoch Top-K baseline) runs the same
``--trials`` Halton points per study with the same seeds, so Hyperband and one-epoch choose among exactly the
points Halton trains in full. A row gives the tuner's trial-steps (and their ratio to Halton's), the workload
time AlgoPerf scores (the median over studies of the fastest trial to reach the target; inf if a study has none),
the studies that reached the target, and the best validation metric. With ``--equal-compute`` Hyperband and
one-epoch run again with as many points as Halton's trial-steps buy them at their measured cost per point,
and their rows say what that compute reaches. Trials run on one thread; the machine's load is printed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

from gradwise.help_format import HelpFormatter  # noqa: E402

#: the default space: a wide learning-rate range, so that the points' curves part early
SPACE = {"lr": {"min": 1e-5, "max": 1.0, "scaling": "log"}, "weight_decay": {"feasible_points": [0.0]}}


def run(tuner: str, trials: int, args) -> dict:
    """One tuner's studies in a fresh store: its trial-steps, workload time, hits and best metric."""
    from gradwise.arena.rulesets import Entry, plan, work
    from gradwise.arena.scoring import workload_time
    from gradwise.arena.store import Store
    from gradwise.arena.tuners import tuner_steps
    from gradwise.arena.workloads import get_workload

    w = get_workload(args.workload)
    plans = plan(Entry(f"{args.optimizer}:bench", args.optimizer, space=args.space), args.workload,
                 studies=args.studies, trials=trials, budget_scale=args.budget_scale, tuner=tuner)
    with tempfile.TemporaryDirectory() as folder:
        store = Store(str(Path(folder) / "tuners.db"))
        work(store, plans)
        studies = store.studies()
    records = [s["records"] for s in studies]
    metrics = [r["best_metric"] for rs in records for r in rs if r["best_metric"] is not None]
    return {"tuner": tuner, "points": trials, "steps": sum(tuner_steps(rs) for rs in records),
            "time": workload_time([[r["time_to_target"] if r["reached"] else math.inf for r in rs]
                                   for rs in records]),
            "hits": sum(any(r["reached"] for r in rs) for rs in records),
            "best": (max if w.higher_is_better else min)(metrics) if metrics else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/tuners.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--workload", default="digits_cnn", help="an arena workload")
    parser.add_argument("--optimizer", default="AdamW", help="the optimizer the space is for")
    parser.add_argument("--space", type=json.loads, default=SPACE, help="an AlgoPerf-form search space, JSON")
    parser.add_argument("--trials", type=int, default=9, help="Halton points per study")
    parser.add_argument("--studies", type=int, default=3, help="studies (each its own Halton points and seeds)")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="times the workload's step budget")
    parser.add_argument("--equal-compute", action="store_true",
                        help="rerun Hyperband and one-epoch with the points Halton's compute buys them")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    print(f"{args.workload}, {args.optimizer}, {args.trials} points x {args.studies} studies, budget x"
          f" {args.budget_scale}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    rows = [run(t, args.trials, args) for t in ("halton", "hyperband", "one-epoch")]
    if args.equal_compute:
        halton = rows[0]["steps"]
        rows += [run(r["tuner"], max(1, round(args.trials * halton / r["steps"])), args) for r in rows[1:]]
    print(f"{'tuner':<10} {'points':>6} {'trial-steps':>11} {'x halton':>8} {'time':>8} {'hits':>5} {'best':>7}")
    for r in rows:
        best = "-" if r["best"] is None else f"{r['best']:.4f}"
        print(f"{r['tuner']:<10} {r['points']:>6} {r['steps']:>11} {r['steps'] / rows[0]['steps']:>7.2f}x"
              f" {r['time']:>8.2f} {r['hits']:>2}/{args.studies:<2} {best:>7}")
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
