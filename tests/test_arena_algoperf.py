"""``gradwise arena run --submission``: an AlgoPerf PyTorch submission, unchanged, on the arena's workloads.

The shipped example runs through the real CLI into a real SQLite store and onto the leaderboard; it trains
step for step as the arena's own AdamW entry with the same point does (so batches, model, loss and schedule
reach the submission as AlgoPerf hands them over); a self-tuning submission gets ``None`` hyperparameters,
``train_state`` and 1.5x the budget, and may stop early with ``spec.TrainingCompleteError``; the adapter's
``loss_fn`` and parameter types are AlgoPerf's; and a broken submission is refused, naming the function, before
any store is written."""
from __future__ import annotations

import hashlib
import importlib
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from gradwise import cli
from gradwise.arena.algoperf_submission import algoperf_imports
from gradwise.arena.algoperf_trial import run_submission_trial
from gradwise.arena.algoperf_workload import adapt, parameter_types
from gradwise.arena.rulesets import plan, submission_entry, work
from gradwise.arena.runner import run_trial
from gradwise.arena.store import Store
from gradwise.arena.workloads import get_workload
from gradwise.arena.workloads.shakespeare import ShakespeareCharLM
from gradwise.arena.workloads.teacher_student import TeacherStudent

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "gradwise" / "arena" / "examples" / "algoperf_adamw" / "submission.py"
POINTS = json.loads((EXAMPLE.parent / "tuning_search_space.json").read_text())


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_example_submission_runs_through_the_cli_into_the_store(tmp_path, capsys):
    db = tmp_path / "a.db"
    argv = ["arena", "run", "--submission", str(EXAMPLE), "--workloads", "lstsq_ill_conditioned", "--trials", "2",
            "--studies", "1", "--budget-scale", "0.01", "--storage", str(db), "--out", str(tmp_path / "r"),
            "--no-live"]
    assert cli.main(argv) == 0
    assert "algoperf_adamw" in capsys.readouterr().out
    (study,) = Store(str(db)).studies()
    spec = study["spec"]
    assert spec["ruleset"] == "external" and spec["submission"] == "algoperf_adamw" and study["pending"] == 0
    assert spec["sha256"] == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert spec["max_steps"] == spec["step_hint"] == 40  # 4000 * 0.01, no 1.5x for external tuning
    assert [r["hyperparameters"] for r in study["records"]] == POINTS[:2]
    for record in study["records"]:
        assert record["steps"] == 40 and record["batch_size"] == 64 and record["curve"][-1]["step"] == 40
        assert record["state_bytes"] >= 8 * record["params"] == 800  # AdamW's two float32 moments
        assert record["reached"] is (record["time_to_target"] is not None)
    trials = Store(str(db)).storage.get_all_trials(Store(str(db)).storage.get_study_id_from_name(study["name"]))
    assert [t.values[0] for t in trials] == [r["time_to_target"] or math.inf for r in study["records"]]
    assert cli.main(["arena", "score", "--storage", str(db)]) == 0
    assert "algoperf_adamw" in capsys.readouterr().out


