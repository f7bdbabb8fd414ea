"""Every recipe is an arena entry: a self-tuning point that trains, a shipped search space that validates and
builds, and state-format variants (``AdamW[int8]``) parsed in one place and refused clearly where not allowed."""
from __future__ import annotations

import json
import math

import pytest
import torch

from gradwise import cli
from gradwise.arena import low_comm
from gradwise.arena.rulesets import halton_points
from gradwise.arena.runner import run_trial, state_bytes
from gradwise.arena.shipped_spaces import shipped_file, shipped_names, shipped_space
from gradwise.arena.store import Store
from gradwise.arena.submissions import SELF_TUNING, build_optimizer, self_tuning_point
from gradwise.arena.variants import FORMATS, check_entry, split_variant, variant_recipes
from gradwise.arena.workloads import get_workload
from gradwise.by_name import recipe_names

#: the points added for issue 17: their recipes had none
ADDED = ["APOLLO", "APOLLOMini", "AdaLomo", "AdamMini", "FRUGAL", "GaLoreAdamW", "LOMO", "Ranger21",
         "ScheduleFreeSGD", "Shampoo", "SubsetNorm"]


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_every_recipe_has_a_point_and_every_entry_with_a_point_a_shipped_space():
    assert set(recipe_names()) <= set(SELF_TUNING)
    assert shipped_names() == sorted([*SELF_TUNING, *low_comm.METHODS])  # DiLoCo.json, DeMo.json, ...: on workers
    for name in shipped_names():
        raw = shipped_file(name)  # checked against the optimizer's keywords (check_search_space)
        assert raw["optimizer"] == name and raw["source"] and isinstance(raw["space"], dict)


