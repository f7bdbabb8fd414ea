"""The arena report: a Markdown and an HTML page with matplotlib figures (performance profiles, validation
curves against training time, time-to-target bars, memory), built from the store alone."""
from __future__ import annotations

import html
import math
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from typing import Any

from gradwise.arena import scoring
from gradwise.arena.leaderboard import collect, leaderboard


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fmt_time(t: float) -> str:
    return "miss" if not math.isfinite(t) else f"{t:.2f}"


def _fmt_steps(s: float) -> str:
    return "miss" if not math.isfinite(s) else f"{s:.0f}"


def _log_axis(ax, values: list[float]) -> None:
    """Log-scale the y axis over whole decades around the positive finite ``values``, so bars of nearly equal
    height look nearly equal (matplotlib's own limits would zoom in on their difference)."""
    ax.set_yscale("log")
    shown = [v for v in values if 0 < v < math.inf]
    if shown:
        ax.set_ylim(10 ** math.floor(math.log10(min(shown))), 10 ** math.ceil(math.log10(max(shown)) + 1e-9))


def plot_profiles(rows: list[dict], path: Path, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for row in rows:
        taus, rho = scoring.profile_curve(row["ratios"], points=400)
        ax.step(taus, rho, where="post", label=f"{row['submission']} ({row['score']:.3f})", linewidth=2)
    ax.set(xlabel="tau (time / best time)", ylabel="fraction of workloads within tau", xlim=(1, scoring.R_MAX),
           ylim=(-0.02, 1.02), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(group: dict, targets: dict[str, tuple[float, str]], path: Path) -> None:
    """One panel per workload: the validation metric against training time, the first trial of study 0
    of each submission (the best trial of study 0 under external tuning)."""
    plt = _plt()
    workloads = sorted(targets)
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.6), squeeze=False)
    for ax, wl in zip(axes[0], workloads):
        target, metric = targets[wl]
        values: list[float] = []
        for (sub, w), records in sorted(group["records"].items()):
            if w != wl or not records:
                continue
            first = [r for r in records if r.get("study_index", 0) == 0] or records
            sign = -1 if metric == "accuracy" else 1  # no trial reached: the one with the best metric
            best = min(first, key=lambda r: (r["time_to_target"] if r["time_to_target"] is not None else math.inf,
                                             sign * r["best_metric"] if r["best_metric"] is not None else math.inf))
            points = [p for p in best["curve"] if metric in p]
            ax.plot([p["time"] for p in points], [p[metric] for p in points], marker=".", label=sub)
            values += [p[metric] for p in points]
        if math.isfinite(target):  # target-setting studies have none
            ax.axhline(target, color="black", linestyle="--", linewidth=1, label="target")
        positive = [v for v in values if 0 < v < math.inf]
        if metric != "accuracy" and positive and max(positive) > 10 * min(positive):  # else linear reads better
            ax.set_yscale("log")
        elif metric == "accuracy" and math.isfinite(target):  # zoom on the approach to the target
            ax.set_ylim(max(0.0, target - 0.15), min(1.0, target + 0.03) + 0.005)
        ax.set(title=wl, xlabel="training time (s)", ylabel=f"validation {metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_bars(rows: list[dict], budgets: dict[str, float], path: Path, key: str = "times",
              ylabel: str = "time to target (s)") -> None:
    """Grouped bars per workload; a miss is drawn hatched up to the budget."""
    plt = _plt()
    workloads = sorted(budgets)
    fig, ax = plt.subplots(figsize=(max(6.4, 2.2 * len(workloads)), 4.0))
    width = 0.8 / max(1, len(rows))
    for i, row in enumerate(rows):
        for j, wl in enumerate(workloads):
            t = row[key].get(wl, math.inf)
            x = j + (i - (len(rows) - 1) / 2) * width
            if math.isfinite(t):
                ax.bar(x, t, width, color=f"C{i}", label=row["submission"] if j == 0 else None)
            else:  # hatched up to the time budget; for steps, a label on the axis
                height = budgets[wl] if key == "times" and math.isfinite(budgets[wl]) else 0
                if height:
                    ax.bar(x, height, width, color="white", edgecolor=f"C{i}", hatch="//",
                           label=row["submission"] if j == 0 else None)
                ax.annotate("miss", (x, height), xycoords=("data", "data") if height else ("data", "axes fraction"),
                            ha="center", va="bottom", fontsize=7, color=f"C{i}")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_xlim(-0.5, len(workloads) - 0.5)
    _log_axis(ax, [row[key].get(wl, math.inf) for row in rows for wl in workloads]
              + ([b for b in budgets.values()] if key == "times" else []))
    ax.set(ylabel=ylabel)
    ax.grid(axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_memory(group: dict, path: Path) -> None:
    """Optimizer state, exact: bytes per parameter and in total; and each trial's peak resident memory above
    its start (model, activations, state and allocator slack; per trial on Linux, see ``runner``), median
    over the submission's trials on the workload."""
    plt = _plt()
    subs = sorted({s for s, _ in group["records"]})
    workloads = sorted({w for _, w in group["records"]})
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 3.8))
    width = 0.8 / max(1, len(subs))
    for i, sub in enumerate(subs):
        for j, wl in enumerate(workloads):
            records = group["records"].get((sub, wl), [])
            if not records:
                continue
            x = j + (i - (len(subs) - 1) / 2) * width
            label = sub if j == 0 else None
            ax1.bar(x, records[0]["state_bytes"] / records[0]["params"], width, color=f"C{i}", label=label)
            ax2.bar(x, records[0]["state_bytes"] / 1024, width, color=f"C{i}", label=label)
            growth = [r["peak_rss_mb"] - r["rss_start_mb"] for r in records
                      if r.get("peak_rss_scope") == "trial" and r.get("rss_start_mb") is not None]
            if growth:
                ax3.bar(x, max(median(growth), 0.01), width, color=f"C{i}", label=label)
    for ax in (ax2, ax3):
        _log_axis(ax, [patch.get_height() for patch in ax.patches])
    for ax, label in ((ax1, "optimizer state bytes per parameter"), (ax2, "optimizer state (KiB)"),
                      (ax3, "peak RSS above trial start (MiB)")):
        ax.set_xticks(range(len(workloads)), workloads, fontsize=8, rotation=15)
        ax.set(ylabel=label)
        ax.grid(axis="y", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(rows: list[dict], workloads: list[str]) -> list[list[str]]:
    head = ["rank", "submission", "score", "speedup vs ref"] + [f"{w} (s / CPU s / steps)" for w in workloads]
    body = [head]
    for rank, row in enumerate(rows, 1):
        speed = f"{row['speedup']:.3f}" if "speedup" in row else "-"
        cells = [f"{_fmt_time(row['times'].get(w, math.inf))} / {_fmt_time(row['cpu'].get(w, math.inf))} /"
                 f" {_fmt_steps(row['steps'].get(w, math.inf))}" for w in workloads]
        body.append([str(rank), row["submission"], f"{row['score']:.3f}", speed] + cells)
    return body


def _loaded(record: dict) -> bool:
    machine = record["machine"]
    return max(machine["loadavg"][0], record["loadavg_end"][0]) > (machine["cpus"] or 1)


def _machine(studies: list[dict]) -> dict[str, Any]:
    for study in studies:
        for r in study["records"]:
            return r["machine"]
    return {}


def write_report(studies: list[dict], out: Path, suite: str | None = None, reference: str = "torch.AdamW") -> Path:
    """Write ``report.md``, ``report.html`` and the PNG figures into ``out``; returns the Markdown path."""
    out.mkdir(parents=True, exist_ok=True)
    groups = collect(studies, suite)
    machine = _machine(studies)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = [f"# gradwise arena report{f' ({suite} suite)' if suite else ''}", "",
          f"Written {stamp}. Machine: {machine.get('cpu_model', '?')}, {machine.get('threads', '?')} thread(s) per"
          f" trial, torch {machine.get('torch', '?')}, load average at the first trial {machine.get('loadavg')}.",
          "Times are training seconds (wall clock; then the CPU seconds of the same trials) to the validation"
          " target (evaluation untimed); 'miss' means the target was"
          " not reached within the budget. Score: AlgoPerf benchmark score (area under the performance profile"
          f" on [1, 4], times > 4x the best count as misses). Speedup: geometric mean of {reference}'s time over"
          " the submission's (a miss counts as budget + 1 s).", ""]
    loaded = [r for s in studies for r in s["records"] if _loaded(r)]
    if loaded:
        md[3:3] = [f"**Contended timings**: {len(loaded)} of {sum(len(s['records']) for s in studies)} trials ran"
                   " with a 1-minute load average above the number of CPUs; compare steps to target, which the"
                   " load does not change, and rerun on an idle machine for times.", ""]
    body_html = []
    for ruleset, group in sorted(groups.items()):
        rows = leaderboard(group, reference)
        workloads = sorted(group["budgets"])
        targets = {}
        for study in studies:
            spec = study["spec"]
            if spec["ruleset"] == ruleset and (suite is None or spec["suite"] == suite):
                targets[spec["workload"]] = (spec["target"], spec["metric"])
        figures = {f"{ruleset}_profiles.png": "performance profiles", f"{ruleset}_curves.png": "validation curves",
                   f"{ruleset}_time_to_target.png": "time to target", f"{ruleset}_steps_to_target.png":
                   "steps to target", f"{ruleset}_memory.png": "optimizer state memory"}
        if rows:
            plot_profiles(rows, out / f"{ruleset}_profiles.png", f"performance profiles ({ruleset}-tuning)")
            plot_bars(rows, group["budgets"], out / f"{ruleset}_time_to_target.png")
            plot_bars(rows, group["budgets"], out / f"{ruleset}_steps_to_target.png", key="steps",
                      ylabel="steps to target")
        plot_curves(group, targets, out / f"{ruleset}_curves.png")
        plot_memory(group, out / f"{ruleset}_memory.png")
        rows_text = table(rows, workloads)
        md += [f"## {ruleset}-tuning ruleset", ""]
        if group["pending"]:
            md += [f"**{group['pending']} trial(s) not finished yet**: scores cover finished studies only.", ""]
        md += ["| " + " | ".join(rows_text[0]) + " |", "|" + "---|" * len(rows_text[0])]
        md += ["| " + " | ".join(r) + " |" for r in rows_text[1:]]
        md += ["", "Targets: " + ", ".join(f"{w} {m} {'>=' if m == 'accuracy' else '<='} {t:g}"
                                            for w, (t, m) in sorted(targets.items())), ""]
        md += [f"![{caption}]({name})" for name, caption in figures.items() if (out / name).exists()] + [""]
        cells = "".join("<tr>" + "".join(f"<{'th' if i == 0 else 'td'}>{html.escape(c)}</{'th' if i == 0 else 'td'}>"
                                         for c in r) + "</tr>" for i, r in enumerate(rows_text))
        imgs = "".join(f'<figure><img src="{n}" alt="{c}"><figcaption>{c}</figcaption></figure>'
                       for n, c in figures.items() if (out / n).exists())
        body_html.append(f"<h2>{ruleset}-tuning ruleset</h2><table>{cells}</table>{imgs}")
    (out / "report.md").write_text("\n".join(md))
    intro = "".join(f"<p>{html.escape(line)}</p>" for line in md[2:6] if line and not line.startswith("#"))
    (out / "report.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>gradwise arena</title><style>body{font-family:sans-serif;"
        "max-width:1200px;margin:auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
        f"img{{max-width:100%}}</style><h1>{html.escape(md[0][2:])}</h1>{intro}{''.join(body_html)}")
    return out / "report.md"
