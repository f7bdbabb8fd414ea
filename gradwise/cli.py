"""The ``gradwise`` command line.

    gradwise list                      the recipes: chain, state buffers, the benchmark's hyperparameters
    gradwise bench step [--size ...]   optimizer step benchmark (see ``gradwise bench step --help``)
    gradwise arena run|score|report|set-targets|list   the AlgoPerf-style arena (``gradwise arena --help``)
    gradwise estimate [--size ...]     optimizer state bytes per format, group and in total, before allocation

torch, rich and the benchmark are imported only by the subcommand that runs.
"""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    from gradwise import bench_step  # argument definitions only: no torch at import time

    parser = argparse.ArgumentParser(prog="gradwise", description="Composable, memory-lean optimizers for PyTorch.")
    from gradwise.arena import cli as arena_cli  # argument definitions only

    commands = parser.add_subparsers(dest="command", metavar="{list,bench,estimate,arena}")
    commands.add_parser("list", help="the recipe table: name, chain, state buffers")
    estimate = commands.add_parser("estimate", help="optimizer state bytes on a GPT-2-shaped parameter set, before"
                                   " allocation", description="Bytes of optimizer state per format (codec or dtype),"
                                   " per parameter group and in total, computed on meta tensors.")
    estimate.add_argument("--size", choices=tuple(bench_step.SIZES), default="124m", help="GPT-2 parameter set")
    estimate.add_argument("--recipe", default="AdamW", help="a gradwise recipe name (default AdamW)")
    estimate.add_argument("--state", default="fp32", help="fp32, bf16, int8, int4, or a tag such as int8-b256")
    estimate.add_argument("--fp32", metavar="REGEX", help="keep parameters whose name matches REGEX in float32"
                          " (e.g. 'wte|wpe')")
    bench = commands.add_parser("bench", help="benchmarks")
    benchmarks = bench.add_subparsers(dest="benchmark", metavar="{step}")
    bench_step.add_arguments(benchmarks.add_parser(
        "step", help="optimizer step time against torch's fused and foreach AdamW",
        description=bench_step.__doc__.split("\n\n")[0]))
    arena = commands.add_parser("arena", help="AlgoPerf-style time-to-result for training algorithms")
    arena_cli.add_arguments(arena)
    parser.set_defaults(bench_parser=bench, arena_parser=arena)
    return parser


def recipe_table() -> list[dict[str, str]]:
    """One row per recipe, built with the benchmark's hyperparameters and stepped once on a 2x2 parameter
    so the state buffers listed are the ones the optimizer really keeps ('step' is the Optimizer's own)."""
    import torch

    import gradwise
    from gradwise.bench_step import DEFAULT_RECIPES, RECIPES

    rows = []
    for name in DEFAULT_RECIPES:
        cls_name, hyper, _ = RECIPES[name]
        p = torch.nn.Parameter(torch.zeros(2, 2))
        p.grad = torch.ones(2, 2)
        opt = getattr(gradwise, cls_name)([p], **hyper, compile=False)
        opt.step()
        buffers = [f"{k} ({'like param' if v.shape == p.shape else 'scalar'})" for k, v in opt.state[p].items()]
        rows.append({"name": name, "chain": repr(opt.transform), "state": ", ".join(buffers),
                     "hyperparameters": ", ".join(f"{k}={v}" for k, v in hyper.items())})
    return rows


def _list() -> int:
    from rich.table import Table

    from gradwise.bench_report import console

    table = Table(title="gradwise recipes (state after one step, with the benchmark's hyperparameters)")
    for column in ("name", "chain", "state buffers", "benchmark hyperparameters"):
        table.add_column(column, overflow="fold")
    for row in recipe_table():
        table.add_row(row["name"], row["chain"], row["state"], row["hyperparameters"])
    console().print(table)
    return 0


def _estimate(args) -> int:
    import torch

    import gradwise
    from gradwise.bench_step import SIZES, gpt2_shapes

    params = [(name, torch.empty(shape, device="meta")) for name, shape in gpt2_shapes(*SIZES[args.size])]
    try:
        policy = gradwise.StatePolicy(args.state, rules={args.fp32: "fp32"} if args.fp32 else {})
        # recipes without state= (Adafactor, CAME, AdamMini) are estimated in float32 when no format is asked for
        plain = args.state == "fp32" and not args.fp32
        result = gradwise.estimate(params, args.recipe, **({} if plain else {"state": policy}))
    except (ValueError, TypeError) as error:
        print(f"gradwise estimate: {error}", file=sys.stderr)
        return 2
    print(f"{args.recipe} optimizer state on the {args.size} GPT-2 parameter set, {policy}:")
    print(result.table())
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
    from gradwise import bench_step

    return bench_step.run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
