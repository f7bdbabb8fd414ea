"""The arena report: a Markdown and an HTML page with matplotlib figures (``figures``: performance profiles,
validation curves against training time, time and steps to target, memory), built from the store alone.

Each submission gets one look for the whole report (``styles.looks``: a short name and a color), used by every
figure and table; its hyperparameters (or search space) go into a table of their own beside the leaderboard.
"""
from __future__ import annotations

import html
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gradwise.arena.claims_report import claims_html, claims_section
from gradwise.arena.figures import plot_bars, plot_curves, plot_memory, plot_profiles
from gradwise.arena.leaderboard import collect, leaderboard
from gradwise.arena.styles import Look, looks, settings

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:0 12px;box-sizing:content-box}"
         "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
         "td{white-space:nowrap}td.wrap{white-space:normal}img{max-width:100%}.swatch{display:inline-block;"
         "width:12px;height:12px;margin-right:6px;vertical-align:middle}figure{margin:16px 0}")


def _fmt_time(t: float) -> str:
    return "miss" if not math.isfinite(t) else f"{t:.2f}"


def _fmt_steps(s: float) -> str:
    return "miss" if not math.isfinite(s) else f"{s:.0f}"


def table(rows: list[dict], workloads: list[str], looks_: dict[str, Look]) -> list[list[str]]:
    """The leaderboard, best first, submissions by their short names."""
    head = ["rank", "submission", "score", "speedup vs ref"] + [f"{w} (s / CPU s / steps)" for w in workloads]
    body = [head]
    for rank, row in enumerate(rows, 1):
        speed = f"{row['speedup']:.3f}" if "speedup" in row else "-"
        cells = [f"{_fmt_time(row['times'].get(w, math.inf))} / {_fmt_time(row['cpu'].get(w, math.inf))} /"
                 f" {_fmt_steps(row['steps'].get(w, math.inf))}" for w in workloads]
        body.append([str(rank), looks_[row["submission"]].short, f"{row['score']:.3f}", speed] + cells)
    return body


def settings_table(specs: dict[str, dict], looks_: dict[str, Look], ruleset: str) -> list[list[str]]:
    """One row per submission of a ruleset, in palette order: its optimizer and its hyperparameters (self
    tuning) or search space (external tuning)."""
    head = ["submission", "optimizer", "search space" if ruleset == "external" else "hyperparameters"]
    return [head] + [[looks_[n].short, specs[n]["optimizer"], settings(specs[n])] for n in looks_ if n in specs]


def _markdown(rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])] + \
        ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows[1:]]


