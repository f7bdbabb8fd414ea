"""From stored trial records to per-workload times, scores and the leaderboard (one per ruleset)."""
from __future__ import annotations

import math
from collections import defaultdict
from statistics import median
from typing import Any

from gradwise.arena import scoring


def collect(studies: list[dict[str, Any]], suite: str | None = None) -> dict[str, dict]:
    """ruleset -> {"times": {submission: {workload: t}}, "steps": ..., "cpu": ..., "budgets": {workload: s},
    "step_budgets": {workload: steps}, "records": {(submission, workload): [records]}, "pending": n}."""
    grouped: dict[str, dict] = defaultdict(lambda: {"studies": defaultdict(list), "steps": defaultdict(list),
                                                    "cpu": defaultdict(list),
                                                    "budgets": {}, "step_budgets": {}, "records": defaultdict(list),
                                                    "pending": 0})
    for study in studies:
        spec = study["spec"]
        if suite is not None and spec["suite"] != suite:
            continue
        g = grouped[spec["ruleset"]]
        key = (spec["submission"], spec["workload"])
        g["pending"] += study["pending"]
        g["budgets"][spec["workload"]] = spec["max_runtime"]
        g["step_budgets"][spec["workload"]] = spec["max_steps"]
        g["records"][key].extend(study["records"])
        if study["records"] and study["pending"] == 0:
            times = [r["time_to_target"] if r["time_to_target"] is not None else math.inf for r in study["records"]]
            g["studies"][key].append(times)
            hits = [r for r in study["records"] if r["reached"]]
            fastest = min(hits, key=lambda r: r["time_to_target"]) if hits else None
            g["steps"][key].append(fastest["steps_to_target"] if fastest else math.inf)
            g["cpu"][key].append(fastest["cpu_time"] if fastest else math.inf)
    result = {}
    for ruleset, g in grouped.items():
        times: dict[str, dict[str, float]] = defaultdict(dict)
        steps: dict[str, dict[str, float]] = defaultdict(dict)
        cpu: dict[str, dict[str, float]] = defaultdict(dict)
        for (sub, wl), per_study in g["studies"].items():
            times[sub][wl] = scoring.workload_time(per_study)
            steps[sub][wl] = float(median(g["steps"][(sub, wl)]))
            cpu[sub][wl] = float(median(g["cpu"][(sub, wl)]))
        result[ruleset] = {"times": dict(times), "steps": dict(steps), "cpu": dict(cpu), "budgets": g["budgets"],
                           "step_budgets": g["step_budgets"], "records": dict(g["records"]), "pending": g["pending"]}
    return result


def leaderboard(group: dict, reference: str | None = None) -> list[dict[str, Any]]:
    """Rows best first: submission, score, speedup against ``reference`` (if it ran), per-workload times."""
    times = group["times"]
    if not times:
        return []
    scores = scoring.scores(times)
    ratios = scoring.performance_ratios(times)
    rows = []
    for sub, score in scores.items():
        row = {"submission": sub, "score": score, "times": times[sub], "ratios": ratios[sub],
               "steps": group["steps"].get(sub, {}), "cpu": group["cpu"].get(sub, {})}
        if reference in times:
            row["speedup"] = scoring.gmean_speedup(times[sub], times[reference], group["budgets"])
        rows.append(row)
    return rows
