"""The claims table as Markdown (``claims.md``, also the arena report's "Claims" section), a forest plot of every
claim's figure with its spread over studies (``claims.png``) and a rich table, all from ``claims_measure``."""
from __future__ import annotations

import html
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gradwise.arena.claims import SUITE
from gradwise.arena.claims_measure import HOLDS, Measured, claim_workloads, measure_all
from gradwise.arena.styles import looks
from gradwise.arena.suites import SUITES

FIGURE = "claims.png"
QUANTITY_TEXT = {"steps": "speedup in steps to target", "time": "speedup in training time to target",
                 "state": "optimizer state bytes ratio", "quality": "validation quality ratio at equal steps"}
VERDICT_COLOR = {HOLDS: "green", "does not hold": "red", "inconclusive": "yellow"}


def _num(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3g}"


def _spread(m: Measured) -> str:
    lo, hi = m.spread
    return "-" if math.isnan(lo) else f"{_num(lo)}-{_num(hi)} ({len(m.figures)})"


def rows(measured: list[Measured]) -> list[list[str]]:
    """The table: one row per claim with its quote, entries, ruleset, quantity, figure, spread and verdict."""
    head = ["#", "claim", "quote (source)", "subject vs reference", "ruleset", "quantity (rule)", "figure (median)",
            "spread: min-max (studies)", "per workload (median)", "verdict"]
    body = [head]
    for i, m in enumerate(measured, 1):
        c = m.claim
        per_w = ", ".join(f"{w} {_num(v)}" for w, v in m.per_workload.items()) or "-"
        body.append([str(i), c.claim, f"{c.quote} ({c.source})", f"{c.subject} vs {c.reference}", c.ruleset,
                     f"{QUANTITY_TEXT[c.quantity]} ({c.rule})", _num(m.figure), _spread(m), per_w,
                     f"**{m.verdict}** ({m.note})"])
    return body


def _markdown(table: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])] + \
        ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in table[1:]]


def _scale(studies: list[dict[str, Any]], workloads: tuple[str, ...]) -> list[str]:
    """The scale the table was measured at, and the machine and load, from the records."""
    specs = [s["spec"] for s in studies if s["spec"]["suite"] == SUITE]
    records = [r for s in studies if s["spec"]["suite"] == SUITE for r in s["records"]]
    n_studies = max((sp["study"] + 1 for sp in specs), default=0)
    trials = max((sp["trials"] for sp in specs if sp["ruleset"] == "external"), default=0)
    unlimited = all(math.isinf(sp["max_runtime"]) for sp in specs) if specs else False
    loads = [x for r in records for x in (r["machine"]["loadavg"][0], r["loadavg_end"][0])]
    machine = records[0]["machine"] if records else {}
    pending = sum(s["pending"] for s in studies if s["spec"]["suite"] == SUITE)
    limit = "no time limit (trials stop at the target or the step budget)" if unlimited else "time limits on"
    lines = [f"Scale: workloads {', '.join(workloads)}; {n_studies} studies per entry and workload; external"
             f" tuning {trials} Halton trials per study over the shipped search spaces; self-tuning at 1.5x the step"
             f" budget; {limit}. {len(records)} trials.",
             f"Machine: {machine.get('cpu_model', '?')}, {machine.get('cpus', '?')} CPUs,"
             f" {machine.get('threads', '?')} torch thread(s) per trial, torch {machine.get('torch', '?')};"
             f" 1-minute load average over the trials {_num(min(loads, default=math.nan))}-"
             f"{_num(max(loads, default=math.nan))}: training times are contended, steps and memory are not."]
    left_out = [w for w in SUITES["full"]["workloads"] if w not in workloads]
    if left_out:
        lines.append(f"**Not the full suite**: {', '.join(left_out)} (of the full suite) were not run for this table,"
                     " to finish on this machine; every verdict is at this smaller scale.")
    if pending:
        lines.append(f"**{pending} trial(s) not finished**: their claims are measured on the complete studies only.")
    return lines