def test_example_trains_step_for_step_as_the_arenas_adamw():
    point = POINTS[0]
    native = {"lr": point["learning_rate"], "beta1": 1 - point["one_minus_beta1"], "beta2": point["beta2"],
              "weight_decay": point["weight_decay"], "warmup_factor": point["warmup_factor"]}
    budget = {"seed": 3, "target": math.inf, "max_steps": 50, "max_runtime": 600.0}
    ours = run_trial(get_workload("digits_cnn"), "AdamW", native, **budget)
    theirs = run_submission_trial(get_workload("digits_cnn"), EXAMPLE, point, step_hint=50, **budget)
    assert [p["step"] for p in theirs["curve"]] == [p["step"] for p in ours["curve"]] == [25, 50]
    for a, b in zip(theirs["curve"], ours["curve"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and abs(a["accuracy"] - b["accuracy"]) <= 1 / 359
    assert theirs["curve"][-1]["loss"] < 0.6 * math.log(10)  # it trained (chance: ln 10): not a vacuous match
    assert theirs["state_bytes"] == ours["state_bytes"] and theirs["params"] == ours["params"]


SELF_TUNING = '''
from types import MappingProxyType

import torch
from algoperf import spec


def get_batch_size(workload_name):
    return 32


def init_optimizer_state(workload, model_params, model_state, hyperparameters, rng):
    assert hyperparameters is None and workload.step_hint == 30 and isinstance(workload, spec.Workload)
    return {"optimizer": torch.optim.SGD(model_params.parameters(), lr=0.05)}


def update_params(workload, current_param_container, current_params_types, model_state, hyperparameters, batch,
                  loss_type, optimizer_state, eval_results, global_step, rng, train_state=None):
    assert isinstance(train_state, MappingProxyType) and train_state["accumulated_submission_time"] >= 0
    assert batch["inputs"].shape[0] == 32 and loss_type is spec.LossType.SOFTMAX_CROSS_ENTROPY
    if global_step == 4:
        raise spec.TrainingCompleteError
    logits, model_state = workload.model_fn(current_param_container, batch, model_state, spec.ForwardPassMode.TRAIN,
                                            rng, True, 0.0)
    loss = workload.loss_fn(batch["targets"], logits, batch["weights"])
    optimizer_state["optimizer"].zero_grad()
    (loss["summed"] / loss["n_valid_examples"]).backward()
    optimizer_state["optimizer"].step()
    return optimizer_state, current_param_container, model_state


def data_selection(workload, input_queue, optimizer_state, current_param_container, model_state, hyperparameters,
                   global_step, rng):
    return next(input_queue)
'''


def test_self_tuning_submission_gets_no_hyperparameters_train_state_and_may_stop_early(tmp_path):
    path = tmp_path / "sgd" / "submission.py"
    path.parent.mkdir()
    path.write_text(SELF_TUNING)
    entry = submission_entry(path, workloads=["digits_cnn"])
    assert entry.ruleset == "self" and entry.name == "sgd"
    (p,) = plan(entry, "digits_cnn", studies=1, budget_scale=0.05)
    assert p.spec["max_steps"] == 45 and p.spec["step_hint"] == 30  # self-tuning: 1.5x the steps, not the hint
    store = Store(str(tmp_path / "a.db"))
    assert work(store, [p]) == 1
    (record,) = store.studies()[0]["records"]
    assert record["training_complete"] and record["steps"] == 5 and record["batch_size"] == 32
    assert record["curve"][-1]["step"] == 5 and record["hyperparameters"] is None  # what the submission got
    assert record["state_bytes"] == 0  # plain SGD keeps no state


def test_loss_fn_is_the_arenas_loss_and_masks_like_algoperf():
    with algoperf_imports() as spec:
        lm = adapt(spec, ShakespeareCharLM(), batch_size=4, step_hint=10, max_runtime=1.0)
        mse = adapt(spec, TeacherStudent(), batch_size=4, step_hint=10, max_runtime=1.0)
        assert lm.loss_type is spec.LossType.SOFTMAX_CROSS_ENTROPY and mse.loss_type is spec.LossType.MEAN_SQUARED_ERROR
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(4, 6, 9, generator=g), torch.randint(0, 9, (4, 6), generator=g)
    out = lm.loss_fn(labels, logits, torch.ones(4, 6), label_smoothing=0.1)
    expected = nn.functional.cross_entropy(logits.reshape(-1, 9), labels.reshape(-1), label_smoothing=0.1)
    assert out["per_example"].shape == (4, 6) and int(out["n_valid_examples"]) == 24
    torch.testing.assert_close(out["summed"] / out["n_valid_examples"], expected)
    mask = torch.tensor([1.0, 0.0, 1.0, 0.0]).unsqueeze(1).expand(4, 6)
    masked = lm.loss_fn(labels, logits, mask)
    torch.testing.assert_close(masked["summed"], lm.loss_fn(labels[::2], logits[::2])["summed"])
    assert int(masked["n_valid_examples"]) == 12
    y, pred = torch.randn(5, 1, generator=g), torch.randn(5, 1, generator=g)
    out = mse.loss_fn(y, pred, torch.ones(5), label_smoothing=0.3)  # ignored for a regression loss, as in AlgoPerf
    torch.testing.assert_close(out["summed"] / out["n_valid_examples"], TeacherStudent().loss(pred, y))


def test_parameter_types_follow_the_modules():
    model = nn.Sequential(nn.Embedding(10, 8), nn.Conv1d(8, 8, 3), nn.LayerNorm(8), nn.BatchNorm1d(8),
                          nn.MultiheadAttention(8, 2), nn.Linear(8, 2))
    with algoperf_imports() as spec:
        kind = spec.ParameterType
        types = parameter_types(spec, model)
    assert set(types) == {k for k, _ in model.named_parameters()}
    assert types == {"0.weight": kind.EMBEDDING, "1.weight": kind.CONV_WEIGHT, "1.bias": kind.BIAS,
                     "2.weight": kind.LAYER_NORM_SCALE, "2.bias": kind.LAYER_NORM_BIAS,
                     "3.weight": kind.BATCH_NORM_SCALE, "3.bias": kind.BATCH_NORM_BIAS,
                     "4.in_proj_weight": kind.ATTENTION_QKV, "4.in_proj_bias": kind.ATTENTION_BIAS,
                     "4.out_proj.weight": kind.ATTENTION_OUT, "4.out_proj.bias": kind.ATTENTION_BIAS,
                     "5.weight": kind.WEIGHT, "5.bias": kind.BIAS}
    assert "algoperf" not in sys.modules  # the shim is gone once the run is over


BROKEN = [
    ("del update_params", "has no function update_params: AlgoPerf's API needs update_params(workload,"),
    ("def update_params(workload, batch):\n    pass", "update_params(workload, batch) cannot be called as AlgoPerf"),
    ("def data_selection(workload, input_queue):\n    pass", "data_selection(workload, input_queue) cannot be"),
    ("def get_batch_size(workload_name):\n    raise ValueError('Unsupported workload name')",
     "get_batch_size('digits_cnn') raised ValueError: Unsupported workload name"),
    ("def get_batch_size(workload_name):\n    return 0", "get_batch_size('digits_cnn') returned 0; expected an int"),
    ("import algoperf.workloads", "imports 'algoperf.workloads', which the arena's algoperf shim does not provide"),
    ("from absl import logging", "imports 'absl', which is not installed: pip install 'gradwise[algoperf]'"),
]


@pytest.mark.parametrize("tail, message", BROKEN, ids=["missing", "update_params", "data_selection",
                                                        "batch_size_raises", "batch_size_0", "shim", "absl"])
def test_a_broken_submission_is_refused_naming_the_function_before_any_store(tmp_path, capsys, monkeypatch, tail,
                                                                               message):
    monkeypatch.setitem(sys.modules, "absl", None)  # as where absl-py is not installed
    path = tmp_path / "broken.py"
    path.write_text(EXAMPLE.read_text() + "\n\n" + tail + "\n")
    db = tmp_path / "store" / "a.db"
    assert cli.main(["arena", "run", "--submission", str(path), "--workloads", "digits_cnn", "--storage", str(db),
                     "--no-live"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err, err
    assert not db.parent.exists()


def test_readme_points_to_the_example_and_lists_only_what_the_shim_has():
    section = (ROOT / "README.md").read_text().split("### AlgoPerf submissions\n", 1)[1].split("\n## ", 1)[0]
    assert f"`{EXAMPLE.relative_to(ROOT)}`" in section and EXAMPLE.exists()
    provided = section.split("**What the shim provides**", 1)[1].split("Not provided", 1)[0]
    names = set(re.findall(r"`(\w+)`", provided)) - {"algoperf"}
    assert {"LossType", "ForwardPassMode", "ParameterType", "TrainingCompleteError", "Workload"} <= names
    with algoperf_imports() as spec:
        assert [n for n in sorted(names) if not hasattr(spec, n)] == []
        assert importlib.import_module("algoperf.pytorch_utils").pytorch_setup()[0] is False
