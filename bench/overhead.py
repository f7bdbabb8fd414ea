#!/usr/bin/env python
"""The per-step overhead benchmark (``python bench/overhead.py``): microseconds per optimizer step on small
parameter sets, where a step's time is mostly Python (checks, bucketing, packing, calls), not arithmetic.

The sets: each arena workload's model (``init_model(0)``), and 100 and 1,000 small tensors. On each set,
gradwise.AdamW as built by default (``compile="auto"``: on these sets eager, with torch's fused Adam kernel),
eagerly (``compile=False``: the list ops, torch's for-loop bits) and by default with every step the general one
(``steady_steps = False``, ``core/steady.py``), and with ``--rows`` compiled (``compile=True``), step in turn
with torch.optim.AdamW's three paths (its default, ``foreach=True``, ``fused=True``), all with the same
hyperparameters and the same fixed random gradients, round after round (the order rotating, so that a
noisy machine slows every row alike). A round times ``--steps`` steps of each optimizer after ``WARMUP``
untimed ones (a compile, if any, happens there); the table shows the median over rounds, in microseconds
per step and as a ratio to torch's default in the same rounds. The machine's load is printed with it.
Times are this process's CPU time (``time.process_time``): every step runs on one thread, so on a shared
machine the time other processes hold the core does not count, as wall-clock time would.

``--schedule`` steps every row as an arena trial does (``gradwise.arena.runner.run_trial``): ``train()`` where
the optimizer has one, ``step()``, then the arena's learning-rate schedule (``submissions.lr_schedule``: linear
warmup over 5% of the run's steps, then cosine decay), which sets ``lr`` before every step; all three are timed.
``--state FMT`` builds the gradwise rows with ``state=StatePolicy(FMT, min_numel=...)`` (``--min-numel``, the
policy's default unless given): the encoded step's overhead beside torch's float32 steps.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

from gradwise.cli_bench import WARMUP, positive_int_argument  # noqa: E402
from gradwise.help_format import HelpFormatter  # noqa: E402

HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
#: row label -> (library, keyword arguments besides HYPER, attributes set on the optimizer built)
ROWS = {
    "torch default": ("torch", {}, {}),
    "torch foreach": ("torch", {"foreach": True}, {}),
    "torch fused": ("torch", {"fused": True}, {}),
    "gradwise default": ("gradwise", {}, {}),
    "gradwise eager": ("gradwise", {"compile": False}, {}),
    # every step the general one (``core/steady.py`` off): what the steady step saves, in the same rounds
    "gradwise general": ("gradwise", {}, {"steady_steps": False}),
    # the compiled graph at any size (``--rows``; compiles once per set, in the untimed steps)
    "gradwise compiled": ("gradwise", {"compile": True}, {}),
}
#: the rows run unless ``--rows`` names others
DEFAULT_ROWS = [row for row in ROWS if row != "gradwise compiled"]
SMALL = {"100 small": (100, (16, 16)), "1000 small": (1000, (16,))}
#: ``--state``'s choices
FORMATS = ("bf16", "int8", "int4", "fp8")


def parameter_sets(names: list[str]) -> dict:
    """``{name: list of parameters}``: arena workloads' models and the small-tensor sets, as asked."""
    import torch

    from gradwise.arena.workloads import WORKLOADS

    sets = {}
    for name in names:
        if name in SMALL:
            count, shape = SMALL[name]
            sets[name] = [torch.nn.Parameter(torch.randn(shape)) for _ in range(count)]
        else:
            sets[name] = list(WORKLOADS[name]().init_model(0).parameters())
    return sets


def build(row: str, params: list, state=None):
    """``row``'s optimizer over copies of ``params`` holding fixed random gradients (``state``: a gradwise
    row's ``state=``)."""
    import torch

    import gradwise

    library, extra, attributes = ROWS[row]
    if library == "gradwise" and state is not None:
        extra = {**extra, "state": state}
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(copies, params):
        p.grad = torch.randn_like(q)  # fixed gradients, reused every step
    cls = torch.optim.AdamW if library == "torch" else gradwise.AdamW
    optimizer = cls(copies, **HYPER, **extra)
    for name, value in attributes.items():
        setattr(optimizer, name, value)
    return optimizer


