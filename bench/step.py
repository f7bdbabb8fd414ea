#!/usr/bin/env python
"""The optimizer step benchmark (``gradwise bench step``, or ``python bench/step.py``): median step time of each
recipe on a GPT-2-shaped parameter set; its rows and options are ``gradwise.cli_bench``'s.

Every row is measured against torch.optim.AdamW(fused=True) and AdamW(foreach=True) in the same
process, interleaved: the row's optimizer and the two torch optimizers step in turn, round after round
(the order rotating), so a noisy machine slows all three alike and each ratio compares one time window.
The two torch optimizers live through the whole run; each recipe's optimizer and its parameters are
freed before the next (at 124M parameters: about 4 GB for torch's two, 2 GB per recipe).
Gradients are random and fixed: set once and reused every step. The first (warm-up) step of a compiled
optimizer includes compilation; its seconds come from ``optimizer.compile_stats`` and are reported
separately, and timed steps that compiled again are dropped from the median and counted.

The memory-bandwidth bound of a step is ``bytes moved per parameter * parameters / copy bandwidth``,
the bandwidth measured in the same run as (bytes read + bytes written) / time of ``dst.copy_(src)``.

``--peers`` adds each recipe's reference implementation where one is installed (``PEERS``), built with the recipe's
hyperparameters and timed as a row of its own in the same interleaved rounds.

``--device cuda`` puts the parameters, gradients, state and the copy on the GPU; every timing waits for the
device before and after (``torch.<device>.synchronize``, a no-op on the CPU), so one code path times both.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

from gradwise.cli_bench import PATHS, RECIPES, STEP_DESCRIPTION, WARMUP, add_step_arguments
from gradwise.shapes import SIZES, gpt2_shapes

#: the torch reference rows: torch.optim.AdamW with the gradwise AdamW row's hyperparameters.
REFERENCES = {"fused": {"fused": True}, "foreach": {"foreach": True}}


def _schedulefree_adamw(params, **hyper):
    import schedulefree

    optimizer = schedulefree.AdamWScheduleFree(params, foreach=True, **hyper)
    optimizer.train()  # it starts in eval mode
    return optimizer


def _torch_optimizer(name: str, **fixed):
    def make(params, **hyper):
        import torch

        return getattr(torch.optim, name)(params, **hyper, **fixed)
    return make


def _lion_pytorch(params, **hyper):
    from lion_pytorch import Lion

    return Lion(params, **hyper)


#: ``--peers``: recipe -> (the row's path, the module it needs, a constructor taking the recipe's hyperparameters): each
#: recipe's reference implementation, on its fastest path that computes the same step (foreach where it has one)
PEERS = {
    "NAdamW": ("peer: torch NAdam foreach", "torch", _torch_optimizer("NAdam", decoupled_weight_decay=True,
                                                                       foreach=True)),
    "SGD": ("peer: torch SGD foreach", "torch", _torch_optimizer("SGD", foreach=True)),
    "ScheduleFreeAdamW": ("peer: schedulefree", "schedulefree", _schedulefree_adamw),
    "Lion": ("peer: lion-pytorch", "lion_pytorch", _lion_pytorch),
}


def count_label(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


# ------------------------------------------------------------------------------ measuring
def _ms(fn, device: str = "cpu") -> float:
    """Milliseconds of ``fn()``, the device's queued work finished before the clock starts and before it stops."""
    import torch

    synchronize = getattr(torch, device).synchronize
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    return (time.perf_counter() - start) * 1e3


def bandwidth(op: str = "copy", megabytes: int = 512, device: str = "cpu", repeats: int = 7) -> list[float]:
    """(bytes read + bytes written) / seconds of ``dst.copy_(src)`` (``op="copy"``: 2 x size) or of
    ``dst.add_(src)`` (``op="add"``: 3 x size), once per repeat, in bytes/s. A copy's destination is
    written without being read, which costs most CPUs a read too (write-allocate) that is not counted;
    the in-place add, which reads what it writes like an optimizer step, is reported for comparison."""
    import torch

    src = torch.ones(megabytes << 18, device=device)
    dst = torch.zeros_like(src)
    run, moved = (dst.copy_, 2) if op == "copy" else (dst.add_, 3)
    run(src)  # fault the pages in
    return [moved * src.nbytes / (_ms(lambda: run(src), device) / 1e3) for _ in range(repeats)]


