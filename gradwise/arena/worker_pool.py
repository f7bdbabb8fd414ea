"""Extra processes that run a store's trials beside this one (``--workers N``): every study is prepared here
first, so each worker finds them ready and claims trials from the same store, each trial run once."""
from __future__ import annotations

import multiprocessing
import sys


def run_from_storage(storage: str, plans, threads: int) -> None:
    """A worker process: open the store by its address and run the plans' unclaimed trials."""
    from gradwise.arena.rulesets import work
    from gradwise.arena.store import Store

    work(Store(storage), plans, threads=threads)


def start_workers(store, storage: str, plans, threads: int, workers: int) -> list:
    """Prepare every plan's study in ``store``, then start ``workers - 1`` processes on ``storage``."""
    for p in plans:
        store.prepare(p.name, p.spec, p.points, p.seeds, p.distributions)
    context = multiprocessing.get_context("spawn")
    helpers = [context.Process(target=run_from_storage, args=(storage, plans, threads)) for _ in range(workers - 1)]
    for h in helpers:
        h.start()
    return helpers


def join_workers(helpers: list) -> bool:
    """Wait for the workers; False, with a message on stderr, when any of them failed."""
    for h in helpers:
        h.join()
    failed = sum(bool(h.exitcode) for h in helpers)
    if failed:
        print(f"error: {failed} worker process(es) failed", file=sys.stderr)
    return not failed
