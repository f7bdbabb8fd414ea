"""The claims table from a real tiny store (Lion and AdamW, 2 studies of 120 steps on lstsq): the verdict rule
gives holds, does not hold and inconclusive on the records' own figures; ``gradwise arena claims`` writes the
Markdown and its figure, and the arena report gets a "Claims" section."""
from __future__ import annotations

import dataclasses
import math

import pytest

from gradwise import cli
from gradwise.arena.claims import CLAIMS, claim_plans
from gradwise.arena.claims_measure import FAILS, HOLDS, INCONCLUSIVE, measure
from gradwise.arena.claims_report import claims_section
from gradwise.arena.report import write_report
from gradwise.arena.rulesets import work
from gradwise.arena.store import Store

WORKLOADS = ("lstsq_ill_conditioned",)
BY_KEY = {c.key: c for c in CLAIMS}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    db = tmp_path_factory.mktemp("claims") / "claims.db"
    lion = (BY_KEY["lion-memory"], BY_KEY["lion-speed"])
    store = Store(str(db))
    work(store, claim_plans(studies=2, workloads=WORKLOADS, budget_scale=0.02, claims=lion))
    torch.set_num_threads(threads)
    return db, store.studies()


def test_the_tiny_store_is_what_the_claims_need(store):
    _, studies = store
    assert sorted(s["name"] for s in studies) == [f"claims/self/{e}/lstsq_ill_conditioned/study{j}"
                                                  for e in ("AdamW", "Lion") for j in (0, 1)]
    assert all(len(s["records"]) == 1 and s["records"][0]["steps"] == 120 for s in studies)


def test_state_ratio_holds_or_not_by_its_threshold(store):
    _, studies = store
    claim = BY_KEY["lion-memory"]
    m = measure(claim, studies, WORKLOADS)
    by = {s["spec"]["submission"]: s["records"][0]["state_bytes"] for s in studies}
    assert m.figures == [by["Lion"] / by["AdamW"]] * 2 and 0.45 < m.figure < 0.55  # one buffer against two
    assert m.verdict == HOLDS and m.spread == (m.figure, m.figure)
    assert measure(dataclasses.replace(claim, threshold=0.4), studies, WORKLOADS).verdict == FAILS


def test_quality_spread_straddling_the_threshold_is_inconclusive(store):
    _, studies = store
    claim = dataclasses.replace(BY_KEY["int8-quality"], subject="Lion")
    m = measure(claim, studies, WORKLOADS)
    lo, hi = m.spread
    assert len(m.figures) == 2 and lo < hi and all(math.isfinite(f) and f > 0 for f in m.figures)
    assert measure(dataclasses.replace(claim, threshold=(lo + hi) / 2), studies, WORKLOADS).verdict == INCONCLUSIVE
    assert measure(dataclasses.replace(claim, threshold=lo / 2), studies, WORKLOADS).verdict == HOLDS
    assert measure(dataclasses.replace(claim, threshold=hi * 2), studies, WORKLOADS).verdict == FAILS


def test_steps_when_both_miss_and_claims_without_studies_are_inconclusive(store):
    _, studies = store
    assert not any(s["records"][0]["reached"] for s in studies)  # 120 steps do not reach lstsq's target
    m = measure(BY_KEY["lion-speed"], studies, WORKLOADS)
    assert m.figures == [1.0, 1.0]  # both miss: budget + 1 on each side
    assert m.verdict == INCONCLUSIVE and "missed every target" in m.note
    timed = measure(dataclasses.replace(BY_KEY["lion-speed"], quantity="time"), studies, WORKLOADS)
    assert timed.figures == [1.0, 1.0] and timed.verdict == INCONCLUSIVE  # both miss: the same cap on each side
    shampoo = measure(BY_KEY["shampoo-external"], studies, WORKLOADS)
    assert shampoo.verdict == INCONCLUSIVE and not shampoo.figures and "no study complete" in shampoo.note


def test_cli_writes_the_claims_markdown_and_figure(store, tmp_path, capsys):
    db, studies = store
    out = tmp_path / "docs"
    argv = ["arena", "claims", "--storage", str(db), "--out", str(out), "--workloads", WORKLOADS[0], "--report-only"]
    assert cli.main(argv) == 0
    assert "Lion keeps half AdamW's state" in capsys.readouterr().out
    md = (out / "claims.md").read_text()
    assert f"gradwise arena claims --storage {db} --out {out} --workloads {WORKLOADS[0]}" in md
    row = next(line for line in md.splitlines() if "Lion keeps half AdamW's state" in line)
    assert "**holds**" in row and "¶151" in row and "Lion vs AdamW" in row
    assert md.count("**inconclusive**") == len(CLAIMS) - 1  # every other claim lacks its studies or its hits
    assert (out / "claims.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["arena", "claims", "--workloads", "no_such_workload", "--storage", str(db), "--report-only"]) == 2
    assert "no_such_workload" in capsys.readouterr().err


def test_arena_report_has_a_claims_section(store, tmp_path):
    _, studies = store
    report = write_report(studies, tmp_path / "r").read_text()
    assert "## Claims" in report and "Lion keeps half AdamW's state" in report
    assert "<h2>Claims</h2>" in (tmp_path / "r" / "report.html").read_text()
    assert claims_section([s for s in studies if s["spec"]["suite"] != "claims"]) == []
