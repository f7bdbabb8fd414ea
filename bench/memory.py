#!/usr/bin/env python
"""The memory benchmark: optimizer state bytes per parameter, and what the smaller state costs in loss.

Each numbered measurement has a flag (``--bytes``, ``--quality``, ``--peak``, ...); a flag runs its
measurement alone, and with no flag 1 and 2 run.

1. ``--bytes``: state bytes per parameter element of AdamW on a GPT-2-shaped set, per state format, and of the
   memory-lean recipes (Adafactor, CAME, AdamMini) in fp32: predicted by ``gradwise.estimate``
   (nothing allocated) and, with ``--measure``, counted in ``optimizer.state`` after one real step.
2. ``--quality``: the mean final loss over seeds of AdamW with each state format against float32 on a
   small MLP regression whose inputs carry large outlier features (features 0-3 scaled by 100, 50,
   30 and 200): the case in which block-wise quantization of the second moment loses (an outlier
   column shares every block of a row-major weight) and rank-1 normalization does not.
3. ``--peak``: the peak process memory of one training step of a small transformer, with and
   without the update inside backward (``bench/_memory_peak.py``).
4. ``--param-rounding``: bfloat16 parameters trained with round-to-nearest and with stochastic
   rounding against float32 (``bench/_memory_rounding.py``).
5. ``--recipe-quality``: the loss each state format costs Muon, Shampoo, SOAP and AdamW
   (``bench/_memory_recipe_quality.py``).
6. ``--arena-quality``: the loss each state format costs AdamW on the arena's workloads
   (``bench/_memory_arena_quality.py``).
7. ``--references``: torchao's and bitsandbytes' AdamW8bit against torch's AdamW, where they run.

Run as ``python bench/memory.py``; ``--help`` lists the options.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

FORMATS = ("fp32", "bf16", "int8", "int4", "fp8")
#: the flags that name a measurement (``args`` attributes); with none given, the first two run.
MEASUREMENTS = ("bytes", "quality", "peak", "param_rounding", "recipe_quality", "arena_quality", "references")
#: the quality task: inputs, outlier features and their scales.
FEATURES, OUTLIERS = 32, (100.0, 50.0, 30.0, 200.0)


def state_bytes_per_param(size: str, formats=FORMATS, measure: bool = False, log=print) -> list[dict]:
    import torch

    import gradwise
    from bench.step import state_bytes
    from gradwise.shapes import SIZES, gpt2_shapes

    shapes = gpt2_shapes(*SIZES[size])
    rows = []
    for fmt in formats:
        meta = [(name, torch.empty(shape, device="meta")) for name, shape in shapes]
        predicted = gradwise.estimate(meta, gradwise.AdamW, state=fmt)
        row = {"format": fmt, "params": predicted.params, "predicted_bytes": predicted.total,
               "predicted_per_param": predicted.bytes_per_param}
        if measure:
            log(f"one AdamW step with {fmt} state on {size}")
            params = [(name, torch.nn.Parameter(torch.randn(shape) * 0.02)) for name, shape in shapes]
            for _, p in params:
                p.grad = torch.randn_like(p) * 1e-3
            opt = gradwise.AdamW(params, lr=1e-3, state=fmt, compile=False)
            start = time.perf_counter()
            opt.step()
            row.update(measured_bytes=state_bytes(opt), measured_per_param=state_bytes(opt) / predicted.params,
                       eager_step_s=time.perf_counter() - start)
            del opt, params
        rows.append(row)
    return rows


#: the memory-lean recipes: name -> keyword arguments on the GPT-2 set (AdamMini: GPT-2's width and heads).
LEAN_RECIPES = {"Adafactor": {}, "CAME": {"lr": 2e-4}, "AdamMini": {"dim": 768, "n_heads": 12}}


def recipe_state_bytes(size: str, measure: bool = False, log=print) -> list[dict]:
    """State bytes per parameter element of each recipe in ``LEAN_RECIPES`` (fp32 state), as above."""
    import torch

    import gradwise
    from bench.step import state_bytes
    from gradwise.shapes import SIZES, gpt2_shapes

    shapes = gpt2_shapes(*SIZES[size])
    rows = []
    for name, kwargs in LEAN_RECIPES.items():
        recipe = getattr(gradwise, name)
        meta = [(n, torch.empty(shape, device="meta")) for n, shape in shapes]
        predicted = gradwise.estimate(meta, recipe, **kwargs)
        row = {"recipe": name, "predicted_per_param": predicted.bytes_per_param}
        if measure:
            log(f"one {name} step on {size}")
            params = [(n, torch.nn.Parameter(torch.randn(shape) * 0.02)) for n, shape in shapes]
            for _, p in params:
                p.grad = torch.randn_like(p) * 1e-3
            opt = recipe(params, compile=False, **kwargs)
            opt.step()
            row["measured_per_param"] = state_bytes(opt) / predicted.params
            del opt, params
        rows.append(row)
    if measure:  # the reference, measured the same way
        log(f"one torch.optim.Adafactor step on {size}")
        params = [torch.nn.Parameter(torch.randn(shape) * 0.02) for _, shape in shapes]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt = torch.optim.Adafactor(params)
        opt.step()
        held = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
        rows.append({"recipe": "torch.optim.Adafactor", "predicted_per_param": None,
                     "measured_per_param": held / sum(p.numel() for p in params)})
    return rows


#: the low-rank recipes on the GPT-2 set: the attention and MLP matrices are projected, embeddings, norms
#: and biases not; rank None: width / 3 (256 at width 768, the GaLore and APOLLO papers' rank at 130M).
LOW_RANK = {"GaLoreAdamW": dict(rank=None), "APOLLO": dict(rank=None), "APOLLOMini": dict(rank=1),
            "FRUGAL": dict(rank=None), "SubsetNorm": dict(rank=None)}


def low_rank_state_bytes(size: str, measure: bool = False, log=print) -> list[dict]:
    """State bytes per parameter element of AdamW and of the low-rank recipes (see ``LOW_RANK``)."""
    import torch

    import gradwise
    from bench.step import state_bytes
    from gradwise.shapes import SIZES, gpt2_shapes
    from gradwise.transforms.route import matrices

    shapes = gpt2_shapes(*SIZES[size])
    rows = []
    for label, projection in {"AdamW": {}, **LOW_RANK}.items():
        projection = {k: v or SIZES[size][2] // 3 for k, v in projection.items()}
        def groups(device):
            params = [(name, torch.nn.Parameter(torch.empty(shape, device=device))) for name, shape in shapes]
            matrix = [matrices(n, p) == "matrix" for n, p in params]
            return [{"params": [q for q, m in zip(params, matrix) if not m], **({"rank": None} if projection else {})},
                    {"params": [q for q, m in zip(params, matrix) if m], **projection}]

        recipe = getattr(gradwise, label)
        predicted = gradwise.estimate(groups("meta"), recipe)
        matrix_numel = sum(p.numel() for _, p in groups("meta")[1]["params"])
        row = {"recipe": label, "predicted_per_param": predicted.bytes_per_param,
               "matrices_per_param": predicted.by("group")[1] / matrix_numel}
        if measure:
            log(f"one {label} step on {size}")
            opt = recipe(groups("cpu"), lr=1e-3, compile=False)
            for group in opt.param_groups:
                for p in group["params"]:
                    p.data.normal_(0, 0.02)
                    p.grad = torch.randn_like(p) * 1e-3
            start = time.perf_counter()
            opt.step()
            row.update(measured_per_param=state_bytes(opt) / predicted.params, eager_step_s=time.perf_counter() - start)
            del opt
        rows.append(row)
    return rows


def outlier_task(seed: int):
    """Batches of the quality task: y = tanh(3 x_n w) + 0.1 sin(x_4) with x_n the input without its
    outlier scales, so the outlier features matter no more than the others."""
    import torch

    scale = torch.ones(FEATURES)
    scale[: len(OUTLIERS)] = torch.tensor(OUTLIERS)
    teacher = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(seed)) / FEATURES**0.5

    def batch(step: int, size: int = 256):
        x = torch.randn(size, FEATURES, generator=torch.Generator().manual_seed(seed * 100_000 + step)) * scale
        return x, torch.tanh((x / scale) @ teacher * 3) + 0.1 * torch.sin(x[:, 4:5])

    return batch


def final_loss(state, seed: int, steps: int = 400, hidden: int = 256, lr: float = 1e-3, compile=False) -> float:
    """Mean training loss of the last 20 steps of AdamW with ``state`` on the outlier task."""
    import torch

    import gradwise

    batch = outlier_task(seed)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden),
                              torch.nn.GELU(), torch.nn.Linear(hidden, 1))
    opt = gradwise.AdamW(net.parameters(), lr=lr, weight_decay=0.01, state=state, compile=compile)
    losses = []
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return statistics.fmean(losses[-20:])


def quality(formats=FORMATS, seeds=(0, 1, 2), steps=400, hidden=256, log=print) -> list[dict]:
    rows = []
    for fmt in formats:
        log(f"quality: {fmt}, seeds {list(seeds)}")
        losses = [final_loss(None if fmt == "fp32" else fmt, s, steps, hidden) for s in seeds]
        rows.append({"format": fmt, "losses": losses, "mean": statistics.fmean(losses)})
    base = next(r["mean"] for r in rows if r["format"] == "fp32")
    for r in rows:
        r["vs_fp32"] = r["mean"] / base
    return rows


def reference_distances(steps: int = 30, log=print) -> list[dict]:
    """Distance to torch's float32 AdamW, relative to how far it moved, of 8-bit AdamWs stepped with
    the same gradients on a 256x512 weight whose first four input columns get gradients 101 times
    larger: ours, and torchao's and bitsandbytes' where they import and run on this machine."""
    import importlib

    import torch

    import gradwise

    shape, lr, wd = (256, 512), 1e-3, 0.01
    init = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 0.02
    makers = {"torch AdamW fp32": lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=wd)}
    for fmt in ("int8", "int8-b256-block", "int8-b2048-block"):
        makers[f"gradwise {fmt}"] = lambda p, fmt=fmt: gradwise.AdamW(p, lr=lr, weight_decay=wd, state=fmt,
                                                                      compile=False)
    for module, attr, label in (("torchao.optim", "AdamW8bit", "torchao AdamW8bit"),
                                ("bitsandbytes.optim", "AdamW8bit", "bitsandbytes AdamW8bit")):
        try:
            cls = getattr(importlib.import_module(module), attr)
        except Exception as error:  # not installed, or no backend for this machine
            log(f"{label}: not run ({type(error).__name__}: {error})")
            continue
        makers[label] = lambda p, cls=cls: cls(p, lr=lr, weight_decay=wd)
    trajectories = {}
    for label, make in makers.items():
        p = torch.nn.Parameter(init.clone())
        try:
            opt = make([p])
            out = []
            for step in range(steps):
                g = torch.randn(shape, generator=torch.Generator().manual_seed(step))
                p.grad = g * (1 + 100 * (torch.arange(shape[1]) < 4))
                opt.step()
                out.append(p.detach().clone())
        except Exception as error:
            log(f"{label}: failed on this machine ({type(error).__name__}: {error})")
            continue
        trajectories[label] = out
    reference = trajectories.pop("torch AdamW fp32")
    rows = []
    for label, out in trajectories.items():
        distance = [float((a - b).norm() / (b - init).norm()) for a, b in zip(out, reference)]
        rows.append({"optimizer": label, "step_1": distance[0], "step_10": distance[min(9, steps - 1)],
                     "final": distance[-1]})
    return rows


def _print_bytes(args, log) -> None:
    """Measurement 1: the state bytes tables."""
    if args.formats:
        print(f"AdamW state bytes per parameter element, {args.size} GPT-2 set (tensors under 4096 elements stay fp32)")
        print(f"{'format':<8}{'predicted':>12}{'measured':>12}{'eager step s':>14}")
        for r in state_bytes_per_param(args.size, args.formats.split(","), measure=args.measure, log=log):
            measured = f"{r['measured_per_param']:>12.4f}{r['eager_step_s']:>14.2f}" if "measured_bytes" in r else ""
            print(f"{r['format']:<8}{r['predicted_per_param']:>12.4f}{measured}")
    print(f"\nMemory-lean recipes, state bytes per parameter element, {args.size} GPT-2 set (fp32 state)")
    print(f"{'recipe':<24}{'predicted':>12}{'measured':>12}")
    for r in recipe_state_bytes(args.size, measure=args.measure, log=log):
        measured = f"{r['measured_per_param']:>12.4f}" if "measured_per_param" in r else ""
        # torch's row has no prediction (gradwise.estimate reads gradwise optimizers only)
        predicted = f"{'-':>12}" if r["predicted_per_param"] is None else f"{r['predicted_per_param']:>12.4f}"
        print(f"{r['recipe']:<24}{predicted}{measured}")
    print(f"\nLow-rank recipes, state bytes per parameter element, {args.size} GPT-2 set (attention and MLP"
          " matrices projected; 'matrices': their state over their elements, step counters included)")
    print(f"{'recipe':<14}{'matrices':>10}{'predicted':>12}{'measured':>12}{'eager step s':>14}")
    for r in low_rank_state_bytes(args.size, measure=args.measure, log=log):
        measured = f"{r['measured_per_param']:>12.4f}{r['eager_step_s']:>14.2f}" if "measured_per_param" in r else ""
        print(f"{r['recipe']:<14}{r['matrices_per_param']:>10.4f}{r['predicted_per_param']:>12.4f}{measured}")


def _print_quality(args, log) -> None:
    """Measurement 2: the loss each state format costs AdamW on the outlier MLP."""
    formats = [f for f in args.quality_formats.split(",") if f]
    if "fp32" not in formats:
        formats.insert(0, "fp32")
    print(f"\nMean final loss (last 20 of {args.steps} steps) over {args.seeds} seeds, MLP with outlier features")
    print(f"{'format':<20}{'mean':>10}{'vs fp32':>10}   per seed")
    for r in quality(formats, tuple(range(args.seeds)), args.steps, log=log):
        print(f"{r['format']:<20}{r['mean']:>10.5f}{r['vs_fp32']:>10.4f}   {[round(v, 5) for v in r['losses']]}")


def main(argv: list[str] | None = None) -> int:
    from gradwise.help_format import HelpFormatter

    parser = argparse.ArgumentParser(prog="bench/memory.py", description=__doc__.split("\n\nRun as")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--bytes", action="store_true", help="1: state bytes per parameter (seconds; minutes with"
                        " --measure at 124m)")
    parser.add_argument("--quality", action="store_true", help="2: loss per state format on the outlier MLP (minutes)")
    parser.add_argument("--peak", action="store_true",
                        help="3: the peak process memory of a small transformer's training step with and"
                             " without the update inside backward (bench/_memory_peak.py)")
    parser.add_argument("--param-rounding", action="store_true",
                        help="4: bfloat16 parameters trained with each param_rounding against float32"
                             " (bench/_memory_rounding.py)")
    parser.add_argument("--recipe-quality", action="store_true",
                        help="5: state formats on Muon, Shampoo, SOAP and AdamW (bench/_memory_recipe_quality.py)")
    parser.add_argument("--arena-quality", action="store_true",
                        help="6: AdamW on the arena's workloads, each state format (bench/_memory_arena_quality.py)")
    parser.add_argument("--references", action="store_true",
                        help="7: torchao's and bitsandbytes' AdamW8bit against torch's AdamW, where they run")
    parser.add_argument("--size", default="124m", choices=("tiny", "25m", "124m"), help="1: GPT-2 parameter set")
    parser.add_argument("--measure", action="store_true", help="1: also allocate the state with one real step")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help="1: comma-separated AdamW state formats for the bytes table ('' skips it)")
    parser.add_argument("--quality-formats", default="fp32,bf16,int8,int4,fp8,int8-b2048-block",
                        help="2: comma-separated formats for the quality runs (fp32 always runs)")
    parser.add_argument("--steps", type=int, default=400, help="2: training steps per run")
    parser.add_argument("--seeds", type=int, default=3, help="2: seeds per format")
    parser.add_argument("--arena-quality-min-numel", type=int, default=0,
                        help="6: encode buffers of at least this many elements (0: all)")
    parser.add_argument("--arena-quality-formats", default="fp32,bf16,int8,int4,fp8",
                        help="6: comma-separated formats for the arena runs (fp32 always runs)")
    args = parser.parse_args(argv)
    if not any(getattr(args, m) for m in MEASUREMENTS):
        args.bytes = args.quality = True
    import torch

    torch.set_num_threads(1)
    log = lambda message: print(f"# {message}", file=sys.stderr, flush=True)  # noqa: E731
    if args.bytes:
        _print_bytes(args, log)
    if args.quality:
        _print_quality(args, log)
    if args.references:
        print("\n8-bit AdamW, distance to torch's fp32 AdamW relative to its movement (outlier columns)")
        print(f"{'optimizer':<28}{'step 1':>10}{'step 10':>10}{'step 30':>10}")
        for r in reference_distances(log=log):
            print(f"{r['optimizer']:<28}{r['step_1']:>10.2e}{r['step_10']:>10.2e}{r['final']:>10.2e}")
    if args.peak:
        from bench._memory_peak import print_table, run_all

        print_table(run_all(log=log))
    if args.param_rounding:
        from bench import _memory_rounding

        _memory_rounding.print_table(_memory_rounding.compare(log=log))
    if args.recipe_quality:
        from bench import _memory_recipe_quality

        _memory_recipe_quality.print_table(_memory_recipe_quality.compare(log=log))
    if args.arena_quality:
        from bench import _memory_arena_quality

        min_numel = args.arena_quality_min_numel
        formats = ["fp32", *(f for f in args.arena_quality_formats.split(",") if f and f != "fp32")]
        _memory_arena_quality.print_table(_memory_arena_quality.compare(formats=formats, min_numel=min_numel, log=log),
                                          min_numel)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