def _html(rows: list[list[str]], looks_: dict[str, Look], column: int, wrap: int | None = None) -> str:
    """A table whose ``column`` holds short names, each after a swatch of its color; ``wrap`` may wrap."""
    colors = {look.short: look.color for look in looks_.values()}
    out = ["<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in rows[0]) + "</tr>"]
    for r in rows[1:]:
        cells = []
        for i, c in enumerate(r):
            swatch = f"<span class='swatch' style='background:{colors[c]}'></span>" if i == column else ""
            cells.append(f"<td{' class=wrap' if i == wrap else ''}>{swatch}{html.escape(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table>{''.join(out)}</table>"


def _paragraph(line: str) -> str:
    """A Markdown line as an HTML paragraph: escaped, ``**bold**`` kept bold."""
    return "<p>" + re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(line)) + "</p>"


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
    studies = [s for s in studies if suite is None or s["spec"]["suite"] == suite]
    groups = collect(studies)
    looks_ = looks(s["spec"]["submission"] for s in studies)  # once for the whole report
    machine = _machine(studies)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = [f"# gradwise arena report{f' ({suite} suite)' if suite else ''}", "",
          f"Written {stamp}. Machine: {machine.get('cpu_model', '?')}, {machine.get('threads', '?')} thread(s) per"
          f" trial, torch {machine.get('torch', '?')}, load average at the first trial {machine.get('loadavg')}.",
          "", "Times are training seconds (wall clock; then the CPU seconds of the same trials) to the validation"
          " target (evaluation untimed); 'miss' means the target was"
          " not reached within the budget. Score: AlgoPerf benchmark score (area under the performance profile"
          f" on [1, 4], times > 4x the best count as misses). Speedup: geometric mean of"
          f" {looks_[reference].short if reference in looks_ else reference}'s time over"
          " the submission's (a miss counts as budget + 1 s).", ""]
    loaded = [r for s in studies for r in s["records"] if _loaded(r)]
    if loaded:
        md[4:4] = [f"**Contended timings**: {len(loaded)} of {sum(len(s['records']) for s in studies)} trials ran"
                   " with a 1-minute load average above the number of CPUs; compare steps to target, which the"
                   " load does not change, and rerun on an idle machine for times.", ""]
    intro = "".join(_paragraph(line) for line in md[2:] if line)
    body_html = []
    for ruleset, group in sorted(groups.items()):
        rows = leaderboard(group, reference)
        workloads = sorted(group["budgets"])
        targets, specs = {}, {}
        for study in studies:
            spec = study["spec"]
            if spec["ruleset"] == ruleset:
                targets[spec["workload"]] = (spec["target"], spec["metric"])
                specs.setdefault(spec["submission"], spec)
        figures = {f"{ruleset}_profiles.png": "performance profiles", f"{ruleset}_curves.png": "validation curves",
                   f"{ruleset}_time_to_target.png": "time to target", f"{ruleset}_steps_to_target.png":
                   "steps to target", f"{ruleset}_memory.png": "optimizer state memory"}
        if rows:
            plot_profiles(rows, looks_, out / f"{ruleset}_profiles.png", f"performance profiles ({ruleset}-tuning)")
            plot_bars(rows, group["budgets"], looks_, out / f"{ruleset}_time_to_target.png")
            plot_bars(rows, group["step_budgets"], looks_, out / f"{ruleset}_steps_to_target.png", key="steps",
                      ylabel="steps to target")
        plot_curves(group, targets, looks_, out / f"{ruleset}_curves.png")
        plot_memory(group, looks_, out / f"{ruleset}_memory.png")
        board, entered = table(rows, workloads, looks_), settings_table(specs, looks_, ruleset)
        md += [f"## {ruleset}-tuning ruleset", ""]
        pending = f"**{group['pending']} trial(s) not finished yet**: scores cover finished studies only."
        if group["pending"]:
            md += [pending, ""]
        md += _markdown(board) + ["", "Submissions:", ""] + _markdown(entered)
        targets_line = "Targets: " + ", ".join(f"{w} {m} {'>=' if m == 'accuracy' else '<='} {t:g}"
                                               for w, (t, m) in sorted(targets.items()))
        md += ["", targets_line, ""]
        shown = {name: caption for name, caption in figures.items() if (out / name).exists()}
        md += [f"![{caption}]({name})" for name, caption in shown.items()] + [""]
        imgs = "".join(f'<figure><img src="{n}" alt="{c}"><figcaption>{c}</figcaption></figure>'
                       for n, c in shown.items())
        body_html.append(f"<h2>{ruleset}-tuning ruleset</h2>{_paragraph(pending) if group['pending'] else ''}"
                         f"{_html(board, looks_, 1)}<h3>Submissions</h3>{_html(entered, looks_, 0, wrap=2)}"
                         f"<p>{html.escape(targets_line)}</p>{imgs}")
    md += claims_section(studies)  # empty unless the store holds `gradwise arena claims` studies
    body_html.append(claims_html(studies))
    (out / "report.md").write_text("\n".join(md))
    (out / "report.html").write_text(
        f"<!doctype html><meta charset='utf-8'><title>gradwise arena</title><style>{STYLE}</style>"
        f"<h1>{html.escape(md[0][2:])}</h1>{intro}{''.join(body_html)}")
    return out / "report.md"
