"""``gradwise arena claims``: run (or resume from the store) exactly the studies the claims table needs, then write
``claims.md`` with its figure and print the table."""
from __future__ import annotations

from pathlib import Path

DEFAULT_CLAIMS_STORAGE = "arena-results/claims.db"
DEFAULT_CLAIMS_OUT = "docs/arena"


def add_claims_parser(commands, positive, formatter) -> None:
    """The ``claims`` subcommand's arguments (``positive``: the arena CLI's parser of numbers > 0). Nothing of the
    arena is imported here: ``gradwise --help`` runs without the ``arena`` extra."""
    claims = commands.add_parser("claims", help="test the literature's headline claims on the arena and write the"
                                 " claims table (claims.md)", formatter_class=formatter)
    claims.add_argument("--storage", default=DEFAULT_CLAIMS_STORAGE, help="SQLite file or SQLAlchemy URL")
    claims.add_argument("--out", default=DEFAULT_CLAIMS_OUT, help="directory for claims.md and its figure")
    claims.add_argument("--workloads", help="comma-separated workloads (default: the claims table's own,"
                        " digits_cnn,lstsq_ill_conditioned)")
    claims.add_argument("--studies", type=positive(int), default=2, help="studies per entry and workload (the"
                        " spread is over them)")
    claims.add_argument("--trials", type=positive(int), default=2, help="Halton trials per external study")
    claims.add_argument("--time-limit", action="store_true", help="also stop trials at the time budget (default:"
                        " the target or the step budget only, so steps do not depend on the machine's load)")
    claims.add_argument("--budget-scale", type=positive(float), default=1.0, help="multiply every step and time"
                        " budget (for smoke runs)")
    claims.add_argument("--workers", type=positive(int), default=1, help="processes running trials at once")
    claims.add_argument("--threads", type=positive(int), default=1, help="torch threads per trial")
    claims.add_argument("--report-only", action="store_true", help="run nothing: write the table from the studies"
                        " already in the store (a claim whose studies are missing is inconclusive)")


def command_line(args) -> str:
    """The command that reproduces this table, every option spelled out."""
    return (f"gradwise arena claims --storage {args.storage} --out {args.out} --workloads {args.workloads}"
            f" --studies {args.studies} --trials {args.trials}{' --time-limit' if args.time_limit else ''}"
            f"{f' --budget-scale {args.budget_scale:g}' if args.budget_scale != 1 else ''}"
            f" --workers {args.workers} --threads {args.threads}")


def _log(plan, claimed, record) -> None:
    if record is not None:
        outcome = f"reached at step {record['steps_to_target']}" if record["reached"] else "missed"
        print(f"  {plan.name} #{claimed.index}: {outcome} ({record['train_time']:.1f} s)", flush=True)


def cmd_claims(args, *, open_store) -> int:
    """Run or resume the claims' studies, write ``claims.md``; ``open_store(storage, create)`` is the arena CLI's, so
    the store opens as for ``gradwise arena run``, and ``--workers`` runs extra worker processes as it does."""
    from gradwise.arena.claims import WORKLOADS, claim_plans
    from gradwise.arena.claims_report import print_claims, write_claims
    from gradwise.arena.rulesets import work
    from gradwise.arena.worker_pool import join_workers, start_workers
    from gradwise.arena.workloads import get_workload

    if args.workloads is None:
        args.workloads = ",".join(WORKLOADS)
    workloads = tuple(n.strip() for n in args.workloads.split(",") if n.strip())
    for w in workloads:
        get_workload(w)  # unknown names fail before anything runs
    plans = claim_plans(studies=args.studies, trials=args.trials, workloads=workloads,
                        time_limit=args.time_limit, budget_scale=args.budget_scale)
    store = open_store(args.storage, create=not args.report_only)
    if not args.report_only:
        helpers = start_workers(store, args.storage, plans, args.threads, args.workers)
        work(store, plans, threads=args.threads, on_trial=_log)
        if not join_workers(helpers):
            return 1
    names = {p.name for p in plans}
    studies = [s for s in store.studies() if s["name"] in names]
    path = write_claims(studies, Path(args.out), workloads, command_line(args))
    print_claims(studies, workloads)
    print(f"\nclaims: {path}")
    return 0
