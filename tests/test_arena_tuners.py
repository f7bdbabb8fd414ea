"""The external ruleset's multi-fidelity tuners on real trials: Hyperband's early stops, the one-epoch Top-K."""
from __future__ import annotations

import math

import optuna
import pytest
import torch

from gradwise import cli
from gradwise.arena.rulesets import Entry, plan, self_tuning_entry, work
from gradwise.arena.store import Store
from gradwise.arena.tuners import TOP, TUNERS, oriented, tuner_steps
from gradwise.arena.workloads import get_workload

#: learning rates from far too small to far too large: the trials' curves part early
SPACE = {"lr": {"min": 1e-5, "max": 1.0, "scaling": "log"}, "weight_decay": {"feasible_points": [0.0]}}
WORKLOAD = "digits_cnn"


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """Trials pin torch's thread count; give the rest of the session its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _run(tmp_path, tuner: str, trials: int) -> tuple[dict, list[dict], optuna.storages.BaseStorage]:
    (study_plan,) = plan(Entry("AdamW:wide", "AdamW", space=SPACE), WORKLOAD, studies=1, trials=trials,
                         budget_scale=0.2, tuner=tuner)
    store = Store(str(tmp_path / f"{tuner}.db"))
    assert work(store, [study_plan]) == len(study_plan.points)
    (study,) = store.studies()
    return study["spec"], study["records"], store.storage


def test_hyperband_stops_trials_at_its_rungs_and_reports_every_evaluation(tmp_path):
    spec, records, storage = _run(tmp_path, "hyperband", trials=4)
    w = get_workload(WORKLOAD)
    pruned = [r for r in records if r["pruned"]]
    assert pruned, "no trial was stopped early: the test would not see a tuner"
    assert all(not r["reached"] and r["steps"] < spec["max_steps"] and r["steps"] % w.eval_every == 0
               for r in pruned)
    assert not any(r["pruned"] for r in records[:1])  # the first trial has nothing to lose against
    assert tuner_steps(records) < len(records) * spec["max_steps"]
    (study,) = storage.get_all_studies()
    for trial, record in zip(sorted(storage.get_all_trials(study._study_id), key=lambda t: t.number), records):
        hit = record["curve"][-1] if record["reached"] else None  # asked only of evaluations that missed
        assert trial.intermediate_values == {p["step"]: oriented(w, p[w.metric]) for p in record["curve"]
                                             if w.metric in p and p is not hit}


def test_one_epoch_screens_every_point_then_trains_the_best_from_their_seeds(tmp_path):
    spec, records, _ = _run(tmp_path, "one-epoch", trials=4)
    w = get_workload(WORKLOAD)
    epoch = len(w.data().train_x) // w.batch_size
    assert spec["screen_steps"] == min(epoch, spec["max_steps"] // 10) and spec["screened"] == 4
    screened, full = records[:4], records[4:]
    assert len(full) == math.ceil(4 / 3)
    assert all(r["steps"] == spec["screen_steps"] or r["reached"] or r["diverged"] for r in screened)
    ranked = sorted(screened, key=lambda r: (oriented(w, r["final_metric"]), r["seed"]))
    assert [(r["hyperparameters"], r["seed"]) for r in full] == [(r["hyperparameters"], r["seed"])
                                                                 for r in ranked[:len(full)]]
    assert all(TOP not in r["hyperparameters"] for r in records)
    # a screening trains the first steps of the whole run: the whole budget's schedule, cut short
    assert all(r["max_steps"] == spec["max_steps"] for r in records)
    for r in full:
        (twin,) = [s for s in screened if s["seed"] == r["seed"]]
        assert r["steps"] > twin["steps"] or r["reached"]


@pytest.mark.parametrize("entry", [self_tuning_entry("AdamW"), Entry("SGD{lr=0.1}", "SGD", {"lr": 0.1})],
                         ids=["self-tuning", "fixed point"])
def test_a_multi_fidelity_tuner_needs_a_search_space(entry):
    with pytest.raises(ValueError, match=r"invalid tuner='hyperband' for .*: a multi-fidelity tuner chooses among"):
        plan(entry, WORKLOAD, studies=1, tuner="hyperband")


def test_an_unknown_tuner_is_refused_and_the_cli_offers_every_tuner(capsys):
    with pytest.raises(ValueError, match=r"invalid tuner='bohb': expected one of halton, hyperband, one-epoch"):
        plan(Entry("AdamW:wide", "AdamW", space=SPACE), WORKLOAD, studies=1, tuner="bohb")
    with pytest.raises(SystemExit):
        cli.main(["arena", "run", "--tuner", "bohb"])
    assert "invalid choice: 'bohb' (choose from " + ", ".join(repr(t) for t in TUNERS) in capsys.readouterr().err


def test_a_halton_study_keeps_the_spec_it_had_before_tuners():
    (study_plan,) = plan(Entry("AdamW:wide", "AdamW", space=SPACE), WORKLOAD, studies=1, trials=2)
    assert "tuner" not in study_plan.spec and len(study_plan.points) == 2
