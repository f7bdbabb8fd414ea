"""Each claim's figure, spread and verdict, computed from the store's records alone (``Store.studies()``).

For every study index both entries completed on every workload, one figure (``claims`` describes the four
quantities): the speedups use ``scoring.gmean_speedup`` (a miss counts as the budget + 1), on the fastest trial
of each study as AlgoPerf's per-workload time does. The claim's figure is the median over studies, its spread
the min-max. The verdict follows ``Claim.rule``: ``holds`` when every study is beyond the threshold on the
claimed side, ``does not hold`` when none is, else ``inconclusive``; also inconclusive without a complete study,
and for steps and time when one side misses every target in every study (no step or time to compare).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from gradwise.arena.claims import CLAIMS, SUITE, Claim
from gradwise.arena.rulesets import SELF_TUNING_BUDGET
from gradwise.arena.scoring import gmean_speedup
from gradwise.arena.workloads import get_workload

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"


@dataclass
class Measured:
    """A claim as measured: one figure per complete study, per workload the median over studies, the verdict and
    why (``note``)."""

    claim: Claim
    figures: list[float] = field(default_factory=list)
    per_workload: dict[str, float] = field(default_factory=dict)
    verdict: str = INCONCLUSIVE
    note: str = ""

    @property
    def figure(self) -> float:
        return float(median(self.figures)) if self.figures else math.nan

    @property
    def spread(self) -> tuple[float, float]:
        return (min(self.figures), max(self.figures)) if self.figures else (math.nan, math.nan)


def _index(studies: list[dict[str, Any]]) -> dict[tuple[str, str, str, int], list[dict]]:
    """(ruleset, submission, workload, study index) -> the records of that complete study of suite ``claims``."""
    result = {}
    for s in studies:
        spec = s["spec"]
        if spec["suite"] == SUITE and s["pending"] == 0 and s["records"]:
            result[(spec["ruleset"], spec["submission"], spec["workload"], spec["study"])] = s["records"]
    return result


def _fastest(records: list[dict], key: str) -> float:
    """The smallest ``key`` (``steps_to_target`` or ``time_to_target``) over the trials that reached the target."""
    return min((float(r[key]) for r in records if r["reached"]), default=math.inf)


def _time_budget(records: list[dict]) -> float:
    """The time a miss counts as (less 1 s): the trials' time budget; without one (``--no-time-limit``) the
    longest training time of ``records`` (a miss ran its whole step budget), at least the workload's nominal
    budget, so a miss never counts as faster than a hit of the same comparison."""
    if math.isfinite(records[0]["max_runtime"]):
        return float(records[0]["max_runtime"])
    scale = SELF_TUNING_BUDGET if records[0]["ruleset"] == "self" else 1.0
    return max(get_workload(records[0]["workload"]).max_runtime * scale, *(r["train_time"] for r in records))


def _quality(sub: dict, ref: dict) -> float:
    """The subject's validation quality over the reference's at the last evaluation step both reached (0 when the
    subject has no evaluation there, e.g. it diverged first)."""
    metric = ref["metric"]
    at_sub = {p["step"]: p[metric] for p in sub["curve"] if metric in p}
    at_ref = {p["step"]: p[metric] for p in ref["curve"] if metric in p}
    common = set(at_sub) & set(at_ref)
    if not common:
        return 0.0 if at_ref else math.nan
    step = max(common)
    v_sub, v_ref = at_sub[step], at_ref[step]
    ratio = v_sub / v_ref if metric == "accuracy" else v_ref / v_sub
    return ratio if math.isfinite(ratio) else 0.0


def _gmean(values: list[float]) -> float:
    if any(v <= 0 for v in values):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _per_workload(claim: Claim, sub: list[dict], ref: list[dict]) -> float:
    """The claim's quantity on one workload and study (the subject over the reference, as ``claims`` defines it)."""
    if claim.quantity == "steps":
        return ref_over_sub(_fastest(ref, "steps_to_target"), _fastest(sub, "steps_to_target"),
                            float(ref[0]["max_steps"]) + 1)
    if claim.quantity == "time":
        return ref_over_sub(_fastest(ref, "time_to_target"), _fastest(sub, "time_to_target"),
                            _time_budget(sub + ref) + 1)
    if claim.quantity == "state":
        return sub[0]["state_bytes"] / ref[0]["state_bytes"] if ref[0]["state_bytes"] else math.nan
    best = max(sub, key=lambda r: (r["reached"], -(r["steps_to_target"] or math.inf)))
    return _quality(best, max(ref, key=lambda r: (r["reached"], -(r["steps_to_target"] or math.inf))))


