"""``gradwise arena``: a tiny run end to end (store, leaderboard, report with figures), and clear errors for
unknown names, bad search spaces, negative budgets, unreachable targets and corrupt stores."""
from __future__ import annotations

import json
import math

import pytest

from gradwise import cli
from gradwise.arena.rulesets import Entry, plan, self_tuning_entry
from gradwise.arena.store import Store
from gradwise.arena.submissions import build_optimizer, load_search_space, optimizer_kwargs
from gradwise.arena.workloads import WORKLOADS, get_workload


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """Trials pin torch's thread count; give the rest of the session its own back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_run_score_report_end_to_end(tmp_path, capsys):
    db, out = tmp_path / "a.db", tmp_path / "report"
    argv = ["arena", "run", "--workloads", "digits_cnn", "--optimizers", "AdamW,torch.AdamW", "--studies", "1",
            "--budget-scale", "0.5", "--storage", str(db), "--out", str(out), "--no-live"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "arena leaderboard (self-tuning" in printed and f"report: {out / 'report.md'}" in printed
    studies = Store(str(db)).studies()
    assert sorted(s["spec"]["submission"] for s in studies) == ["AdamW", "torch.AdamW"]
    for s in studies:
        (record,) = s["records"]
        assert record["max_steps"] == round(600 * 0.5 * 1.5)  # self-tuning: 1.5x the budget
        assert record["machine"]["threads"] == 1 and record["machine"]["torch"]
        assert record["curve"][-1]["step"] == record["steps"] and record["cpu_time"] > 0
        if record["reached"]:
            assert record["curve"][-1]["accuracy"] >= record["target"]
            assert record["time_to_target"] == record["train_time"]
    report = (out / "report.md").read_text()
    assert "| rank | submission | score |" in report and "torch.AdamW" in report
    for name in ("self_profiles.png", "self_curves.png", "self_time_to_target.png", "self_memory.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert name in (out / "report.html").read_text()
    assert cli.main(["arena", "score", "--storage", str(db)]) == 0
    assert "AdamW" in capsys.readouterr().out


def test_external_tuning_search_space_toml(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text('optimizer = "SGD"\n[space.lr]\nmin = 0.01\nmax = 0.3\nscaling = "log"\n'
                     '[space.momentum]\nfeasible_points = [0.9]\n')
    db = tmp_path / "a.db"
    assert cli.main(["arena", "run", "--workloads", "lstsq_ill_conditioned", "--search-space", str(space),
                     "--trials", "2", "--studies", "1", "--budget-scale", "0.02", "--storage", str(db),
                     "--out", str(tmp_path / "r"), "--no-live"]) == 0
    (study,) = Store(str(db)).studies()
    assert study["spec"]["ruleset"] == "external" and study["spec"]["max_steps"] == 80  # 4000 * 0.02, no 1.5x
    assert [r["hyperparameters"]["momentum"] for r in study["records"]] == [0.9, 0.9]


def test_list_form_search_space(tmp_path):
    space = tmp_path / "points.json"
    space.write_text(json.dumps({"optimizer": "torch.SGD", "space": [{"lr": 0.1, "momentum": 0.9}, {"lr": 0.3},
                                                                      {"lr": 9.0}]}))
    db = tmp_path / "a.db"
    assert cli.main(["arena", "run", "--workloads", "lstsq_ill_conditioned", "--search-space", str(space),
                     "--trials", "2", "--studies", "2", "--budget-scale", "0.02", "--storage", str(db),
                     "--out", str(tmp_path / "r"), "--no-live"]) == 0
    studies = Store(str(db)).studies()
    assert len(studies) == 2
    for study in studies:
        assert [r["hyperparameters"] for r in study["records"]] == [{"lr": 0.1, "momentum": 0.9}, {"lr": 0.3}]
    space.write_text(json.dumps({"optimizer": "torch.SGD", "space": [{"lr": 0.1, "betaz": 1}]}))
    with pytest.raises(ValueError, match=r"unknown hyperparameter\(s\) \['betaz'\] for optimizer 'torch.SGD'"):
        load_search_space(space)


def test_fixed_hyperparameters_entry(tmp_path, capsys):
    db = tmp_path / "a.db"
    argv = ["arena", "run", "--workloads", "lstsq_ill_conditioned", "--optimizers", "torch.SGD", "--studies", "1",
            "--hyperparameters", '{"lr": 0.2, "momentum": 0.9}', "--budget-scale", "0.05", "--storage", str(db),
            "--out", str(tmp_path / "r"), "--no-live"]
    assert cli.main(argv) == 0
    (study,) = Store(str(db)).studies()
    assert study["spec"]["submission"] == 'torch.SGD{"lr"=0.2,"momentum"=0.9}'
    assert study["records"][0]["hyperparameters"] == {"lr": 0.2, "momentum": 0.9}
    argv[argv.index("--hyperparameters") + 1] = '{"lr": 0.2, "gamma": 1}'
    assert cli.main(argv) == 2
    assert "unknown hyperparameter(s) ['gamma'] for optimizer 'torch.SGD'" in capsys.readouterr().err


def test_warmup_cosine_schedule():
    import torch

    p = torch.nn.Parameter(torch.zeros(1))
    opt, schedule = build_optimizer("torch.SGD", {"lr": 1.0, "warmup_factor": 0.1}, [p], total_steps=100)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[55] == pytest.approx(0.5 * (1 + math.cos(math.pi * 45 / 90)))
    assert optimizer_kwargs("NAdamW", {"one_minus_beta1": 0.1, "beta2": 0.99})["betas"] == (0.9, 0.99)
    assert optimizer_kwargs("AdEMAMix", {"beta1": 0.8})["betas"] == (0.8, 0.999, 0.9999)  # beta3 kept


@pytest.mark.parametrize("name", ["ADOPT", "AdEMAMix", "MARS", "Muon", "NorMuon", "SPAM", "AdamC"])
def test_self_tuning_points_of_the_adam_family_build_and_step(name):
    import torch

    from gradwise.arena.submissions import SELF_TUNING

    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(4, 3))]  # Muon's: AdamW, Muon
    optimizer, schedule = build_optimizer(name, SELF_TUNING[name], params, total_steps=10)
    for _ in range(3):
        for p in params:
            p.grad = torch.ones_like(p)
        optimizer.step()
        schedule.step()
    assert all((p.detach() < 1).all() for p in params)


def test_beta2_is_folded_into_betas_only_where_the_optimizer_takes_betas():
    assert optimizer_kwargs("NorMuon", {"beta2": 0.9})["beta2"] == 0.9  # its own keyword (the neurons' moment)
    assert optimizer_kwargs("ADOPT", {"beta2": 0.99})["betas"] == (0.9, 0.99)


def test_every_self_tuning_point_lowers_a_least_squares_loss():
    """Each point builds its optimizer (a matrix, which Muon and SOAP precondition, and a bias) and 4 of its steps
    under the arena's schedule lower the loss of a fixed least-squares problem."""
    import torch

    from gradwise.arena.submissions import SELF_TUNING

    torch.set_num_threads(1)  # tiny tensors: more threads only spin (the fixture restores the count)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 6, generator=g), torch.randn(32, 4, generator=g)
    for name, point in SELF_TUNING.items():
        layer = torch.nn.Linear(6, 4)
        torch.nn.init.zeros_(layer.weight)
        optimizer, schedule = build_optimizer(name, point, layer.parameters(), total_steps=20)
        losses = []
        for _ in range(4):
            loss = (layer(x) - y).square().mean()
            losses.append(float(loss.detach()))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        assert float((layer(x) - y).square().mean()) < losses[0], (name, losses)