def stepper(optimizer, schedule: bool, total: int):
    """One step of ``optimizer`` as the bench times it: ``step()``, or with ``schedule`` a trial's loop
    (``train()`` where the optimizer has one, ``step()``, the arena's LR schedule over ``total`` steps)."""
    if not schedule:
        return optimizer.step
    from gradwise.arena.runner import has_modes
    from gradwise.arena.submissions import lr_schedule

    lr = lr_schedule(optimizer, {}, total)
    modes = has_modes(optimizer)

    def step() -> None:
        if modes:
            optimizer.train()
        optimizer.step()
        lr.step()
    return step


def measure(params: list, rows: list[str], rounds: int, steps: int, schedule: bool = False,
            state=None) -> dict[str, float]:
    """Median microseconds per step of each row over ``rounds`` rounds."""
    steppers = {row: stepper(build(row, params, state), schedule, WARMUP + rounds * steps) for row in rows}
    for step in steppers.values():
        for _ in range(WARMUP):
            step()
    times: dict[str, list[float]] = {row: [] for row in rows}
    for r in range(rounds):
        order = rows[r % len(rows):] + rows[:r % len(rows)]
        for row in order:
            step = steppers[row]
            start = time.process_time()
            for _ in range(steps):
                step()
            times[row].append((time.process_time() - start) / steps * 1e6)
    return {row: statistics.median(values) for row, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    from gradwise.arena.workloads import WORKLOADS

    sets = [*WORKLOADS, *SMALL]
    parser = argparse.ArgumentParser(prog="bench/overhead.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--sets", default=",".join(sets), help=f"parameter sets, comma-separated, of {sets}")
    parser.add_argument("--rounds", type=positive_int_argument, default=7, metavar="N", help="timed rounds")
    parser.add_argument("--steps", type=positive_int_argument, default=20, metavar="N", help="steps per round")
    parser.add_argument("--threads", type=positive_int_argument, default=1, metavar="T",
                        help="torch.set_num_threads for the run")
    parser.add_argument("--schedule", action="store_true",
                        help="step as an arena trial does: train(), step(), the arena's warmup-cosine LR schedule")
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                        help=f"rows, comma-separated, of {list(ROWS)} (torch default is always one)")
    parser.add_argument("--state", choices=FORMATS, help="the gradwise rows' state format (state=)")
    parser.add_argument("--min-numel", type=int, metavar="N",
                        help="with --state: the smallest tensor encoded (StatePolicy's min_numel; else its default)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.min_numel is not None and (args.state is None or args.min_numel < 0):
        parser.error(f"argument --min-numel: {args.min_numel} needs --state and must be >= 0")
    names = args.sets.split(",")
    if bad := [n for n in names if n not in sets]:
        parser.error(f"argument --sets: {bad} not among {sets}")
    rows = ["torch default", *(row for row in args.rows.split(",") if row != "torch default")]
    if bad := [row for row in rows if row not in ROWS]:
        parser.error(f"argument --rows: {bad} not among {list(ROWS)}")
    import torch

    from gradwise import StatePolicy

    torch.set_num_threads(args.threads)
    state = None
    if args.state is not None:
        state = StatePolicy(args.state, **({} if args.min_numel is None else {"min_numel": args.min_numel}))
    how = "trial step (train, step, LR schedule)" if args.schedule else "step"
    held = "" if state is None else f"; gradwise state {state.default!r}, min_numel {state.min_numel}"
    print(f"load {os.getloadavg()[0]:.2f}, {args.threads} thread(s){held}; CPU microseconds per {how} "
          "(x torch default)")
    print(f"{'set':<22}{'params':>8}" + "".join(f"{row:>22}" for row in rows))
    results = {}
    for name, params in parameter_sets(names).items():
        medians = measure(params, rows, args.rounds, args.steps, args.schedule, state)
        base = medians["torch default"]
        results[name] = {"tensors": len(params), "numel": sum(p.numel() for p in params), "us_per_step": medians}
        cells = "".join(f"{f'{us:,.0f} ({us / base:.2f}x)':>22}" for us in medians.values())
        print(f"{name:<22}{len(params):>8}{cells}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
