"""The ``gradwise`` command line.

    gradwise list                      every recipe: chain, state buffers, the hyperparameters it was built with
    gradwise bench step [--size ...]   optimizer step benchmark: a clone's bench/step.py (``--help`` lists its options)
    gradwise arena run|score|report|claims|...  the AlgoPerf-style arena (``gradwise arena --help``)
    gradwise estimate [--size ...]     optimizer state bytes per format, group and in total, before allocation;
                                       with --world-size or --mesh, per rank under FSDP2, and bytes sent per step

torch, rich and the benchmark are imported only by the subcommand that runs; a subcommand whose optional
dependencies are missing names the extra to install (``gradwise.extras``).
"""
from __future__ import annotations

import argparse
import sys

from gradwise.help_format import HelpFormatter
from gradwise.shapes import ESTIMATE_SIZES

#: the parameter dtypes ``gradwise estimate --param-dtype`` takes.
PARAM_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def _state_format(text: str) -> str:
    """``--state``: a format the state policy accepts, checked before anything runs."""
    from gradwise.state import StatePolicy

    try:
        StatePolicy(text)
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected fp32, bf16, int8, int4, fp8 or a tag"
                                         " such as int8-b256 or int4-b64-rank1-nearest") from None
    return text


def _mesh(text: str) -> tuple[int, int]:
    """``--mesh R,S``: R replicas of S shards (HSDP), two positive ints."""
    try:
        replicas, shards = (int(n) for n in text.split(","))
    except ValueError:
        replicas = shards = 0
    if replicas < 1 or shards < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected R,S (replicas,shards), two positive"
                                         " ints, e.g. 8,8")
    return replicas, shards


def _parser() -> argparse.ArgumentParser:
    from gradwise import __version__, cli_bench  # argument definitions only: no torch at import time
    from gradwise.arena import cli as arena_cli  # argument definitions only

    parser = argparse.ArgumentParser(prog="gradwise", description="Composable, memory-lean optimizers for PyTorch.",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"gradwise {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{list,bench,estimate,arena}", help="the command")
    commands.add_parser("list", help="every recipe: chain and state buffers after one step (needs gradwise[cli])",
                        description="Every gradwise recipe, built and stepped once on a 2x2 parameter: its chain,"
                        " the state buffers it keeps and the hyperparameters it was built with; then the wrappers.",
                        formatter_class=HelpFormatter)
    estimate = commands.add_parser("estimate", help="optimizer state bytes on a GPT-2-shaped parameter set, before"
                                   " allocation", description="Bytes of optimizer state per format (codec or dtype),"
                                   " per parameter group and in total, computed on meta tensors; with --world-size"
                                   " or --mesh, each rank's state under FSDP2 (fully_shard) and the bytes it sends"
                                   " per step (max and mean over ranks).",
                                   formatter_class=HelpFormatter)
    estimate.add_argument("--size", choices=tuple(ESTIMATE_SIZES), default="124m", help="GPT-2 parameter set")
    estimate.add_argument("--recipe", default="AdamW", help="a gradwise recipe name, any case (gradwise list)")
    estimate.add_argument("--state", default="fp32", type=_state_format,
                          help="state format: fp32, bf16, int8, int4, fp8, or a tag such as int8-b256")
    estimate.add_argument("--param-dtype", choices=tuple(PARAM_DTYPES), default="fp32",
                          help="the parameters' dtype; gradwise keeps float32 state for bf16 parameters unless"
                               " --state says otherwise")
    estimate.add_argument("--fp32", metavar="REGEX", help="keep parameters whose name matches REGEX in float32"
                          " (e.g. 'wte|wpe')")
    ranks = estimate.add_mutually_exclusive_group()
    ranks.add_argument("--world-size", type=cli_bench.positive_int_argument, metavar="N",
                       help="per rank, with the parameters sharded over N ranks (FSDP2)")
    ranks.add_argument("--mesh", type=_mesh, metavar="R,S", help="per rank, on an HSDP mesh: R replicas of S shards")
    bench = commands.add_parser("bench", help="benchmarks", formatter_class=HelpFormatter)
    benchmarks = bench.add_subparsers(dest="benchmark", metavar="{step}", help="the benchmark")
    cli_bench.add_step_arguments(benchmarks.add_parser(
        "step", help="optimizer step time against torch's fused and foreach AdamW (bench/step.py of a clone)",
        description=cli_bench.STEP_DESCRIPTION, formatter_class=HelpFormatter))
    arena = commands.add_parser("arena", help="AlgoPerf-style time-to-result for training algorithms (needs"
                                " gradwise[arena])", formatter_class=HelpFormatter)
    arena_cli.add_arguments(arena)
    parser.set_defaults(bench_parser=bench, arena_parser=arena)
    return parser


