"""``gradwise arena ...``: run suites or search spaces, score, report, set targets, list what can be entered."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

DEFAULT_STORAGE = "arena-results/arena.db"
DEFAULT_OUT = "arena-results/report"


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0 or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected a number > 0")
        return value
    return parse


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected a finite number >= 0")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gradwise.arena.cli_claims import add_claims_parser
    from gradwise.arena.suites import SUITES
    from gradwise.help_format import HelpFormatter

    suite_help = "; ".join(f"{name}: {len(s['workloads'])} workloads x {len(s['optimizers'])} optimizers x"
                           f" {s['studies']} studies" for name, s in SUITES.items())
    commands = parser.add_subparsers(dest="arena_command",
                                     metavar="{run,score,report,set-targets,list,delete-study,claims}",
                                     help="the arena command")
    run = commands.add_parser("run", help="run a suite (self-tuning) or a search space (external tuning)",
                              formatter_class=HelpFormatter)
    run.add_argument("--suite", choices=["quick", "full"], default="quick", help=suite_help)
    run.add_argument("--workloads", help="comma-separated workloads (default: the suite's)")
    run.add_argument("--optimizers", help="comma-separated entries: recipes, torch.<Name>, state-format variants such"
                     " as AdamW[int8] (default: the suite's)")
    run.add_argument("--hyperparameters", help="JSON object: a fixed point for every --optimizers entry, in place"
                     " of its self-tuning defaults (the same point on every workload)")
    run.add_argument("--ruleset", choices=["self", "external"], help="self: each --optimizers entry at its"
                     " self-tuning point (the default); external: each tuned over its shipped search space"
                     " (gradwise arena list), or over --search-space")
    run.add_argument("--search-space", help="JSON or TOML search space: external tuning instead of self-tuning")
    run.add_argument("--submission", help="a Python file written against AlgoPerf's PyTorch submission API, run"
                     " unchanged (external tuning with the tuning_search_space.json beside it or --search-space;"
                     " self-tuning without)")
    run.add_argument("--optimizer", help="the optimizer a --search-space file is for, if the file names none")
    run.add_argument("--trials", type=_positive(int), default=5, help="Halton trials per study (external)")
    run.add_argument("--tuner", choices=["halton", "hyperband", "one-epoch"], default="halton",
                     help="external tuning: every trial its whole budget (halton), Hyperband's early stops"
                          " (hyperband), or the Top-K after one epoch of each (one-epoch)")
    run.add_argument("--studies", type=_positive(int), help="studies per submission and workload")
    run.add_argument("--budget-scale", type=_positive(float), default=1.0,
                     help="multiply every workload's step and time budget")
    run.add_argument("--workers", type=_positive(int), default=1, help="processes running trials at once")
    run.add_argument("--no-time-limit", action="store_true", help="stop trials at the target or the step budget"
                     " only, not the time budget (results then do not depend on the machine's load)")
    run.add_argument("--threads", type=_positive(int), default=1, help="torch threads per trial (per worker)")
    run.add_argument("--workers-per-trial", type=_positive(int), default=1,
                     help="gloo workers per trial: recipes run data-parallel, DiLoCo[H=h], StreamingDiLoCo[H=h],"
                          " DiLoCoPowerSGD[H=h], DeMo and PowerSGD[r=r] as themselves; scored on measured +"
                          " simulated link time")
    run.add_argument("--link-bandwidth", type=_positive(float), default=1e9 / 8,
                     help="the simulated link's bytes per second (default 1.25e8: 1 Gbit/s)")
    run.add_argument("--link-latency", type=_non_negative, default=1e-4,
                     help="the simulated link's seconds per collective")
    _common(run, suite=False)
    run.add_argument("--no-live", action="store_true", help="plain log lines instead of the live leaderboard")
    score = commands.add_parser("score", help="print the leaderboard from a store", formatter_class=HelpFormatter)
    _common(score)
    report = commands.add_parser("report", help="write the Markdown and HTML report with figures",
                                 formatter_class=HelpFormatter)
    _common(report)
    targets = commands.add_parser("set-targets", help="set workload targets the AlgoPerf way (targets.json)",
                                  formatter_class=HelpFormatter)
    targets.add_argument("--workloads", default="digits_cnn,teacher_student",
                         help="comma-separated workloads to set targets for (gradwise arena list)")
    targets.add_argument("--trials", type=_positive(int), default=4, help="Halton trials per algorithm")
    targets.add_argument("--seeds", type=_positive(int), default=3, help="seeds for the best configuration")
    targets.add_argument("--budget-scale", type=_positive(float), default=1.0, help="for smoke runs only")
    targets.add_argument("--storage", default="arena-results/targets.db",
                         help="SQLite file or SQLAlchemy URL for the target-setting trials")
    targets.add_argument("--threads", type=_positive(int), default=1, help="torch threads per trial")
    targets.add_argument("--workers", type=_positive(int), default=1, help="processes running trials at once")
    targets.add_argument("--dry-run", action="store_true", help="print the targets, leave targets.json alone")
    commands.add_parser("list", help="workloads and entries: self-tuning points, spaces, variants",
                        formatter_class=HelpFormatter,
                        description="The workloads (target, budget, batch), and every entry a submission may use:"
                        " its self-tuning point, whether a search space is shipped, the state-format variants.")
    delete = commands.add_parser("delete-study", help="delete one study and its trials from a store; the next"
                                 " run that plans it prepares and runs it afresh", formatter_class=HelpFormatter)
    delete.add_argument("study", help="the study's name, e.g. quick/self/AdamW/digits_cnn/study0")
    delete.add_argument("--storage", default=DEFAULT_STORAGE, help="the store: SQLite file or SQLAlchemy URL")
    add_claims_parser(commands, _positive, HelpFormatter)


def _common(parser: argparse.ArgumentParser, suite: bool = True) -> None:
    parser.add_argument("--storage", default=DEFAULT_STORAGE,
                        help="SQLite file or SQLAlchemy URL, e.g. postgresql://user@host/db (needs"
                             " gradwise[postgres])")
    parser.add_argument("--out", default=DEFAULT_OUT, help="report directory")
    parser.add_argument("--reference", default="torch.AdamW", help="the submission speedups are measured against")
    if suite:
        parser.add_argument("--suite", choices=["quick", "full", "custom"],
                            help="only this suite's studies (custom: runs with --workloads, --optimizers, ...)")


def _names(text: str | None, default: list[str]) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()] if text else list(default)


def _optimizers(text: str | None, default: list[str]) -> list[str]:
    """``--optimizers``: entries as the arena spells them (``AdamW``, ``AdamW[int8]``), typed in any case."""
    from gradwise.arena.variants import check_entry

    return [check_entry(n, argument="--optimizers") for n in _names(text, default)]


def _plans(args):
    from gradwise.arena.link import Link
    from gradwise.arena.rulesets import Entry, external_entry, plan, self_tuning_entry, submission_entry
    from gradwise.arena.submissions import load_search_space
    from gradwise.arena.suites import SUITES
    from gradwise.arena.workloads import get_workload

    suite = SUITES[args.suite]
    workloads = _names(args.workloads, suite["workloads"])
    for w in workloads:
        get_workload(w)  # unknown names fail before anything runs
    custom = bool(args.workloads or args.optimizers or args.search_space or args.hyperparameters or args.submission
                  or args.ruleset == "external")
    name = "custom" if custom else args.suite
    _check_ruleset(args)
    if args.submission:
        clash = [flag for flag, value in (("--optimizers", args.optimizers), ("--optimizer", args.optimizer),
                                          ("--hyperparameters", args.hyperparameters)) if value]
        if clash:
            raise ValueError(f"invalid {clash[0]} with --submission={args.submission!r}: the submission file is"
                             " the whole entry (its hyperparameters come from its search space)")
        entries = [submission_entry(args.submission, args.search_space, workloads)]
        if args.ruleset not in (None, entries[0].ruleset):
            raise ValueError(f"invalid --ruleset={args.ruleset!r} with --submission={args.submission!r}: the file is"
                             f" {entries[0].ruleset}-tuning (a tuning_search_space.json beside it, or --search-space,"
                             " makes it external; none, self)")
        studies = args.studies or (3 if entries[0].space is not None else suite["studies"])
    elif args.search_space:
        optimizer, space = load_search_space(args.search_space, args.optimizer)
        entries = [Entry(f"{optimizer}:{Path(args.search_space).stem}", optimizer, space=space)]
        studies = args.studies or 3
    elif args.hyperparameters:
        try:
            point = json.loads(args.hyperparameters)
        except ValueError as error:
            raise ValueError(f"invalid --hyperparameters={args.hyperparameters!r}: {error}") from error
        if not isinstance(point, dict):
            raise ValueError(f"invalid --hyperparameters={args.hyperparameters!r}: expected a JSON object")
        entries = [Entry(f"{o}{json.dumps(point, separators=(',', '='))}", o, hyperparameters=point)
                   for o in _optimizers(args.optimizers, suite["optimizers"])]
        studies = args.studies or suite["studies"]
    elif args.ruleset == "external":
        entries = [external_entry(o) for o in _optimizers(args.optimizers, suite["optimizers"])]
        studies = args.studies or 3
    else:
        entries = [self_tuning_entry(o) for o in _optimizers(args.optimizers, suite["optimizers"])]
        studies = args.studies or suite["studies"]
    return name, [p for e in entries for w in workloads
                  for p in plan(e, w, studies=studies, trials=args.trials, budget_scale=args.budget_scale,
                                suite=name, time_limit=not args.no_time_limit, tuner=args.tuner,
                                workers_per_trial=args.workers_per_trial,
                                link=Link(args.link_bandwidth, args.link_latency))]


def _check_ruleset(args) -> None:
    """``--ruleset`` against the flags that decide the ruleset themselves."""
    if args.ruleset == "self" and args.search_space:
        raise ValueError(f"invalid --ruleset='self' with --search-space={args.search_space!r}: a search space is"
                         " external tuning; drop one of them")
    if args.ruleset == "external" and args.hyperparameters:
        raise ValueError(f"invalid --ruleset='external' with --hyperparameters={args.hyperparameters!r}: a fixed"
                         " point is not tuned; drop one of them, or give --search-space")


def _open(storage: str, create: bool = True):
    """The store; a SQLite file's folder is created first, or, to read, the file must exist."""
    from gradwise.arena.store import Store

    if "://" not in storage:
        if not create and not Path(storage).exists():
            raise ValueError(f"no store at {storage!r}: run 'gradwise arena run' first or pass --storage")
        Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return Store(storage)