def ref_over_sub(t_ref: float, t_sub: float, cap: float) -> float:
    """One workload's speedup, a miss (``inf``) counted as ``cap`` (AlgoPerf's budget + 1)."""
    return gmean_speedup({"w": t_sub}, {"w": t_ref}, {"w": cap - 1})


def measure(claim: Claim, studies: list[dict[str, Any]], workloads: tuple[str, ...]) -> Measured:
    """The claim measured on ``workloads`` from the store's ``studies`` (those of other suites are ignored)."""
    index = _index(studies)
    result = Measured(claim)
    runs = sorted({k[3] for k in index if k[:2] == (claim.ruleset, claim.subject)})
    per_w: dict[str, list[float]] = {w: [] for w in workloads}
    hits = {"sub": False, "ref": False}
    for j in runs:
        pairs = [(index.get((claim.ruleset, claim.subject, w, j)), index.get((claim.ruleset, claim.reference, w, j)))
                 for w in workloads]
        if not all(s and r for s, r in pairs):
            continue
        hits["sub"] |= any(x["reached"] for s, _ in pairs for x in s)
        hits["ref"] |= any(x["reached"] for _, r in pairs for x in r)
        per_study = {w: _per_workload(claim, s, r) for w, (s, r) in zip(workloads, pairs)}
        result.figures.append(_gmean(list(per_study.values())))
        for w, v in per_study.items():
            per_w[w].append(v)
    result.per_workload = {w: float(median(v)) for w, v in per_w.items() if v}
    result.verdict, result.note = verdict(claim, result.figures, hits)
    if claim.quantity == "time" and any(_contended(r) for k, records in index.items()
                                        if k[:2] in ((claim.ruleset, claim.subject), (claim.ruleset, claim.reference))
                                        for r in records):
        result.note += "; times contended: the load average exceeded the CPUs"
    return result


def _contended(record: dict) -> bool:
    cpus = record["machine"]["cpus"] or 1
    return max(record["machine"]["loadavg"][0], record["loadavg_end"][0]) > cpus


def verdict(claim: Claim, figures: list[float], hits: dict[str, bool]) -> tuple[str, str]:
    """(verdict, note) by the claim's rule; see the module docstring."""
    if not figures or any(math.isnan(f) for f in figures):
        return INCONCLUSIVE, "no study complete on every workload for both entries"
    if claim.quantity in ("steps", "time"):
        missing = [name for name, side in ((claim.subject, "sub"), (claim.reference, "ref")) if not hits[side]]
        if missing:
            return INCONCLUSIVE, f"{' and '.join(missing)} missed every target"
    lo, hi = min(figures), max(figures)
    t = claim.threshold
    beyond = (lo > t) if claim.above else (hi < t)
    short = (hi <= t) if claim.above else (lo >= t)
    n = f"{len(figures)} stud{'y' if len(figures) == 1 else 'ies'}"
    if beyond:
        return HOLDS, f"{n}, all {'above' if claim.above else 'below'} {t:g}"
    if short:
        return FAILS, f"{n}, none {'above' if claim.above else 'below'} {t:g}"
    return INCONCLUSIVE, f"{n}; the spread straddles {t:g}"


def measure_all(studies: list[dict[str, Any]], workloads: tuple[str, ...],
                claims: tuple[Claim, ...] = CLAIMS) -> list[Measured]:
    return [measure(c, studies, workloads) for c in claims]


def claim_workloads(studies: list[dict[str, Any]]) -> tuple[str, ...]:
    """The workloads the store's ``claims`` studies ran, sorted."""
    return tuple(sorted({s["spec"]["workload"] for s in studies if s["spec"]["suite"] == SUITE}))
