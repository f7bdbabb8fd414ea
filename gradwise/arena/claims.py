"""The claims table's claims, as data: each headline claim of the literature that the arena can test at its
scale, with the quote (verbatim from ``shared/docs/LITERATURE.md`` part 1 or 3, or ``ANCHORS.md``, with its
paragraph), the two entries compared, the ruleset, the measured quantity and the verdict rule's threshold.

The verdicts are computed from the store's records by ``claims_measure``, never written here. ``claim_plans``
gives exactly the studies the claims need (suite ``claims``), so ``gradwise arena claims`` runs them or resumes
them from the store.

Quantities (``claims_measure`` computes one figure per study index, then the median and the min-max spread):

- ``steps``: geometric-mean speedup in steps to target of the subject over the reference, ``gmean_w(s_ref /
  s_sub)``, a miss counting as the step budget + 1 (AlgoPerf's ``compute_speedups.py`` rule, on steps);
- ``time``: the same on training seconds to target, a miss counting as the time budget + 1 s (without a time
  limit: the longest training time of the compared trials, at least the workload's budget, + 1 s);
- ``state``: the ratio of optimizer state bytes, subject over reference (geometric mean over workloads);
- ``quality``: the validation quality of the subject over the reference's at the last evaluation step both
  trials reached (accuracy over accuracy; for a loss, the reference's loss over the subject's), geometric mean
  over workloads: 1 is equal quality, below 1 worse.
"""
from __future__ import annotations

from dataclasses import dataclass

from gradwise.arena.rulesets import StudyPlan, external_entry, plan, self_tuning_entry

SUITE = "claims"
#: the workloads every claim is measured on by default: the two cheapest of the quick suite, so the table finishes
#: on a loaded 2-core machine (``--workloads`` adds teacher_student, mnist1d_cnn, ...)
WORKLOADS = ("digits_cnn", "lstsq_ill_conditioned")
QUANTITIES = ("steps", "time", "state", "quality")


@dataclass(frozen=True)
class Claim:
    """One row of the claims table. The verdict: ``holds`` when every study's figure is beyond ``threshold``
    on the claimed side (``above``: greater than it; else less than it), ``does not hold`` when none is,
    ``inconclusive`` when the spread straddles it, or (steps, time) when one side misses every target."""

    key: str
    claim: str
    source: str
    quote: str
    subject: str
    reference: str
    ruleset: str
    quantity: str
    threshold: float
    above: bool = True

    @property
    def rule(self) -> str:
        side = ">" if self.above else "<"
        return f"{self.quantity} {side} {self.threshold:g} in every study"


_MUON = "`modded-nanogpt track 3 steps to 3.28 loss: Adam 5625, Muon 3250-3600, record 2690.`"
_SOAP = ("No headline claim for SOAP in LITERATURE.md part 1 (it appears only inside COSMOS, ¶62: `Hybrid: SOAP"
         " on the leading eigensubspace of the gradient matrix, MUON on the remaining subspace.`); issue 17 asks"
         " SOAP vs AdamW in steps and in time.")
_INT8 = "`use 8-bit statistics while maintaining the performance levels of using 32-bit optimizer states`"
_INT4 = "`push optimizer states bitwidth down to 4-bit`; `comparable accuracy with their full-precision counterparts`"
_BF16 = ("No quality claim for bf16 state in LITERATURE.md; ANCHORS.md: `HeavyBall ECC bf16+8 is 6 B.` Tested"
         " against the same rule as 8-bit state.")
_GALORE = "`reduces memory usage by up to 65.5% in optimizer states`"
_APOLLO = "Mini: `SGD-level memory costs` (APOLLO itself: `3x throughput on an 8xA100-80GB setup compared to AdamW" \
          " by supporting 4x larger batch sizes`)"
_ADAFACTOR = ("No headline claim for Adafactor in LITERATURE.md (¶63 lists it among AlgoPerf's baselines; ¶145"
              " CAME keeps an `Adafactor-style factored second moment (row and column vectors)`).")