def cmd_run(args) -> int:
    from gradwise.arena.live import LiveBoard
    from gradwise.arena.report import write_report
    from gradwise.arena.rulesets import work
    from gradwise.arena.worker_pool import join_workers, start_workers

    suite, plans = _plans(args)
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > cpus:
        print(f"warning: load average {load:.1f} on {cpus} CPUs: times will be contended (the report flags them)",
              file=sys.stderr)
    store = _open(args.storage)
    helpers = start_workers(store, args.storage, plans, args.threads, args.workers)
    with LiveBoard(store, suite, plans, args.reference, live=not args.no_live) as board:
        work(store, plans, threads=args.threads, on_trial=board.on_trial, on_eval=board.on_eval)
        workers_ok = join_workers(helpers)
    if not workers_ok:
        return 1
    path = write_report(store.studies(), Path(args.out), suite, args.reference)
    board.print_final()
    print(f"\nreport: {path} and {path.with_suffix('.html')}")
    return 0


def cmd_score(args) -> int:
    from gradwise.arena.live import print_leaderboards

    print_leaderboards(_open(args.storage, create=False).studies(), args.suite, args.reference)
    return 0


def cmd_report(args) -> int:
    from gradwise.arena.report import write_report

    path = write_report(_open(args.storage, create=False).studies(), Path(args.out), args.suite, args.reference)
    print(f"report: {path} and {path.with_suffix('.html')}")
    return 0