@pytest.mark.parametrize("name", [n for n in shipped_names() if n not in low_comm.METHODS])
def test_each_shipped_space_draws_points_that_build_and_step(name):
    """Two Halton points of the space build the optimizer over a conv, a wide matrix (projected by the low-rank
    recipes) and a bias, and a step changes the weights."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(144, 48))
    for point in halton_points(shipped_space(name), 2, seed=0):
        optimizer, schedule = build_optimizer(name, point, model.parameters(), total_steps=10)
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.randn(2, 1, 8, 8)).square().mean().backward()  # LOMO, AdaLomo: the step is in backward
        optimizer.step()
        optimizer.zero_grad()
        assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters())), (name, point)
        fused = getattr(optimizer, "fused_backward", None)
        if fused is not None:
            fused.remove()


@pytest.mark.parametrize("name", ADDED)
def test_the_added_points_train_a_workload(name):
    """30 steps of a real trial (the arena's runner, schedule and budget) lower digits_cnn's validation loss."""
    w = get_workload("digits_cnn")
    before = w.evaluate(w.init_model(0))["loss"]
    record = run_trial(w, name, self_tuning_point(name), seed=0, target=w.target, max_steps=30, max_runtime=math.inf)
    assert not record["diverged"] and record["steps"] == 30
    assert record["curve"][-1]["loss"] < before - 0.02, (name, before, record["curve"][-1])


def test_low_rank_points_project_only_the_matrices_wider_than_their_rank():
    model = torch.nn.Sequential(torch.nn.Linear(100, 64), torch.nn.Linear(64, 10))
    optimizer, _ = build_optimizer("GaLoreAdamW", self_tuning_point("GaLoreAdamW"), model.parameters(), 10)
    groups = [[tuple(p.shape) for p in g["params"]] for g in optimizer.param_groups]
    assert groups == [[(64, 100)], [(64,), (10, 64), (10,)]]
    assert [g["rank"] for g in optimizer.param_groups] == [32, None]


def test_ranger21_schedules_itself_over_the_trial_budget():
    layer = torch.nn.Linear(3, 2)
    optimizer, _ = build_optimizer("Ranger21", self_tuning_point("Ranger21"), layer.parameters(), total_steps=77)
    assert optimizer.engine_options["num_iterations"] == 77


@pytest.mark.parametrize("text, entry", [("AdamW", "AdamW"), ("adamw[INT8]", "AdamW[int8]"),
                                         ("muon[bf16]", "Muon[bf16]"), ("AdamW[ fp8 ]", "AdamW[fp8]")])
def test_entry_names_are_canonical(text, entry):
    assert check_entry(text) == entry
    assert split_variant(entry)[0] in recipe_names()


@pytest.mark.parametrize("text, message", [
    ("AdamW[int9]", "invalid optimizer='AdamW[int9]': unknown state format 'int9'; the bracket is the recipe's state="
                    " argument, one of bf16, int8, int4, fp8"),
    ("torch.AdamW[int8]", "torch.AdamW takes no state= format, so it has no variants; recipes with variants: ADOPT"),
    ("GaLoreAdamW[int8]", "GaLoreAdamW takes no state= format"),
    ("AdamW[int8", "a variant is RECIPE[FORMAT], e.g. 'AdamW[int8]'"),
    ("Adamz[int8]", "invalid optimizer='Adamz'"),
])
def test_bad_variants_are_refused_naming_what_is_allowed(text, message):
    with pytest.raises(ValueError) as error:
        check_entry(text)
    assert message in str(error.value)


def test_a_variant_keeps_its_recipes_point_and_space_and_encodes_its_state():
    assert "AdamW" in variant_recipes() and FORMATS == ("bf16", "int8", "int4", "fp8")
    assert self_tuning_point("AdamW[int8]") == SELF_TUNING["AdamW"]
    assert shipped_space("Muon[bf16]") == shipped_space("Muon")
    with pytest.raises(ValueError, match="the variant's bracket is its state"):
        build_optimizer("AdamW[int8]", {"state": "int4"}, torch.nn.Linear(2, 1).parameters(), 10)
    sizes = {}
    for name in ("AdamW", "AdamW[int8]"):
        layer = torch.nn.Linear(128, 64)
        optimizer, _ = build_optimizer(name, self_tuning_point(name), layer.parameters(), total_steps=10)
        layer(torch.randn(4, 128)).square().mean().backward()
        optimizer.step()
        sizes[name] = state_bytes(optimizer)
    assert sizes["AdamW[int8]"] < sizes["AdamW"] / 3


def test_external_ruleset_runs_variants_over_the_shipped_space(tmp_path, capsys):
    db, out = tmp_path / "a.db", tmp_path / "r"
    argv = ["arena", "run", "--ruleset", "external", "--optimizers", "adamw,adamw[int8]", "--workloads",
            "digits_cnn", "--trials", "1", "--studies", "1", "--budget-scale", "0.05", "--storage", str(db),
            "--out", str(out), "--no-live"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    studies = {s["spec"]["submission"]: s for s in Store(str(db)).studies()}
    assert sorted(studies) == ["AdamW", "AdamW[int8]"]
    for name, study in studies.items():
        assert study["spec"]["ruleset"] == "external" and study["spec"]["space"] == shipped_space("AdamW")
        assert study["name"] == f"custom/external/{name}/digits_cnn/study0"
    records = {name: s["records"][0] for name, s in studies.items()}
    assert records["AdamW"]["hyperparameters"] == records["AdamW[int8]"]["hyperparameters"]  # the same Halton point
    assert records["AdamW[int8]"]["state_bytes"] < records["AdamW"]["state_bytes"]
    assert "AdamW[int8]" in printed and "AdamW[int8]" in (out / "report.md").read_text()


@pytest.mark.parametrize("argv, text", [
    (["--ruleset", "self", "--search-space", "s.json"], "invalid --ruleset='self' with --search-space='s.json'"),
    (["--ruleset", "external", "--hyperparameters", '{"lr": 1}'], "invalid --ruleset='external' with"
                                                                  " --hyperparameters"),
    (["--ruleset", "external", "--optimizers", "torch.Adagrad"], "no shipped search space for optimizer"
                                                                 " 'torch.Adagrad'; shipped: ADOPT, APOLLO"),
    (["--optimizers", "lion[int3]"], "invalid --optimizers='lion[int3]': unknown state format 'int3'"),
])
def test_ruleset_and_variant_errors_through_the_cli(argv, text, tmp_path, capsys):
    assert cli.main(["arena", "run", *argv, "--storage", str(tmp_path / "a.db")]) == 2
    assert text in capsys.readouterr().err
    assert not (tmp_path / "a.db").exists()


def test_list_shows_every_entry_with_its_point_space_and_variants(capsys):
    assert cli.main(["arena", "list"]) == 0
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in capsys.readouterr().out.splitlines() if line.startswith("│")}
    assert set(recipe_names()) <= set(rows) and "torch.Adagrad" in rows
    assert rows["AdamW"] == ["lr=0.002 b1=0.9 b2=0.999 wd=0.05 warmup=0.05", "shipped", "bf16 int8 int4 fp8"]
    assert rows["GaLoreAdamW"][1:] == ["shipped", "-"] and rows["torch.Adagrad"] == ["-", "-", "-"]
    assert rows["Ranger21"][0] == "lr=0.001 no-schedule"
    assert json.loads(json.dumps(rows))  # plain text: no markup left in the cells
