"""Printing the benchmarks' results as rich tables (``gradwise.bench_step.measure``'s), and their progress."""
from __future__ import annotations

import contextlib

from gradwise.bench_step import COPY_MB


def console(stderr: bool = False):
    """A rich console (the caller has checked ``gradwise.extras.require(..., "cli")``)."""
    from rich.console import Console

    out = Console(stderr=stderr, log_path=False)  # progress lines without the source location
    return out if out.is_terminal else Console(stderr=stderr, width=160, log_path=False)


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


def render(result: dict, out) -> None:
    from rich.table import Table

    h = result["header"]
    info = Table.grid(padding=(0, 2))
    for key, value in (
        ("torch", f"{h['torch']} (python {h['python']})"), ("cpu", h["cpu"]), ("threads", h["threads"]),
        ("load average", f"{_load(h['loadavg_start'])} at start, {_load(h['loadavg_end'])} at end"),
        ("parameters", f"{h['params']:,} ({h['params_label']}, preset {h['size']!r}) in {h['tensors']} tensors, fp32"),
        ("copy bandwidth", f"{h['copy_bandwidth_gbs']:.2f} GB/s (read + write, median of "
                           f"{len(h['copy_bandwidth_gbs_samples'])} copies of {COPY_MB} MiB); in-place add "
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
    out.print("compile s: seconds (graphs) from compile_stats, spent in the warm-up steps and excluded from the "
              "median (the first compiled row's also pays inductor's one-time start-up). x fused / x foreach: "
              "row median over torch's median in the same interleaved rounds. "
              "state B/param: every tensor in optimizer.state, the 0-d 'step' counters included, over the "
              "parameter count. bound: bytes moved per parameter (28 AdamW family, 20 Lion and SGD with "
              "momentum, 12 plain SGD) x parameters / copy bandwidth.")


def _load(values) -> str:
    return " ".join(f"{v:.2f}" for v in values)