CLAIMS: tuple[Claim, ...] = (
    Claim("shampoo-external", "Shampoo beats NAdamW under external tuning", "LITERATURE.md part 3, 3.3 (¶63)",
          "The external-tuning winner used `Distributed Shampoo`, showing `non-diagonal preconditioning` beats"
          " Adam `even when compared on wall-clock runtime`.", "Shampoo", "NAdamW", "external", "steps", 1.0),
    Claim("schedule-free-self", "Schedule-Free AdamW beats the NAdamW baseline under self-tuning",
          "LITERATURE.md part 3, 3.3; ¶125", "The self-tuning winner was `based on the Schedule Free AdamW"
          " algorithm`. (Leaderboard: Schedule Free AdamW 0.8542, Baseline 0.8194.)", "ScheduleFreeAdamW", "NAdamW",
          "self", "steps", 1.0),
    Claim("ranger21", "Ranger21 trains faster than AdamW", "LITERATURE.md part 3, 3.6",
          "`significantly improved validation accuracy and training speed, smoother training curves`", "Ranger21",
          "AdamW", "self", "steps", 1.0),
    Claim("muon-steps", "Muon needs fewer steps than AdamW", "ANCHORS.md (figures users compare against)", _MUON,
          "Muon", "AdamW", "self", "steps", 1.0),
    Claim("muon-time", "Muon is faster than AdamW in time", "ANCHORS.md (figures users compare against)", _MUON,
          "Muon", "AdamW", "self", "time", 1.0),
    Claim("soap-steps", "SOAP needs fewer steps than AdamW", "issue 17", _SOAP, "SOAP", "AdamW", "self", "steps",
          1.0),
    Claim("soap-time", "SOAP is faster than AdamW in time", "issue 17", _SOAP, "SOAP", "AdamW", "self", "time", 1.0),
    Claim("lion-memory", "Lion keeps half AdamW's state", "LITERATURE.md ¶151",
          "State column: `Keeps a single momentum buffer.` (The claim: `saves up to 5x the pre-training compute on"
          " JFT`.)", "Lion", "AdamW", "self", "state", 0.55, above=False),
    Claim("lion-speed", "Lion trains faster than AdamW", "LITERATURE.md ¶151",
          "`saves up to 5x the pre-training compute on JFT`; diffusion: `reducing the training compute by up to"
          " 2.3x`", "Lion", "AdamW", "self", "steps", 1.0),
    Claim("int8-quality", "8-bit state keeps fp32's quality (within 5%)", "LITERATURE.md ¶142", _INT8,
          "AdamW[int8]", "AdamW", "self", "quality", 0.95),
    Claim("int4-quality", "4-bit state keeps fp32's quality (within 5%)", "LITERATURE.md ¶217", _INT4,
          "AdamW[int4]", "AdamW", "self", "quality", 0.95),
    Claim("bf16-quality", "bf16 state keeps fp32's quality (within 5%)", "ANCHORS.md", _BF16, "AdamW[bf16]",
          "AdamW", "self", "quality", 0.95),
    Claim("galore-memory", "GaLore cuts optimizer state by 65.5%", "LITERATURE.md ¶224", _GALORE, "GaLoreAdamW",
          "AdamW", "self", "state", 0.345, above=False),
    Claim("galore-quality", "GaLore keeps AdamW's quality (within 5%)", "LITERATURE.md ¶224", _GALORE,
          "GaLoreAdamW", "AdamW", "self", "quality", 0.95),
    Claim("apollo-memory", "APOLLO keeps less state than AdamW (below half)", "LITERATURE.md ¶50", _APOLLO,
          "APOLLO", "AdamW", "self", "state", 0.5, above=False),
    Claim("apollo-quality", "APOLLO keeps AdamW's quality (within 5%)", "LITERATURE.md ¶50", _APOLLO, "APOLLO",
          "AdamW", "self", "quality", 0.95),
    Claim("adafactor-memory", "Adafactor keeps less state than AdamW (below half)", "LITERATURE.md ¶63, ¶145",
          _ADAFACTOR, "Adafactor", "AdamW", "self", "state", 0.5, above=False),
    Claim("adafactor-quality", "Adafactor keeps AdamW's quality (within 5%)", "LITERATURE.md ¶63, ¶145",
          _ADAFACTOR, "Adafactor", "AdamW", "self", "quality", 0.95),
)


def entries(claims: tuple[Claim, ...] = CLAIMS) -> dict[str, list[str]]:
    """ruleset -> the entries the claims compare, each once, in first-use order."""
    result: dict[str, list[str]] = {}
    for c in claims:
        for name in (c.reference, c.subject):
            if name not in result.setdefault(c.ruleset, []):
                result[c.ruleset].append(name)
    return result


def claim_plans(*, studies: int = 2, trials: int = 2, workloads: tuple[str, ...] = WORKLOADS,
                time_limit: bool = False, budget_scale: float = 1.0,
                claims: tuple[Claim, ...] = CLAIMS) -> list[StudyPlan]:
    """Exactly the studies the claims need, in suite ``claims``: each entry of each ruleset on each workload,
    ``studies`` studies (external tuning: ``trials`` Halton points per study over the entry's shipped space)."""
    made = {"self": self_tuning_entry, "external": external_entry}
    by_ruleset = sorted(entries(claims).items(), key=lambda kv: kv[0] != "self")  # self-tuning first: cheaper
    return [p for ruleset, names in by_ruleset for name in names for w in workloads
            for p in plan(made[ruleset](name), w, studies=studies, trials=trials, suite=SUITE,
                          time_limit=time_limit, budget_scale=budget_scale)]
