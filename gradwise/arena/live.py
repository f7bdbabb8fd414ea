"""Rich output: a progress bar and a live leaderboard while the arena runs, and leaderboard tables."""
from __future__ import annotations

import math
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gradwise.arena.leaderboard import collect, leaderboard
from gradwise.arena.styles import settings, short_names


def _cell(t: float, steps: float) -> str:
    return "miss" if not math.isfinite(t) else f"{t:.2f}s / {steps:.0f}"


def leaderboard_tables(studies: list[dict], suite: str | None, reference: str) -> list[Table]:
    """One table per ruleset, submissions by the report's short names; those shortened (a point given with
    ``--hyperparameters``) have their hyperparameters in the caption."""
    specs = {s["spec"]["submission"]: s["spec"] for s in studies if suite is None or s["spec"]["suite"] == suite}
    shorts = short_names(specs)
    tables = []
    for ruleset, group in sorted(collect(studies, suite).items()):
        workloads = sorted(group["budgets"])
        table = Table(title=f"arena leaderboard ({ruleset}-tuning{', ' + suite if suite else ''};"
                            f" time to target / steps)")
        for column in ["#", "submission", "score", f"speedup vs {reference}", *workloads]:
            table.add_column(column, justify="right" if column not in ("submission",) else "left")
        for rank, row in enumerate(leaderboard(group, reference), 1):
            speed = f"{row['speedup']:.3f}" if "speedup" in row else "-"
            table.add_row(str(rank), escape(shorts[row["submission"]]), f"{row['score']:.3f}", speed,
                          *[_cell(row["times"].get(w, math.inf), row["steps"].get(w, math.inf)) for w in workloads])
        caption = [escape(f"{shorts[n]}: {settings(specs[n])}") for n in sorted(group["times"]) if shorts[n] != n]
        links = sorted({(specs[n]["workers_per_trial"], specs[n]["link_bandwidth"], specs[n]["link_latency"])
                        for n in group["times"] if "workers_per_trial" in specs[n]})
        caption += [escape(f"NAME@{n}: {n} gloo workers; time = measured + simulated link ({b:.3g} bytes/s,"
                           f" {lat:g} s per collective)") for n, b, lat in links]
        if group["pending"]:
            caption.append(f"{group['pending']} trial(s) still to run; partial studies are not scored yet")
        table.caption = "\n".join(caption) or None
        tables.append(table)
    return tables


def console() -> Console:
    """A terminal's own width; 160 columns when writing to a file or pipe, so tables stay readable."""
    probe = Console()
    return probe if probe.is_terminal else Console(width=160)


def print_leaderboards(studies: list[dict], suite: str | None, reference: str) -> None:
    console_ = console()
    tables = leaderboard_tables(studies, suite, reference)
    if not tables:
        console_.print("no finished trials in this store")
    for table in tables:
        console_.print(table)


class LiveBoard:
    """Progress over the plans' trials, the trial running now, and the leaderboard after each trial."""

    def __init__(self, store, suite: str, plans, reference: str, live: bool = True):
        self.store, self.suite, self.reference, self.live_enabled = store, suite, reference, live
        names = {p.name for p in plans}
        total = sum(len(p.points) for p in plans)
        done = sum(len(s["records"]) for s in store.studies() if s["name"] in names)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn())
        self.task = self.progress.add_task("trials", total=total, completed=done)
        self.now = ""
        self.console = console()
        self.live: Live | None = None
        self.tables: list[Table] = []

    def _render(self, refresh: bool = True) -> Group:
        """Progress, the current trial, and the leaderboard (read from the store again after each trial)."""
        if refresh:
            self.tables = leaderboard_tables(self.store.studies(), self.suite, self.reference)
        return Group(self.progress, self.now, *self.tables)

    def __enter__(self) -> "LiveBoard":
        if self.live_enabled:
            self.live = Live(self._render(), console=self.console, refresh_per_second=2)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def on_trial(self, plan, claimed, record) -> None:
        if record is None:
            self.now = f"running {escape(plan.name)} trial {claimed.index}"
        else:
            self.progress.advance(self.task)
            outcome = "miss" if record["time_to_target"] is None else \
                f"{record['time_to_target']:.2f}s, {record['steps_to_target']} steps"
            self.now = f"done {escape(plan.name)} trial {claimed.index}: {outcome}"
            if self.live is None:
                self.console.print(self.now)
        if self.live is not None:
            self.live.update(self._render())

    def on_eval(self, point: dict) -> None:
        if self.live is not None:
            metrics = ", ".join(f"{k} {v:.4g}" for k, v in point.items() if k not in ("cpu_time",))
            self.now = f"{self.now.split(':')[0]}: {metrics}"
            self.live.update(self._render(refresh=False))

    def print_final(self) -> None:
        """The leaderboard once more, unless the live display already left it on screen."""
        if self.live is not None:
            return
        for table in leaderboard_tables(self.store.studies(), self.suite, self.reference):
            self.console.print(table)
