"""Multi-worker arena trials: one real 2-worker data-parallel AdamW trial end to end (store, plan, gloo
ranks), its record's bytes, steps and simulated-link time checked against hand-computed figures, and its
trained model against one process stepping on the two workers' batches together; external tuning of DeMo on 2
workers over its shipped space (2 trials, each point's bytes by hand); then the entries' names, the link
model, the search spaces' and the plans' refusals, without spawning."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from gradwise.arena import low_comm
from gradwise.arena.link import Link, wire_factor
from gradwise.arena.multiworker import shard
from gradwise.arena.rulesets import Entry, external_entry, plan, self_tuning_entry, work
from gradwise.arena.shipped_spaces import shipped_space
from gradwise.arena.store import Store
from gradwise.arena.submissions import SELF_TUNING, build_optimizer
from gradwise.arena.variants import check_entry
from gradwise.arena.workloads import get_workload

STEPS = 8
WORKLOAD = "lstsq_ill_conditioned"  # one parameter: a 1 x 100 float32 weight, 400 bytes


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """One study of AdamW on 2 gloo workers for STEPS steps (the one spawn of this module)."""
    w = get_workload(WORKLOAD)
    link = Link(bandwidth=1e6, latency=1e-3)
    plans = plan(self_tuning_entry("AdamW"), WORKLOAD, studies=1, budget_scale=STEPS / (1.5 * w.step_hint),
                 target=1e-9, workers_per_trial=2, link=link)
    store = Store(str(tmp_path_factory.mktemp("workers") / "arena.db"))
    points = []
    assert work(store, plans, on_eval=points.append) == 1
    (study,) = store.studies()
    return plans[0], study, points


def test_record_holds_bytes_steps_and_the_simulated_link_time(two_workers):
    p, study, points = two_workers
    assert p.name == f"custom/self/AdamW@2/{WORKLOAD}/study0" and study["spec"]["workers_per_trial"] == 2
    (record,) = study["records"]
    assert record["workers"] == 2 and record["steps"] == STEPS and not record["reached"]
    # DDP all-reduces the one 100-float gradient each step: 400 bytes, one collective
    assert record["bytes_sent"] == STEPS * 400 and record["bytes_per_step"] == 400
    assert record["collectives"] == STEPS and record["traffic"]["all_reduce_bytes"] == STEPS * 400
    assert record["wire_bytes"] == STEPS * 400  # a ring of 2 sends 2 (2 - 1) / 2 = 1 x the payload
    link_time = STEPS * 1e-3 + STEPS * 400 / 1e6
    assert record["link_time"] == pytest.approx(link_time, rel=1e-12)
    assert record["train_time"] == pytest.approx(record["measured_time"] + link_time, rel=1e-12)
    assert 0 < record["measured_time"] < record["train_time"]
    assert [pt["step"] for pt in record["curve"]] == [STEPS] and points == record["curve"]  # on_eval crossed over


def test_two_workers_train_as_one_process_on_both_batches(two_workers):
    """Data parallel on batches r, r + 2, ...: the same model as one process on each pair of batches at once."""
    _, study, _ = two_workers
    w = get_workload(WORKLOAD)
    model = w.init_model(0)
    opt, schedule = build_optimizer("AdamW", SELF_TUNING["AdamW"], model.parameters(), STEPS)
    batches = w.batches(w.batch_size, 0)
    for _ in range(STEPS):
        (x0, y0), (x1, y1) = next(batches), next(batches)
        loss = w.loss(model(torch.cat([x0, x1])), torch.cat([y0, y1]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    assert study["records"][0]["final_metric"] == pytest.approx(w.evaluate(model)["mse"], rel=1e-5)


@pytest.fixture(scope="module")
def demo_tuned(tmp_path_factory):
    """External tuning of DeMo on 2 gloo workers: one study, 2 Halton points of its shipped space, STEPS steps
    each (two spawns)."""
    w = get_workload(WORKLOAD)
    plans = plan(external_entry("DeMo"), WORKLOAD, studies=1, trials=2, budget_scale=STEPS / w.step_hint,
                 target=1e-9, workers_per_trial=2)
    store = Store(str(tmp_path_factory.mktemp("tuned") / "arena.db"))
    assert work(store, plans) == 2
    (study,) = store.studies()
    return plans[0], study


def test_external_tuning_of_a_low_comm_entry_records_each_point_and_its_bytes(demo_tuned):
    p, study = demo_tuned
    assert p.name == f"custom/external/DeMo@2/{WORKLOAD}/study0" and study["spec"]["space"] == shipped_space("DeMo")
    records = sorted(study["records"], key=lambda r: r["index"])
    assert [r["hyperparameters"] for r in records] == p.points and {pt["topk"] for pt in p.points} == {16, 32}
    for r in records:
        assert r["ruleset"] == "external" and r["workers"] == 2 and r["steps"] == STEPS
        # the 1 x 100 weight: 2 chunks of 1 x 50 (100's largest divisor <= 64), top-k of each sent as a float32
        # value and an int16 index, one all-gather per step; a ring of 2 forwards it once
        assert r["bytes_per_step"] == 2 * r["hyperparameters"]["topk"] * (4 + 2) and r["collectives"] == STEPS
        assert r["wire_bytes"] == r["bytes_sent"] and math.isfinite(r["final_metric"])


def test_low_comm_search_spaces_are_checked_before_any_study(tmp_path):
    def refused(name, space, text):
        with pytest.raises(ValueError, match=text):
            plan(Entry(name, name, space=space), WORKLOAD, studies=1, workers_per_trial=2)

    refused("DeMo", {"rank": {"feasible_points": [2]}}, r"unknown hyperparameter\(s\) \['rank'\] for 'DeMo'")
    refused("DiLoCo[H=10]", {"sync_every": {"feasible_points": [10]}}, "key 'sync_every' .* the bracket sets it")
    refused("DeMo", {"topk": {"min": 8, "max": 32}}, r"key\(s\) \['topk'\] .* feasible_points")
    refused("DeMo", {"sign": {"feasible_points": [False, True]}, "adam_beta2": {"min": 0.9, "max": 0.99}},
            "key 'sign' for 'DeMo' at sign=True: invalid adam_beta2=0.9 with sign=True")
    refused("DiLoCo[H=10]", {"lr": {"min": 1e-3, "max": 1e-2}, "outer_lr": {"feasible_points": [0.7, -1]}},
            "key 'outer_lr' .* at outer_lr=-1: invalid outer_lr=-1")
    # adam_beta2 (the Adam-like step) is a DeMo key; a point without the bracket's H takes it from the name
    space = {"sign": {"feasible_points": [False]}, "adam_beta2": {"min": 0.9, "max": 0.99}}
    (p,) = plan(Entry("DeMo", "DeMo", space=space), WORKLOAD, studies=1, trials=2, workers_per_trial=2)
    assert low_comm.build("DeMo", p.points[0], torch.nn.Linear(3, 2), 10).optimizer.adam_beta2 == \
        p.points[0]["adam_beta2"]
    (p,) = plan(external_entry("DiLoCo[H=10]"), WORKLOAD, studies=1, workers_per_trial=2)
    assert "sync_every" not in p.points[0] and "outer_lr" in p.points[0]
    built = low_comm.build("DiLoCo[H=10]", p.points[0], torch.nn.Linear(3, 2), 10).optimizer
    assert built.sync_every == 10 and built.outer[0].param_groups[0]["lr"] == p.points[0]["outer_lr"]


def test_shard_takes_every_nth_batch():
    assert [list(itertools.islice(shard(iter(range(100)), r, 3), 4)) for r in range(3)] == \
        [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]


def test_link_model():
    assert [wire_factor("all_reduce", n) for n in (1, 2, 4)] == [0, 1, 1.5]
    assert wire_factor("all_gather", 4) == 3 and wire_factor("all_to_all", 4) == 1
    from gradwise.core.collectives import Traffic

    traffic = Traffic()
    traffic.record("all_reduce", 1000)
    traffic.record("all_gather", 10)
    assert Link(100.0, 0.5).seconds(traffic, 4) == pytest.approx(2 * 0.5 + (1500 + 30) / 100)
    for bad in ({"bandwidth": 0}, {"latency": -1}, {"bandwidth": math.inf}):
        with pytest.raises(ValueError, match="link " + next(iter(bad))):
            Link(**bad)


def test_entry_names_and_points():
    assert check_entry("diloco[h=10]") == "DiLoCo[H=10]" and check_entry("demo") == "DeMo"
    assert check_entry("PowerSGD[r=4]") == "PowerSGD[r=4]" and check_entry("AdamW[int8]") == "AdamW[int8]"
    for bad in ("DiLoCo", "DiLoCo[r=4]", "DiLoCo[H=0]", "DeMo[H=3]"):
        with pytest.raises(ValueError, match=r"invalid --optimizers=.*spelled"):
            check_entry(bad, argument="--optimizers")
    point = low_comm.self_tuning_point("DiLoCo[H=50]")
    assert (point["sync_every"], point["outer_lr"], point["outer_momentum"]) == (50, 0.7, 0.9)
    assert low_comm.self_tuning_point("DeMo")["momentum"] == 0.999
    assert check_entry("dilocopowersgd[h=10]") == "DiLoCoPowerSGD[H=10]"
    assert low_comm.self_tuning_point("DiLoCoPowerSGD[H=10]")["powersgd_rank"] == 4
    built = low_comm.build("DiLoCoPowerSGD[H=10]", low_comm.self_tuning_point("DiLoCoPowerSGD[H=10]"),
                           torch.nn.Linear(3, 2), 100)
    assert built.optimizer.powersgd.rank == 4 and built.optimizer.sync_every == 10
    with pytest.raises(ValueError, match="sync_every=20 .* enter DiLoCo\\[H=20\\]"):
        low_comm.check_hyperparameters("DiLoCo[H=10]", {**point, "sync_every": 20})
    with pytest.raises(ValueError, match=r"unknown hyperparameter\(s\) \['rank'\] for 'DeMo'"):
        low_comm.check_hyperparameters("DeMo", {"rank": 4})


def test_plan_names_workers_and_refuses_what_runs_in_one_process():
    (p,) = plan(self_tuning_entry("DeMo"), WORKLOAD, studies=1, workers_per_trial=4)
    assert p.entry.name == "DeMo@4" and p.spec["link_bandwidth"] == 1.25e8
    assert "workers_per_trial" not in plan(self_tuning_entry("AdamW"), WORKLOAD, studies=1)[0].spec
    with pytest.raises(ValueError, match="invalid workers_per_trial=0"):
        plan(self_tuning_entry("AdamW"), WORKLOAD, studies=1, workers_per_trial=0)
    (tuned,) = plan(external_entry("AdamW"), WORKLOAD, studies=1, trials=3, workers_per_trial=2)
    assert tuned.name == f"custom/external/AdamW@2/{WORKLOAD}/study0" and len(tuned.points) == 3
    with pytest.raises(ValueError, match="tuner='hyperband' runs in one process"):
        plan(external_entry("AdamW"), WORKLOAD, studies=1, workers_per_trial=2, tuner="hyperband")


@pytest.mark.parametrize("argv, text", [
    (["--workers-per-trial", "0"], "argument --workers-per-trial: invalid value '0': expected a number > 0"),
    (["--link-bandwidth", "0"], "argument --link-bandwidth: invalid value '0': expected a number > 0"),
    (["--link-latency", "-1"], "argument --link-latency: invalid value '-1': expected a finite number >= 0"),
])
def test_cli_refuses_bad_worker_and_link_settings(argv, text, capsys):
    from gradwise import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["arena", "run", *argv])
    assert exit_info.value.code == 2 and text in capsys.readouterr().err


def test_list_shows_the_low_communication_entries(capsys):
    from gradwise import cli

    assert cli.main(["arena", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("DiLoCo[H=10]", "StreamingDiLoCo[H=10]", "PowerSGD[r=4]", "outer_lr=0.7"):
        assert name in out