def claims_section(studies: list[dict[str, Any]], workloads: tuple[str, ...] | None = None,
                   figure: str | None = None) -> list[str]:
    """The Markdown lines of the claims table (an arena report's "Claims" section); none without claims studies."""
    workloads = workloads or claim_workloads(studies)
    if not workloads:
        return []
    measured = measure_all(studies, workloads)
    md = ["## Claims", "", *[x for line in _scale(studies, workloads) for x in (line, "")],
          "Each figure is the subject over the reference, one per study (the spread is the min-max over studies);"
          " speedups count a miss as the budget + 1 (AlgoPerf's rule), quality compares the validation metric at"
          " the last evaluation both trials reached. A verdict holds when every study is beyond the threshold,"
          " does not hold when none is, and is inconclusive when the spread straddles it or one side misses every"
          " target. 'At this scale' throughout: small CPU workloads, a few studies.", ""]
    md += _markdown(rows(measured)) + [""]
    if figure:
        md += [f"![each claim's figure with its spread over studies]({figure})", ""]
    return md


def claims_html(studies: list[dict[str, Any]]) -> str:
    """The claims table as an HTML section (empty without claims studies)."""
    workloads = claim_workloads(studies)
    if not workloads:
        return ""
    table = rows(measure_all(studies, workloads))
    cells = ["<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in table[0]) + "</tr>"]
    cells += ["<tr>" + "".join(f"<td class=wrap>{html.escape(c.replace('**', ''))}</td>" for c in r) + "</tr>"
              for r in table[1:]]
    scale = "".join(f"<p>{html.escape(line.replace('**', ''))}</p>" for line in _scale(studies, workloads))
    return f"<h2>Claims</h2>{scale}<table>{''.join(cells)}</table>"


def plot_claims(measured: list[Measured], path: Path) -> None:
    """A forest plot: per claim its median (dot, the subject's color) and min-max (bar) on a log axis, with the
    threshold (black tick)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    looks_ = looks(m.claim.subject for m in measured)
    fig, ax = plt.subplots(figsize=(12, 0.4 * len(measured) + 1.2), layout="constrained")
    clip = (1e-2, 1e2)
    for y, m in enumerate(measured):
        color = looks_[m.claim.subject].color
        ax.plot([m.claim.threshold] * 2, [y - 0.35, y + 0.35], color="black", linewidth=1.5)
        if m.figures:
            lo, hi = (min(max(v, clip[0]), clip[1]) for v in m.spread)
            ax.plot([lo, hi], [y, y], color=color, linewidth=3, solid_capstyle="butt")
            ax.plot([min(max(m.figure, clip[0]), clip[1])], [y], "o", color=color, markeredgecolor="black")
    ax.set_xscale("log")
    shown = [v for m in measured for v in (*m.spread, m.claim.threshold) if math.isfinite(v)]
    low, high = max(min(shown) / 1.5, clip[0]), min(max(shown) * 1.5, clip[1])
    ax.set_xlim(low, high)
    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if low <= t <= high]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks(range(len(measured)), [f"{i}. {m.claim.claim} [{m.verdict}]" for i, m in enumerate(measured, 1)],
                  fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("subject / reference (dot: median; bar: min-max over studies; black tick: threshold)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_claims(studies: list[dict[str, Any]], out: Path, workloads: tuple[str, ...], command: str) -> Path:
    """Write ``claims.md`` and ``claims.png`` into ``out``; returns the Markdown path."""
    out.mkdir(parents=True, exist_ok=True)
    plot_claims(measure_all(studies, workloads), out / FIGURE)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = ["# gradwise arena: the literature's claims at the arena's scale", "",
          f"Written {stamp} (load average then {os.getloadavg()[0]:.1f}) by:", "", "```", command, "```", ""]
    md += claims_section(studies, workloads, FIGURE)[2:]
    path = out / "claims.md"
    path.write_text("\n".join(md))
    return path


def print_claims(studies: list[dict[str, Any]], workloads: tuple[str, ...]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from gradwise.arena.live import console

    table = Table(title="claims (subject over reference; spread: min-max over studies)")
    for column in ("#", "claim", "subject vs reference", "ruleset", "quantity", "figure", "spread", "verdict"):
        table.add_column(column, overflow="fold")
    for i, m in enumerate(measure_all(studies, workloads), 1):
        color = VERDICT_COLOR[m.verdict]
        table.add_row(str(i), escape(m.claim.claim), escape(f"{m.claim.subject} vs {m.claim.reference}"),
                      m.claim.ruleset, m.claim.rule, _num(m.figure), _spread(m), f"[{color}]{m.verdict}[/{color}]")
    console().print(table)