def test_every_workload_builds_and_steps():
    import torch

    for name in ("digits_cnn", "lstsq_ill_conditioned", "teacher_student"):
        w = get_workload(name)
        x, y = next(w.batches(w.batch_size, seed=0))
        model = w.init_model(seed=0)
        w.loss(model(x), y).backward()
        assert x.shape[0] == w.batch_size and all(p.grad is not None for p in model.parameters())
        metrics = w.evaluate(model)
        assert w.metric in metrics and math.isfinite(metrics[w.metric])
        a, b = next(w.batches(8, seed=3))[0], next(w.batches(8, seed=3))[0]
        assert torch.equal(a, b)


def test_lstsq_loss_at_zero_is_one_and_optimum_is_zero():
    w = get_workload("lstsq_ill_conditioned")
    data = w.data()
    assert float(data.val_y.square().mean()) == pytest.approx(1.0, rel=0.05)
    assert float((data.val_x @ w.w_star - data.val_y).square().mean()) < 1e-10


@pytest.mark.parametrize("argv, texts", [
    (["run", "--workloads", "imagenet"], ["unknown workload 'imagenet'", "digits_cnn", "teacher_student"]),
    (["run", "--optimizers", "Adamm"], ["invalid --optimizers='Adamm'", "AdamW", "torch.SGD"]),
    (["run", "--optimizers", "torch.adagrad"], ["no self-tuning defaults for optimizer 'torch.Adagrad'",
                                                "--hyperparameters", "--search-space"]),
    (["set-targets", "--workloads", "nope"], ["unknown workload 'nope'", "mnist1d_cnn"]),
])
def test_unknown_names_list_the_valid_ones(argv, texts, tmp_path, capsys):
    assert cli.main(["arena", *argv, "--storage", str(tmp_path / "a.db")]) == 2
    err = capsys.readouterr().err
    for text in texts:
        assert text in err, (text, err)
    assert not (tmp_path / "a.db").exists()