def state_bytes(optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state``, the 0-d 'step' counters included."""
    import torch

    return sum(v.nbytes for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))


class Bench:
    """A fixed parameter set (values and gradients) and the two torch reference optimizers."""

    def __init__(self, size: str, seed: int = 0, device: str = "cpu"):
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.device = device
        self.shapes = gpt2_shapes(*SIZES[size])
        self.values = [(torch.randn(s, generator=generator) * 0.02).to(device) for _, s in self.shapes]
        self.grads = [(torch.randn(s, generator=generator) * 1e-3).to(device) for _, s in self.shapes]
        self.numel = sum(v.numel() for v in self.values)
        self.refs = {name: self.build(torch.optim.AdamW, RECIPES["AdamW"][1], kw) for name, kw in REFERENCES.items()}
        for opt in self.refs.values():
            for _ in range(WARMUP):
                opt.step()
        self.ref_times: dict[str, list[float]] = {name: [] for name in self.refs}

    def build(self, cls, hyper: dict, extra: dict, named: bool = False):
        """``cls`` over fresh copies of the values (``named``: as ``(name, parameter)`` pairs, which Muon's
        routing reads), every gradient shared."""
        import torch

        params = []
        for (name, _), value, grad in zip(self.shapes, self.values, self.grads):
            p = torch.nn.Parameter(value.clone())
            p.grad = grad  # shared by every optimizer: nothing writes to gradients
            params.append((name, p) if named else p)
        return cls(params, **hyper, **extra)

    def rounds(self, opt, steps: int) -> tuple[list[float], dict[str, list[float]], int]:
        """Step ``opt`` and the references in turn; ``opt``'s times (steps that compiled dropped), the
        references' times in this window, and how many timed steps compiled."""
        contenders = [("row", opt)] + list(self.refs.items()) if opt is not None else list(self.refs.items())
        times, compiled, window = [], [], {name: [] for name in self.refs}
        for r in range(steps):
            for name, o in contenders[r % len(contenders):] + contenders[:r % len(contenders)]:
                before = _compile_stats(o)["compiles"] if name == "row" else 0
                t = _ms(o.step, self.device)
                if name != "row":
                    window[name].append(t)
                else:
                    (compiled if _compile_stats(o)["compiles"] != before else times).append(t)
        for name, ts in window.items():
            self.ref_times[name] += ts
        return times or compiled, window, len(compiled)  # every step compiling: keep them all (and say so)


def _compile_stats(optimizer) -> dict:
    """A gradwise optimizer's ``compile_stats`` (graphs compiled, seconds); none for another library's (``--peers``)."""
    return getattr(optimizer, "compile_stats", {"seconds": 0.0, "compiles": 0})


def _row(recipe, path, times, window, bench, moved, bandwidth, nbytes, **extra) -> dict:
    median = statistics.median(times) if times else float("nan")
    bound = moved * bench.numel / bandwidth * 1e3
    row = {"recipe": recipe, "path": path, "median_ms": median, "min_ms": min(times, default=float("nan")),
           "max_ms": max(times, default=float("nan")), "times_ms": times}
    row.update(extra)
    for name, ts in window.items():
        row[f"{name}_ms"] = statistics.median(ts)
        row[f"vs_{name}"] = median / statistics.median(ts)
    row.update({"state_bytes": nbytes, "state_bytes_per_param": nbytes / bench.numel,
                "bytes_moved_per_param": moved, "bound_ms": bound, "vs_bound": median / bound})
    return row


def measure(args, log=lambda message: None) -> dict:
    """Run the benchmark described by parsed ``args``; return ``{"header": ..., "rows": [...]}``."""
    import torch

    import gradwise

    torch.set_num_threads(args.threads)
    device = args.device
    if device != "cpu" and not getattr(torch, device).is_available():
        raise SystemExit(f"bench/step.py: --device {device}: torch {torch.__version__} sees no {device} device")
    header = {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu_model(),
              "device": device_name(device), "threads": torch.get_num_threads(),
              "loadavg_start": list(os.getloadavg()), "size": args.size, "steps": args.steps, "warmup": WARMUP,
              "copy_mb": args.copy_mb,
              "inductor_cache": "warm (the usual cache dir)" if args.warm_cache else "fresh (cold compiles)"}
    log(f"copy bandwidth ({args.copy_mb} MiB buffers)")
    bandwidths, adds = bandwidth("copy", args.copy_mb, device), bandwidth("add", args.copy_mb, device)
    log(f"parameters and torch references for {args.size}")
    bench = Bench(args.size, device=device)
    header.update({"params": bench.numel, "params_label": count_label(bench.numel), "tensors": len(bench.shapes)})
    peers = [r for r in args.recipes if args.peers and r in PEERS and _installed(PEERS[r][1], log)]
    jobs = [(r, p) for r in args.recipes for p in [*args.paths, *([PEERS[r][0]] if r in peers else [])]]
    measured = []
    with _inductor_cache(args.warm_cache):
        for i, (recipe, path) in enumerate(jobs, 1):
            log(f"[{i}/{len(jobs)}] {recipe} {path}")
            cls_name, hyper, moved = RECIPES[recipe]
            if path in PATHS:
                opt = bench.build(getattr(gradwise, cls_name), hyper, {"compile": PATHS[path]}, named=True)
            else:
                opt = bench.build(PEERS[recipe][2], hyper, {})
            warmup_ms = [_ms(opt.step, device) for _ in range(WARMUP)]
            with _phase_timers(args.phases) as phases:
                times, window, recompiled = bench.rounds(opt, args.steps)
            stats = _compile_stats(opt)
            measured.append((recipe, path, times, window, moved, state_bytes(opt), dict(
                warmup_ms=warmup_ms, compile_s=stats["seconds"], compiles=stats["compiles"],
                timed_compiles=recompiled, hyperparameters=hyper,
                phases_ms={name: total / args.steps for name, total in phases.items()})))
            del opt
            gc.collect()
    if not jobs:
        bench.rounds(None, args.steps)
    log("copy bandwidth again")
    bandwidths += bandwidth("copy", args.copy_mb, device)
    adds += bandwidth("add", args.copy_mb, device)
    copy_bw = statistics.median(bandwidths)
    header.update({"copy_bandwidth_gbs": copy_bw / 1e9, "copy_bandwidth_gbs_samples": [b / 1e9 for b in bandwidths],
                   "add_bandwidth_gbs": statistics.median(adds) / 1e9, "loadavg_end": list(os.getloadavg())})
    rows = [_row(r, p, t, w, bench, m, copy_bw, b, **x) for r, p, t, w, m, b, x in measured]
    for name, opt in bench.refs.items():
        times = bench.ref_times[name]
        pooled = {n: bench.ref_times[n] for n in bench.refs}
        rows.append(_row("torch AdamW", name, times, pooled, bench, 28, copy_bw, state_bytes(opt),
                         warmup_ms=[], compile_s=0.0, compiles=0, timed_compiles=0,
                         hyperparameters={**RECIPES["AdamW"][1], **REFERENCES[name]}))
    return {"header": header, "rows": rows}


def _installed(module: str, log) -> bool:
    """Whether ``module`` imports; if not, say that its peer row is left out."""
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        return True
    log(f"--peers: {module} is not installed; its row is left out (pip install '.[test]')")
    return False


@contextlib.contextmanager
def _phase_timers(on: bool):
    """With ``on``, milliseconds spent in each phase of the steps taken inside (``PhasedStep._run_phase``, keyed by
    the phase's repr; a step that runs as one phase, the steady one, calls no phase), in the dict it yields."""
    from gradwise.core.stepping import PhasedStep

    totals: dict[str, float] = {}
    if not on:
        yield totals
        return
    run_phase = PhasedStep._run_phase

    def timed(self, bucket, phase):
        start = time.perf_counter()
        try:
            return run_phase(self, bucket, phase)
        finally:
            key = repr(phase)
            totals[key] = totals.get(key, 0.0) + (time.perf_counter() - start) * 1e3
    PhasedStep._run_phase = timed
    try:
        yield totals
    finally:
        PhasedStep._run_phase = run_phase


@contextlib.contextmanager
def _inductor_cache(warm: bool):
    """Unless ``warm``, compile into a fresh, empty inductor cache (removed afterwards), so the compile
    seconds are those of a cold compile; gradwise's stored graphs go there too (a folder that
    ``GRADWISE_GRAPH_CACHE`` names is set aside meanwhile; ``0`` keeps the store off). The variables are
    read when inductor first needs its cache and at each graph compiled."""
    if warm:
        yield
        return
    names = ("TORCHINDUCTOR_CACHE_DIR", "GRADWISE_GRAPH_CACHE")
    previous, directory = {name: os.environ.get(name) for name in names}, tempfile.mkdtemp(prefix="gradwise-bench-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
    if previous["GRADWISE_GRAPH_CACHE"] != "0":
        os.environ.pop("GRADWISE_GRAPH_CACHE", None)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(directory, ignore_errors=True)


def device_name(device: str) -> str:
    """The accelerator's name (``torch.cuda.get_device_name``), or the CPU's model."""
    import torch

    return cpu_model() if device == "cpu" else getattr(torch, device).get_device_name()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ------------------------------------------------------------------------------ printing
def render(result: dict, out) -> None:
    from rich.table import Table

    h = result["header"]
    info = Table.grid(padding=(0, 2))
    for key, value in (
        ("torch", f"{h['torch']} (python {h['python']})"), ("cpu", h["cpu"]), ("device", h["device"]),
        ("threads", h["threads"]),
        ("load average", f"{_load(h['loadavg_start'])} at start, {_load(h['loadavg_end'])} at end"),
        ("parameters", f"{h['params']:,} ({h['params_label']}, preset {h['size']!r}) in {h['tensors']} tensors, fp32"),
        ("copy bandwidth", f"{h['copy_bandwidth_gbs']:.2f} GB/s (read + write, median of "
                           f"{len(h['copy_bandwidth_gbs_samples'])} copies of {h['copy_mb']} MiB); in-place add "
                           f"{h['add_bandwidth_gbs']:.2f} GB/s (read 2 + write 1)"),
        ("compiles", f"inductor cache {h['inductor_cache']}"),
        ("timing", f"median of {h['steps']} steps after {h['warmup']} warm-up steps, interleaved with torch's rows"),
    ):
        info.add_row(f"[bold]{key}[/]", str(value))
    out.print(info)
    table = Table(title=f"optimizer step, GPT-2-shaped {h['params_label']} parameters")
    for column in ("recipe", "path", "median ms", "min-max ms", "compile s", "x fused", "x foreach",
                   "state B/param", "bound ms", "x bound"):
        table.add_column(column, justify="left" if column in ("recipe", "path") else "right")
    for r in result["rows"]:
        compile_s = f"{r['compile_s']:.1f} ({r['compiles']})" if r["compiles"] else "-"
        if r["timed_compiles"]:
            compile_s += f" [red]+{r['timed_compiles']} timed[/]"
        table.add_row(r["recipe"], r["path"], f"{r['median_ms']:.2f}", f"{r['min_ms']:.1f}-{r['max_ms']:.1f}",
                      compile_s, f"{r['vs_fused']:.2f}", f"{r['vs_foreach']:.2f}",
                      f"{r['state_bytes_per_param']:.4f}", f"{r['bound_ms']:.2f}", f"{r['vs_bound']:.2f}")
    out.print(table)
    for r in result["rows"]:
        for name, ms in r.get("phases_ms", {}).items():
            out.print(f"{r['recipe']} {r['path']}: {ms:.1f} ms a step in {name}")
    out.print("compile s: seconds (graphs) from compile_stats, spent in the warm-up steps and excluded from the "
              "median (the first compiled row's also pays inductor's one-time start-up). x fused / x foreach: "
              "row median over torch's median in the same interleaved rounds. "
              "state B/param: every tensor in optimizer.state, the 0-d 'step' counters included, over the "
              "parameter count. bound: bytes moved per parameter (28 AdamW family, 20 Lion and SGD with "
              "momentum, 12 plain SGD) x parameters / copy bandwidth.")


def _load(values) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def run(args) -> int:
    from gradwise.extras import require

    require("gradwise bench step", "cli")
    from gradwise.console import console

    err = console(stderr=True)
    result = measure(args, log=lambda message: err.log(message))
    render(result, console())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    from gradwise.help_format import HelpFormatter

    parser = add_step_arguments(argparse.ArgumentParser(prog="bench/step.py", description=STEP_DESCRIPTION,
                                                        formatter_class=HelpFormatter))
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