def recipe_table() -> list[dict[str, str]]:
    """One row per recipe (``gradwise.by_name.recipe_names()``), built with the benchmark's hyperparameters
    where it has some (else the recipe's defaults, and lr=1e-3 where the recipe has no default) and stepped
    once on a 2x2 parameter, so the state buffers listed are the ones the optimizer really keeps ('step' is
    the Optimizer's own)."""
    import inspect

    import torch

    import gradwise
    from gradwise.by_name import recipe_names
    from gradwise.cli_bench import RECIPES

    rows = []
    for name in recipe_names():
        cls = getattr(gradwise, name)
        hyper = RECIPES[name][1] if name in RECIPES else {}
        lr_default = inspect.signature(cls.__init__).parameters["lr"].default
        if "lr" not in hyper and lr_default in (None, inspect.Parameter.empty):
            hyper = {"lr": 1e-3, **hyper}
        p = torch.nn.Parameter(torch.zeros(2, 2))
        p.grad = torch.ones(2, 2)
        opt = cls([p], **hyper, compile=False)
        opt.step()
        buffers = [f"{k} ({_shape(v, p)})" for k, v in opt.state[p].items()]
        rows.append({"name": name, "chain": repr(opt.transform), "state": ", ".join(buffers),
                     "hyperparameters": ", ".join(f"{k}={v}" for k, v in hyper.items())})
    return rows


def _shape(buffer, param) -> str:
    """How a state buffer is shaped: like its parameter, a scalar, or its own shape (``1x2``)."""
    if buffer.shape == param.shape:
        return "like param"
    return "scalar" if buffer.dim() == 0 else "x".join(map(str, buffer.shape))


def wrapper_table() -> list[dict[str, str]]:
    """The wrappers in ``gradwise.recipes.__all__``: what they do, the first sentence of their docstrings."""
    import gradwise.recipes
    from gradwise.by_name import recipe_names

    def first_sentence(doc):
        return " ".join(doc.strip().split("\n\n")[0].split()).split(". ")[0].rstrip(":")

    return [{"name": name, "chain": first_sentence(getattr(gradwise.recipes, name).__doc__ or "")}
            for name in gradwise.recipes.__all__ if name not in recipe_names()]


def _list() -> int:
    from gradwise.extras import require

    require("gradwise list", "cli")
    from rich.table import Table

    from gradwise.console import console

    table = Table(title="gradwise recipes (state after one step, built with the hyperparameters shown)")
    for column in ("name", "chain", "state buffers", "hyperparameters"):
        table.add_column(column, overflow="fold")
    for row in recipe_table():
        table.add_row(row["name"], row["chain"], row["state"], row["hyperparameters"])
    for row in wrapper_table():
        table.add_row(row["name"], f"wrapper: {row['chain']}", "", "")
    console().print(table)
    return 0


def _estimate(args) -> int:
    import torch

    import gradwise
    from gradwise.by_name import canonical_name, recipe_names
    from gradwise.shapes import gpt2_shapes

    dtype = getattr(torch, PARAM_DTYPES[args.param_dtype])
    shapes = gpt2_shapes(*ESTIMATE_SIZES[args.size])
    params = [(name, torch.empty(shape, device="meta", dtype=dtype)) for name, shape in shapes]
    sharded = args.world_size is not None or args.mesh is not None
    try:
        recipe = canonical_name(args.recipe, recipe_names(), argument="--recipe")
        policy = gradwise.StatePolicy(args.state, rules={args.fp32: "fp32"} if args.fp32 else {})
        # recipes without state= (Adafactor, CAME, AdamMini) are estimated in float32 when no format is asked for
        plain = args.state == "fp32" and not args.fp32
        kwargs = {} if plain else {"state": policy}
        result = gradwise.estimate(params, recipe, **kwargs)
        ranks = gradwise.estimate_sharded(params, recipe, world_size=args.world_size, mesh=args.mesh,
                                          **kwargs) if sharded else None
    except (ValueError, TypeError) as error:
        print(f"gradwise estimate: {error}", file=sys.stderr)
        return 2
    print(f"{recipe} optimizer state on the {args.size} GPT-2 parameter set ({PARAM_DTYPES[args.param_dtype]}"
          f" parameters), {policy}:")
    if ranks is None:
        print(result.table())
    else:
        print(f"unsharded: {result.total:,} bytes ({result.bytes_per_param:.4f} per parameter element)")
        print(ranks.table())
    if args.param_dtype != "fp32" and args.state == "fp32":
        print(f"note: {PARAM_DTYPES[args.param_dtype]} parameters keep float32 state by default (for accuracy):"
              f" {result.bytes_per_param:.2f} bytes per parameter, {result.bytes_per_param / dtype.itemsize:.1f}x the"
              " parameters' own bytes; torch.optim keeps state in the parameters' dtype, and --state bf16 matches"
              " its memory")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.command == "list":
        return _list()
    if args.command == "arena":
        from gradwise.arena import cli as arena_cli

        return arena_cli.main(args, args.arena_parser)
    if args.command == "estimate":
        return _estimate(args)
    if args.benchmark is None:
        args.bench_parser.error("missing benchmark: choose from 'step'")
    from gradwise import cli_bench

    return cli_bench.run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