@pytest.mark.parametrize("argv, text", [
    (["--budget-scale", "-1"], "argument --budget-scale: invalid value '-1': expected a number > 0"),
    (["--trials", "0"], "argument --trials: invalid value '0'"),
    (["--suite", "huge"], "argument --suite: invalid choice: 'huge'"),
])
def test_bad_numbers_and_choices(argv, text, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["arena", "run", *argv])
    assert exit_info.value.code == 2 and text in capsys.readouterr().err


@pytest.mark.parametrize("content, text", [
    ({"optimizer": "AdamW", "space": {"lr": {"min": 1e-4, "max": 1e-2}, "momentum": {"min": 0.1, "max": 0.9}}},
     "unknown hyperparameter(s) ['momentum'] for optimizer 'AdamW'; allowed: ["),
    ({"optimizer": "AdamW", "space": {"lr": {"min": 1e-2, "max": 1e-4}}}, "invalid lr range min=0.01, max=0.0001"),
    ({"optimizer": "AdamW", "space": {"lr": {"min": 0, "max": 1, "scaling": "log"}}}, "'log' with min > 0"),
    ({"optimizer": "Adamz", "space": {"lr": {"min": 0, "max": 1}}}, "unknown optimizer 'Adamz'; valid: ["),
    ({"space": {"lr": {"min": 0, "max": 1}}}, "names no optimizer"),
])
def test_bad_search_spaces(tmp_path, content, text):
    path = tmp_path / "space.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError) as error:
        load_search_space(path)
    assert text in str(error.value)


def test_unreachable_target_and_bad_budget():
    with pytest.raises(ValueError, match=r"unreachable target=1.5 for workload 'digits_cnn' \(accuracy\)"):
        plan(self_tuning_entry("AdamW"), "digits_cnn", studies=1, target=1.5)
    with pytest.raises(ValueError, match=r"target > 0.01 \(the floor\)"):
        plan(self_tuning_entry("AdamW"), "teacher_student", studies=1, target=0.005)
    with pytest.raises(ValueError, match="invalid budget_scale=-2"):
        plan(self_tuning_entry("AdamW"), "digits_cnn", studies=1, budget_scale=-2)
    with pytest.raises(ValueError, match=r"unknown hyperparameter\(s\) \['gamma'\] for optimizer 'AdamW'"):
        plan(Entry("x", "AdamW", hyperparameters={"gamma": 1}), "digits_cnn", studies=1)


