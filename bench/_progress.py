"""The long benchmarks' progress bar, on stderr (``bench/convergence.py``, ``bench/matrix_step.py``)."""
from __future__ import annotations

import contextlib

from gradwise.console import console


@contextlib.contextmanager
def progress(script: str, total: int, what: str):
    """A progress bar on stderr for ``total`` units of ``what``; yields the function that advances it by one."""
    from gradwise.extras import require

    require(script, "cli")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(stderr=True)) as bar:
        task = bar.add_task(what, total=total)
        yield lambda: bar.advance(task)
