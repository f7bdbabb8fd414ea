#!/usr/bin/env python
"""The first-step benchmark (``python bench/compile_time.py``): seconds of each recipe's first compiled step in a
new process, cold (its graphs not yet in inductor's on-disk cache) and warm (a second process, the same cache).

Each run uses one fresh inductor cache folder (``TORCHINDUCTOR_CACHE_DIR``, removed afterwards), which holds
gradwise's stored graphs too (``gradwise.core.graph_store``; ``GRADWISE_GRAPH_CACHE=0`` keeps them off). A first
process compiles a one-line function there, so that inductor's one-time start-up in a new cache folder (it builds and
loads small probe libraries for each vector instruction set) is paid once and reported on its own line, as a
user pays it once per machine. Then, for each recipe, two processes in turn build it with ``compile=True`` on the
GPT-2-shaped set of ``--size`` (fixed random gradients, ``torch.set_num_threads`` as ``--threads``) and time
its first step (tracing, compiling or loading the graphs, and the step) and its second (compiled, for
comparison); the graphs and their seconds come from ``optimizer.compile_stats``, and so does how many of its graphs
the warm process loaded from gradwise's store (``loaded``). A graph two recipes share
(none of the rows today) would be warm for the second. On Linux each row also has the first step's peak memory
(the resident set's high-water mark, reset just before the step, less the resident set then; the processes run
with ``MALLOC_MMAP_THRESHOLD_=65536``, so that memory freed is given back and the mark follows live tensors) and
its ratio to the peak of ``torch.optim.AdamW(fused=True)``'s first step on the same set, in a process of its own:
both create the state there, and a compiled first step also compiles.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

from gradwise.cli_bench import RECIPES, names_argument, positive_int_argument  # noqa: E402
from gradwise.help_format import HelpFormatter  # noqa: E402
from gradwise.shapes import SIZES, gpt2_parameters  # noqa: E402


def first_steps(recipe: str, size: str, threads: int) -> dict:
    """In this process: build ``recipe`` compiled on the ``size`` set (or, for ``"torch"``, torch's fused AdamW) and
    time its first two steps; the first one's peak memory in MiB above the resident set before it (None where the
    high-water mark cannot be reset: not Linux)."""
    import torch

    import gradwise
    from gradwise.arena.runner import peak_rss_mb, reset_peak_rss, rss_now_mb

    torch.set_num_threads(threads)
    params = gpt2_parameters(size)
    if recipe == "torch":
        optimizer = torch.optim.AdamW(params, lr=1e-3, fused=True)
    else:
        cls_name, hyper, _ = RECIPES[recipe]
        optimizer = getattr(gradwise, cls_name)(params, **hyper, compile=True)

    def timed_step() -> float:
        start = time.perf_counter()
        optimizer.step()
        return time.perf_counter() - start

    scope, before = reset_peak_rss(), rss_now_mb()
    first = timed_step()
    peak = peak_rss_mb(scope) - before if scope == "trial" and before is not None else None
    second = timed_step()
    stats = getattr(optimizer, "compile_stats", {"compiles": 0, "seconds": 0.0, "loaded": 0})
    return {"first_s": first, "second_s": second, "graphs": stats["compiles"], "loaded": stats["loaded"],
            "compile_s": stats["seconds"], "first_peak_mib": peak}


def start_up() -> dict:
    """In this process: inductor's one-time start-up, the first compile of ``x + 1``."""
    import torch

    start = time.perf_counter()
    torch.compile(lambda x: x + 1, dynamic=False)(torch.ones(8))
    return {"first_s": time.perf_counter() - start}


def _child(args: list[str], cache: str) -> dict:
    """Run this script with ``args`` in a new process on the ``cache`` folder; its one line of JSON."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "MALLOC_MMAP_THRESHOLD_": "65536"}
    if env.get("GRADWISE_GRAPH_CACHE") != "0":  # gradwise's stored graphs in that cache folder too
        env.pop("GRADWISE_GRAPH_CACHE", None)
    done = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"bench/compile_time.py {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/compile_time.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--size", choices=tuple(SIZES), default="25m", help="parameter set (as bench/step.py's)")
    parser.add_argument("--recipes", type=names_argument(tuple(RECIPES)), default=list(RECIPES),
                        help=f"comma-separated subset of {','.join(RECIPES)}")
    parser.add_argument("--threads", type=positive_int_argument, default=1, metavar="T", help="torch.set_num_threads")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a measuring process: a recipe, "torch" or "start-up"
    args = parser.parse_args(argv)
    if args.child:
        result = start_up() if args.child == "start-up" else first_steps(args.child, args.size, args.threads)
        print(json.dumps(result))
        return 0
    cache = tempfile.mkdtemp(prefix="gradwise-compile-time-")
    common = ["--size", args.size, "--threads", str(args.threads)]
    try:
        print(f"load {' '.join(f'{v:.2f}' for v in os.getloadavg())}, {args.size} set, {args.threads} thread(s), "
              f"a fresh inductor cache in {cache}")
        results = {"start-up": _child(["--child", "start-up"], cache), "rows": {}}
        print(f"inductor's start-up in a new cache folder (x + 1): {results['start-up']['first_s']:.1f} s")
        torch_row = results["torch"] = _child(["--child", "torch", *common], cache)
        torch_peak = torch_row["first_peak_mib"]
        print(f"torch.optim.AdamW(fused=True)'s first step: {torch_row['first_s']:.2f} s, peak "
              + ("not measured (no /proc/self/clear_refs)" if torch_peak is None else f"+{torch_peak:.0f} MiB"))
        print(f"{'recipe':<20}{'cold first step s':>19}{'warm first step s':>19}{'graphs':>8}{'loaded':>8}"
              f"{'compiled step ms':>18}{'first step peak MiB':>21}{'x torch':>9}")
        for recipe in args.recipes:
            cold, warm = (_child(["--child", recipe, *common], cache) for _ in range(2))
            results["rows"][recipe] = {"cold": cold, "warm": warm}
            peak = cold["first_peak_mib"]
            peak_text = ("-", "-") if peak is None or not torch_peak else (f"{peak:.0f}", f"{peak / torch_peak:.2f}")
            print(f"{recipe:<20}{cold['first_s']:>19.2f}{warm['first_s']:>19.2f}{cold['graphs']:>8}{warm['loaded']:>8}"
                  f"{warm['second_s'] * 1e3:>18.1f}{peak_text[0]:>21}{peak_text[1]:>9}", flush=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    results["loadavg_end"] = list(os.getloadavg())
    print(f"load at the end {' '.join(f'{v:.2f}' for v in results['loadavg_end'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