def cmd_set_targets(args) -> int:
    from gradwise.arena.set_targets import set_target, write_targets
    from gradwise.arena.workloads import get_workload

    workloads = _names(args.workloads, [])
    for w in workloads:
        get_workload(w)
    store = _open(args.storage)
    results = {}
    for w in workloads:
        results[w] = set_target(store, w, trials=args.trials, seeds=args.seeds, threads=args.threads,
                                workers=args.workers, budget_scale=args.budget_scale,
                                on_trial=print_tuning_trial)
        results[w]["command"] = _set_targets_command(args)
        print(f"{w}: target {results[w]['metric']} {results[w]['target']:.4g} ({results[w]['algorithm']},"
              f" per seed {[round(v, 4) for v in results[w]['per_seed_best']]})")
    if not args.dry_run:
        write_targets(results)
        print("wrote gradwise/arena/targets.json")
    return 0


def print_tuning_trial(point, config, record) -> None:
    """One line per finished tuning trial; a trial that diverged has no best metric and says so."""
    if record:
        best = record["best_metric"]
        shown = "diverged (no finite metric)" if best is None else f"{best:.4g}"
        print(f"  {point.name} #{config.index}: best {record['metric']} {shown}")


def _set_targets_command(args) -> str:
    """The command line that reproduces this target setting, every option spelled out."""
    return (f"gradwise arena set-targets --workloads {args.workloads} --trials {args.trials} --seeds {args.seeds}"
            f" --threads {args.threads} --workers {args.workers} --budget-scale {args.budget_scale:g}"
            f" --storage {args.storage}")