def test_corrupt_store_through_the_cli(tmp_path, capsys):
    bad = tmp_path / "bad.db"
    bad.write_text("garbage" * 50)
    assert cli.main(["arena", "score", "--storage", str(bad)]) == 2
    assert "is not an arena store (not a SQLite database)" in capsys.readouterr().err
    assert bad.read_text() == "garbage" * 50
    missing = tmp_path / "missing.db"
    assert cli.main(["arena", "report", "--storage", str(missing)]) == 2
    assert f"no store at '{missing}'" in capsys.readouterr().err and not missing.exists()


def test_list_names_everything(capsys):
    assert cli.main(["arena", "list"]) == 0
    out = capsys.readouterr().out
    for name in [*WORKLOADS, "torch.AdamW", "NAdamW", "lr=0.0003 b1=0.9 b2=0.99 wd=0.5"]:  # Lion's point
        assert name in out
    assert "Lookahead" not in out and "schedule_free" not in out  # wrappers, not optimizers


def test_wrappers_are_not_entries():
    import torch

    with pytest.raises(ValueError, match="unknown optimizer 'Lookahead'.*'AdamW'"):
        build_optimizer("Lookahead", {}, torch.nn.Linear(2, 1).parameters(), 10)


@pytest.mark.slow
def test_set_targets_procedure(tmp_path):
    from statistics import median

    from gradwise.arena.report import write_report
    from gradwise.arena.set_targets import TARGET_SETTERS, set_target, write_targets
    from gradwise.arena.targets import committed_target, load_targets

    store = Store(str(tmp_path / "t.db"))
    entry = set_target(store, "digits_cnn", trials=1, seeds=3, budget_scale=0.05, workers=2)
    assert entry["algorithm"] in TARGET_SETTERS and set(entry["tuning_best"]) == set(TARGET_SETTERS)
    assert entry["tuning_best"][entry["algorithm"]] == max(entry["tuning_best"].values())
    assert len(entry["per_seed_best"]) == 3 and entry["target"] == median(entry["per_seed_best"])
    assert entry["step_budget"] == 30 and entry["machine"]["threads"] == 1 and entry["date"]
    studies = store.studies()  # every trial ran its whole step budget: no time limit, so no load dependence
    assert len(studies) == 7 and all(s["spec"]["max_runtime"] == float("inf") for s in studies)
    assert all(r["steps"] == 30 or r["diverged"] for s in studies for r in s["records"])
    # the report reads a target-setting store too (no targets, no time budget): curves of the best trials
    report = write_report(studies, tmp_path / "report", None, "torch.AdamW")
    assert all((tmp_path / "report" / f"{r}_{f}.png").stat().st_size > 0 for r in ("self", "external")
               for f in ("profiles", "curves", "time_to_target", "steps_to_target", "memory")) and report.exists()
    path = tmp_path / "targets.json"
    write_targets({"digits_cnn": entry}, path)
    assert committed_target("digits_cnn", path) == entry["target"] and set(load_targets(path)) == {"digits_cnn"}
    with pytest.raises(ValueError, match="'lstsq_ill_conditioned' has an analytic target"):
        set_target(store, "lstsq_ill_conditioned", trials=1, seeds=1)


def test_set_targets_prints_a_diverged_tuning_trial(tmp_path, capsys):
    # a diverged Halton point has no best metric: the line says so instead of failing the whole procedure
    from gradwise.arena.cli import print_tuning_trial

    (study,) = plan(self_tuning_entry("AdamW"), "lstsq_ill_conditioned", studies=1)
    store = Store(str(tmp_path / "t.db"))
    store.prepare(study.name, study.spec, study.points, study.seeds, study.distributions)
    claimed = store.claim(study.name)
    print_tuning_trial(study, claimed, {"metric": "loss", "best_metric": None})
    print_tuning_trial(study, claimed, {"metric": "loss", "best_metric": 3.89812})
    print_tuning_trial(study, claimed, None)  # a trial starting prints nothing
    assert capsys.readouterr().out.splitlines() == [f"  {study.name} #{claimed.index}: best loss diverged (no finite"
                                                    " metric)", f"  {study.name} #{claimed.index}: best loss 3.898"]
