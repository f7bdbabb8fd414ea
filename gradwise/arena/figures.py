"""The arena report's matplotlib figures: performance profiles, validation curves against training time, time
and steps to target, memory. Each takes the report's ``looks`` (``styles.looks``, assigned once per report), so a
submission has one color and one short name in every figure, drawn in the same order everywhere; each figure
has one legend, outside its axes on the right, so it never covers data. Artists carry their submission's full
name as ``gid``. Figures are at most 1200 pixels wide, the HTML report's width, so none is shown shrunk."""
from __future__ import annotations

import math
from pathlib import Path
from statistics import median

from gradwise.arena import scoring
from gradwise.arena.styles import Look

MISS_HATCH = "//"
RSS_FLOOR_MB = 0.01  # no growth (or a shrink) is drawn at this height on the log axis


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes(rows: int, cols: int, width: float, height: float):
    """A figure of ``rows`` x ``cols`` panels, laid out so that a legend outside the panels gets its room."""
    return _plt().subplots(rows, cols, figsize=(width, height), squeeze=False, layout="constrained")


def _legend_and_save(fig, looks: dict[str, Look], shown: set[str], path: Path, *, bars: bool = False,
                     extra: tuple = (), dpi: int = 100) -> None:
    """The figure's one legend, right of its panels: ``shown`` submissions in palette order, then ``extra``
    ``(handle, label)`` pairs; then save and close."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    order = [n for n in looks if n in shown]
    handles = [Patch(facecolor=looks[n].color) if bars else
               Line2D([], [], color=looks[n].color, linestyle=looks[n].linestyle, linewidth=2) for n in order]
    handles += [h for h, _ in extra]
    if handles:
        fig.legend(handles, [looks[n].short for n in order] + [label for _, label in extra],
                   loc="outside right upper", fontsize=8, frameon=False)
    fig.savefig(path, dpi=dpi)
    _plt().close(fig)


def _miss_handle(unlimited: bool):
    from matplotlib.patches import Patch

    where = "no budget: bar to the top" if unlimited else "bar up to the budget"
    return Patch(facecolor="white", edgecolor="#555555", hatch=MISS_HATCH), f"missed the target ({where})"


def _log_axis(ax, values: list[float]) -> None:
    """Log-scale the y axis over whole decades around the positive finite ``values``, so bars of nearly equal
    height look nearly equal (matplotlib's own limits would zoom in on their difference); a value on a decade
    gets the decade below too, so a bar of that height shows."""
    from matplotlib.ticker import NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_minor_formatter(NullFormatter())  # the decades are labelled; 2x, 3x, ... labels only crowd
    shown = [v for v in values if 0 < v < math.inf]
    low, high = (min(shown), max(shown)) if shown else (1.0, 1.0)
    ax.set_ylim(10 ** math.floor(math.log10(low) - 1e-9), 10 ** math.ceil(math.log10(high) + 1e-9))


def plot_profiles(rows: list[dict], looks: dict[str, Look], path: Path, title: str) -> None:
    """Performance profiles; where lines coincide (equal scores) the earlier ones are drawn wider beneath."""
    fig, [[ax]] = _axes(1, 1, 7.6, 4.0)
    by_name = {row["submission"]: row for row in rows}
    order = [n for n in looks if n in by_name]
    for k, name in enumerate(order):
        taus, rho = scoring.profile_curve(by_name[name]["ratios"], points=400)
        width = 1.5 + 3.0 * (len(order) - 1 - k) / max(1, len(order) - 1)
        ax.step(taus, rho, where="post", color=looks[name].color, linestyle=looks[name].linestyle,
                linewidth=width, gid=name)
    ax.set(xlabel="tau (time / best time)", ylabel="fraction of workloads within tau", xlim=(1, scoring.R_MAX),
           ylim=(-0.03, 1.03), title=title)
    ax.grid(alpha=0.3)
    _legend_and_save(fig, looks, set(order), path, dpi=110)


def _shown_trial(records: list[dict], metric: str) -> dict:
    """Study 0's fastest trial to the target; if none reached it, the one with the best metric."""
    first = [r for r in records if r.get("study_index", 0) == 0] or records
    sign = -1 if metric == "accuracy" else 1
    return min(first, key=lambda r: (r["time_to_target"] if r["time_to_target"] is not None else math.inf,
                                     sign * r["best_metric"] if r["best_metric"] is not None else math.inf))


def plot_curves(group: dict, targets: dict[str, tuple[float, str]], looks: dict[str, Look], path: Path) -> None:
    """One panel per workload, three to a row: the validation metric against training time of study 0's
    shown trial (``_shown_trial``) of each submission."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    workloads = sorted(targets)
    cols = min(3, len(workloads))
    rows = math.ceil(len(workloads) / cols)
    fig, axes = _axes(rows, cols, 3.4 * cols + 1.8, 3.2 * rows)
    shown: set[str] = set()
    for ax, wl in zip(axes.flat, workloads):
        target, metric = targets[wl]
        values: list[float] = []
        for name in looks:
            records = group["records"].get((name, wl))
            if not records:
                continue
            points = [p for p in _shown_trial(records, metric)["curve"] if metric in p]
            ax.plot([p["time"] for p in points], [p[metric] for p in points], marker=".", color=looks[name].color,
                    linestyle=looks[name].linestyle, gid=name)
            values += [p[metric] for p in points]
            shown.add(name)
        if math.isfinite(target):  # target-setting studies have none
            ax.axhline(target, color="black", linestyle="--", linewidth=1)
        positive = [v for v in values if 0 < v < math.inf]
        if metric != "accuracy" and positive and max(positive) > 10 * min(positive):  # else linear reads better
            ax.set_yscale("log")
        elif metric == "accuracy" and math.isfinite(target):  # zoom on the approach to the target
            ax.set_ylim(max(0.0, target - 0.15), min(1.0, target + 0.03) + 0.005)
        ax.set(title=wl, xlabel="training time (s)", ylabel=f"validation {metric}")
        ax.xaxis.set_major_locator(MaxNLocator(5))  # narrow panels: more tick labels would run into each other
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(workloads):]:
        ax.remove()
    target_line = (Line2D([], [], color="black", linestyle="--", linewidth=1), "target")
    _legend_and_save(fig, looks, shown, path, extra=(target_line,))


def plot_bars(rows: list[dict], budgets: dict[str, float], looks: dict[str, Look], path: Path, key: str = "times",
              ylabel: str = "time to target (s)") -> None:
    """Grouped bars per workload, one per submission in palette order; a miss is drawn hatched up to the
    budget (``budgets``, in ``key``'s unit), or to the top of the axis where the budget is unlimited."""
    workloads = sorted(budgets)
    fig, [[ax]] = _axes(1, 1, min(12.0, 1.8 * len(workloads) + 4.4), 4.0)
    by_name = {row["submission"]: row for row in rows}
    order = [n for n in looks if n in by_name]
    values = [by_name[n][key].get(wl, math.inf) for n in order for wl in workloads]
    _log_axis(ax, values + list(budgets.values()))
    top = ax.get_ylim()[1]
    width = 0.8 / max(1, len(order))
    missed: set[bool] = set()  # misses drawn, by whether their budget is unlimited
    for i, name in enumerate(order):
        color = looks[name].color
        for j, wl in enumerate(workloads):
            x = j + (i - (len(order) - 1) / 2) * width
            value = by_name[name][key].get(wl, math.inf)
            if math.isfinite(value):
                ax.bar(x, value, width, color=color, gid=name)
            else:
                limited = math.isfinite(budgets[wl])
                ax.bar(x, budgets[wl] if limited else top, width, color="white", edgecolor=color, hatch=MISS_HATCH,
                       gid=name)
                missed.add(not limited)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_xlim(-0.5, len(workloads) - 0.5)
    ax.set(ylabel=ylabel)
    ax.grid(axis="y", alpha=0.3)
    _legend_and_save(fig, looks, set(order), path, bars=True, extra=tuple(_miss_handle(u) for u in sorted(missed)))


def plot_memory(group: dict, looks: dict[str, Look], path: Path) -> None:
    """Optimizer state, exact: bytes per parameter and in total; and each trial's peak resident memory above
    its start (model, activations, state and allocator slack; per trial on Linux, see ``runner``), median
    over the submission's trials on the workload."""
    order = [n for n in looks if any(s == n for s, _ in group["records"])]
    workloads = sorted({w for _, w in group["records"]})
    fig, [[ax1, ax2, ax3]] = _axes(1, 3, 12.0, 3.8)
    width = 0.8 / max(1, len(order))
    for i, name in enumerate(order):
        color = looks[name].color
        for j, wl in enumerate(workloads):
            records = group["records"].get((name, wl), [])
            if not records:
                continue
            x = j + (i - (len(order) - 1) / 2) * width
            ax1.bar(x, records[0]["state_bytes"] / records[0]["params"], width, color=color, gid=name)
            ax2.bar(x, records[0]["state_bytes"] / 1024, width, color=color, gid=name)
            growth = [r["peak_rss_mb"] - r["rss_start_mb"] for r in records
                      if r.get("peak_rss_scope") == "trial" and r.get("rss_start_mb") is not None]
            if growth:
                ax3.bar(x, max(median(growth), RSS_FLOOR_MB), width, color=color, gid=name)
    for ax in (ax2, ax3):
        _log_axis(ax, [patch.get_height() for patch in ax.patches])
    for ax, label in ((ax1, "optimizer state bytes per parameter"), (ax2, "optimizer state (KiB)"),
                      (ax3, f"peak RSS above trial start (MiB, >= {RSS_FLOOR_MB:g})")):
        ax.set_xticks(range(len(workloads)), workloads, fontsize=8, rotation=20, ha="right")
        ax.set(ylabel=label)
        ax.grid(axis="y", alpha=0.3)
    _legend_and_save(fig, looks, set(order), path, bars=True)