def cmd_list(args) -> int:
    from rich.markup import escape
    from rich.table import Table

    from gradwise.arena.entries import entry_rows
    from gradwise.arena.live import console
    from gradwise.arena.workloads import WORKLOADS, get_workload

    for name in WORKLOADS:
        w = get_workload(name)
        print(f"{name}: {w.description}; target {w.metric} {'>=' if w.higher_is_better else '<='} {w.target:g},"
              f" {w.step_hint} steps / {w.max_runtime:g} s, batch {w.batch_size}, eval every {w.eval_every}")
    table = Table(title="arena entries (--optimizers NAME or NAME[FORMAT]; --ruleset external tunes over the space;"
                        " the last four run on --workers-per-trial workers, any H or r)")
    for column in ("entry", "self-tuning point", "space", "variants [FORMAT]"):
        table.add_column(column, overflow="fold")
    for row in entry_rows():
        table.add_row(*(escape(row[key]) for key in ("name", "point", "space", "variants")))  # PowerSGD[r=4]
    console().print(table)
    return 0


def cmd_delete_study(args) -> int:
    trials = _open(args.storage, create=False).delete_study(args.study)
    print(f"deleted study {args.study!r} ({trials} trial(s)) from {args.storage}")
    return 0


def cmd_claims(args) -> int:
    from gradwise.arena.cli_claims import cmd_claims as run_claims

    return run_claims(args, open_store=_open)


COMMANDS = {"run": cmd_run, "score": cmd_score, "report": cmd_report, "set-targets": cmd_set_targets,
            "list": cmd_list, "delete-study": cmd_delete_study, "claims": cmd_claims}


def main(args, parser: argparse.ArgumentParser) -> int:
    from gradwise.extras import require

    if args.arena_command is None:
        parser.error("missing arena command: choose from run, score, report, set-targets, list, delete-study,"
                     " claims")
    command = f"gradwise arena {args.arena_command}"
    require(command, "arena")
    if getattr(args, "storage", "").startswith("postgres"):
        require(f"{command} --storage {args.storage.split('://')[0]}://...", "postgres")
    try:
        return COMMANDS[args.arena_command](args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
