"""The ``gradwise bench`` command: the step benchmark's rows and options, and the script that runs it.

The benchmarks are scripts in the source repository's ``bench/`` folder, not part of the installed package
(``bench/step.py`` is ``gradwise bench step``). From a clone or an editable install the folder sits beside the
package's source, where ``script`` looks for it; an install from a wheel has none, and the command says so.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from gradwise.shapes import SIZES

#: ``gradwise bench step --help`` and ``python bench/step.py --help``: what the benchmark measures.
STEP_DESCRIPTION = "The optimizer step benchmark: median step time of each recipe on a GPT-2-shaped parameter set."
#: the step benchmark's rows, name: (gradwise class, hyperparameters, bytes read + written per parameter element
#: per step); ``gradwise list`` builds each recipe named here with these hyperparameters.
RECIPES = {
    "AdamW": ("AdamW", {"lr": 1e-3, "weight_decay": 0.1}, 28),  # read p, g, m, v; write p, m, v
    "Adam": ("Adam", {"lr": 1e-3}, 28),
    "NAdamW": ("NAdamW", {"lr": 2e-3, "weight_decay": 0.1}, 28),
    "Lion": ("Lion", {"lr": 1e-4, "weight_decay": 0.1}, 20),  # read p, g, m; write p, m
    "SGD": ("SGD", {"lr": 1e-2, "momentum": 0.9, "nesterov": True}, 20),  # 12 without momentum
    # read p, g, z, v; write p, z, v
    "ScheduleFreeAdamW": ("ScheduleFreeAdamW", {"lr": 2.5e-3, "weight_decay": 0.1}, 28),
    # prologue: read p (unit norms), g twice (unit norms, means), g again to write the shaped g', g' once more (PNM's
    # sum of squares); shrink: read p twice (unit norms, the multiply), write p; elementwise step: read p, g' and 5
    # buffers (2 momenta, v, max v, slow weights), write p and the 5
    "Ranger21": ("Ranger21", {"lr": 1e-3, "num_iterations": 10_000}, 88),
    # encoded state (tensors under 4096 elements stay fp32): read p, g, codes of m and v; write p and codes
    "AdamW-bf16": ("AdamW", {"lr": 1e-3, "weight_decay": 0.1, "state": "bf16"}, 20),
    "AdamW-int8": ("AdamW", {"lr": 1e-3, "weight_decay": 0.1, "state": "int8"}, 16),
    "AdamW-int4": ("AdamW", {"lr": 1e-3, "weight_decay": 0.1, "state": "int4"}, 14),
    "AdamW-fp8": ("AdamW", {"lr": 1e-3, "weight_decay": 0.1, "state": "fp8"}, 16),
    # matrices: read p, g, m; write p, m, plus Newton-Schulz's matmuls (compute-bound); the rest: AdamW's 28
    "Muon": ("Muon", {"lr": 0.02}, 20),
}
#: the rows ``gradwise bench step`` runs unless ``--recipes`` says otherwise.
DEFAULT_RECIPES = ["AdamW", "Adam", "NAdamW", "Lion", "SGD"]
#: each path's ``compile=``: the list ops, the compiled graphs, and as built by default (``"auto"``: by size, and
#: torch's fused kernel where a step ends in one, ``core/stepping.py``)
PATHS = {"eager": False, "compiled": True, "auto": "auto"}
DEFAULT_PATHS = ["eager", "compiled"]
DEVICES = ("cpu", "cuda")
#: untimed steps of each row before its timed ones.
WARMUP = 2


def positive_int_argument(text: str) -> int:
    """An argparse ``type``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected an integer >= 1")
    return value


def names_argument(allowed: tuple[str, ...]):
    """An argparse ``type``: comma-separated names among ``allowed``, in any case, each kept once."""
    lookup = {a.lower(): a for a in allowed}

    def parse(text: str) -> list[str]:
        names = [s.strip() for s in text.split(",") if s.strip()]
        bad = [n for n in names if n.lower() not in lookup]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"invalid value {text!r}" + (f" ({', '.join(map(repr, bad))} not allowed)" if bad else "")
                + f"; allowed values: {', '.join(allowed)} (comma-separated)")
        return list(dict.fromkeys(lookup[n.lower()] for n in names))

    return parse


def add_step_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``gradwise bench step`` and ``python bench/step.py``."""
    parser.add_argument("--size", choices=tuple(SIZES), default="25m",
                        help="parameter set: GPT-2 small (124m), 6 blocks of width 384 (25m), tiny (tests)")
    parser.add_argument("--steps", type=positive_int_argument, default=10, metavar="N",
                        help=f"timed steps per row, after {WARMUP} warm-up steps")
    parser.add_argument("--threads", type=positive_int_argument, default=1, metavar="T",
                        help="torch.set_num_threads")
    parser.add_argument("--recipes", type=names_argument(tuple(RECIPES)), default=DEFAULT_RECIPES,
                        help=f"comma-separated subset of {','.join(RECIPES)} (torch's rows are always measured)")
    parser.add_argument("--paths", type=names_argument(tuple(PATHS)), default=DEFAULT_PATHS,
                        help="comma-separated subset of eager (compile=False), compiled (compile=True), auto"
                             " (compile=\"auto\", as built by default)")
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="where parameters, gradients, state and the copy live (cuda: timed with synchronize)")
    parser.add_argument("--copy-mb", type=positive_int_argument, default=512, metavar="MB",
                        help="MiB of each buffer of the copy that measures bandwidth (larger than the caches)")
    parser.add_argument("--json", metavar="PATH", help="also write the header and rows as JSON to PATH")
    parser.add_argument("--phases", action="store_true",
                        help="also time each phase of a step run in several (Ranger21's shaping, shrink and "
                             "elementwise phase): milliseconds per timed step, printed under the table")
    parser.add_argument("--peers", action="store_true",
                        help="also time each recipe's reference implementation where one is installed (torch's "
                             "foreach NAdam and SGD, schedulefree's AdamWScheduleFree, lion-pytorch's Lion) with the "
                             "recipe's hyperparameters, in the same interleaved rounds")
    parser.add_argument("--warm-cache", action="store_true",
                        help="compile with the usual on-disk inductor cache (without it: a fresh, empty one, so "
                             "'compile s' is a cold compile)")
    return parser


def script(benchmark: str) -> Path:
    """Where the script of ``gradwise bench <benchmark>`` is in a source checkout: ``bench/<benchmark>.py``
    beside the ``gradwise`` package folder (which may not exist)."""
    return Path(__file__).resolve().parents[1] / "bench" / f"{benchmark}.py"


def run(args) -> int:
    """Run ``bench/<args.benchmark>.py``'s ``run(args)`` in this process; without the script (an install
    from a wheel), say where the benchmarks are and return 2."""
    path = script(args.benchmark)
    if not path.is_file():
        print(f"gradwise bench {args.benchmark}: the benchmarks are scripts in gradwise's source repository, not"
              f" in the installed package (looked for {path}); run it from a clone, after pip install -e '.[cli]'",
              file=sys.stderr)
        return 2
    root = str(path.parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)  # the scripts import each other as bench.*, from the repository's root
    return importlib.import_module(f"bench.{args.benchmark}").run(args)
