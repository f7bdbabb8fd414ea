"""The arena's store: trials enqueued once, claimed once, recorded atomically; a killed run resumes to the same
results as an uninterrupted one; corrupt or mismatched stores are refused with clear errors."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from gradwise.arena.rulesets import Entry, plan, self_tuning_entry, work
from gradwise.arena.store import Store

ROOT = Path(__file__).resolve().parents[1]
SAME = ("index", "seed", "hyperparameters", "steps", "reached", "steps_to_target", "best_metric",
        "final_metric", "target", "max_steps")


def _records(store: Store) -> dict[str, list[dict]]:
    return {s["name"]: [{k: r[k] for k in SAME} for r in s["records"]] for s in store.studies()}


def test_work_records_every_trial_once_with_halton_points(tmp_path):
    space = {"lr": {"min": 1e-3, "max": 1e-1, "scaling": "log"}, "momentum": {"feasible_points": [0.9, 0.95]}}
    plans = plan(Entry("sgd-space", "SGD", space=space), "lstsq_ill_conditioned", studies=2, trials=3,
                 budget_scale=0.02, suite="t")
    store = Store(str(tmp_path / "a.db"))
    assert work(store, plans) == 6
    assert work(store, plans) == 0  # nothing left: a rerun adds nothing
    studies = {s["name"]: s for s in store.studies()}
    assert len(studies) == 2
    for p in plans:
        s = studies[p.name]
        assert s["trials"] == 3 and s["pending"] == 0
        assert [r["index"] for r in s["records"]] == [0, 1, 2]
        assert [r["hyperparameters"] for r in s["records"]] == p.points
        assert [r["seed"] for r in s["records"]] == p.seeds
    # each study draws its own Halton points; a point is a valid member of the space
    assert plans[0].points != plans[1].points
    for point in plans[0].points:
        assert 1e-3 <= point["lr"] <= 1e-1 and point["momentum"] in (0.9, 0.95)


def _run_cli(storage: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gradwise.cli", "arena", "run", "--workloads", "lstsq_ill_conditioned",
         "--optimizers", "AdamW,SGD", "--studies", "3", "--budget-scale", "0.15", "--no-time-limit",
         "--storage", str(storage),
         "--out", str(out), "--no-live"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _states(store: Store) -> list[str]:
    return [t.state.name for s in store.storage.get_all_studies()
            for t in store.storage.get_all_trials(s._study_id, deepcopy=False)]


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_results(tmp_path):
    whole = _run_cli(tmp_path / "whole.db", tmp_path / "whole")
    output, _ = whole.communicate(timeout=300)
    assert whole.returncode == 0, output

    killed = _run_cli(tmp_path / "killed.db", tmp_path / "killed")
    deadline = time.monotonic() + 240
    store = None
    while time.monotonic() < deadline:  # kill it in the middle of a trial, once some trials are done
        if store is None and (tmp_path / "killed.db").exists():
            time.sleep(0.5)  # let the run create the tables
            store = Store(str(tmp_path / "killed.db"))
        states = _states(store) if store is not None else []
        if states.count("COMPLETE") >= 2 and "RUNNING" in states:
            break
        time.sleep(0.02)
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate()
    states = _states(store)
    # almost always one trial was cut off mid-run (left RUNNING); at worst the kill fell between two trials
    assert 2 <= states.count("COMPLETE") < 6 and states.count("RUNNING") <= 1, states

    resumed = _run_cli(tmp_path / "killed.db", tmp_path / "killed")
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    assert _records(store) == _records(Store(str(tmp_path / "whole.db")))
    assert _states(store) == ["COMPLETE"] * 6


def test_corrupt_store_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "broken.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ValueError, match=r"broken\.db.* is not an arena store \(not a SQLite database\)"):
        Store(str(path))
    assert path.read_bytes() == b"this is not a database" * 100


def test_same_study_with_another_spec_is_refused(tmp_path):
    store = Store(str(tmp_path / "a.db"))
    entry = self_tuning_entry("AdamW")
    store.prepare(*_prep(plan(entry, "digits_cnn", studies=1, budget_scale=0.1, suite="t")[0]))
    other = plan(entry, "digits_cnn", studies=1, budget_scale=0.2, suite="t")[0]
    with pytest.raises(ValueError, match="already holds study 't/self/AdamW/digits_cnn/study0' with another spec"):
        store.prepare(*_prep(other))


def _prep(p):
    return p.name, p.spec, p.points, p.seeds, p.distributions


def test_recover_requeues_trials_of_dead_processes_only(tmp_path):
    store = Store(str(tmp_path / "a.db"))
    p = plan(self_tuning_entry("AdamW"), "digits_cnn", studies=1, budget_scale=0.1, suite="t")[0]
    store.prepare(*_prep(p))
    claimed = store.claim(p.name)
    assert claimed is not None and store.claim(p.name) is None
    assert store.recover(p.name) == 0  # this process is alive: its trial stays RUNNING
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    store.storage.set_trial_user_attr(claimed.trial_id, "worker", f"{os.uname().nodename}:{dead.stdout.strip()}")
    assert store.recover(p.name) == 1
    again = store.claim(p.name)
    assert again is not None and (again.index, again.seed) == (claimed.index, claimed.seed)


DIE_AT_OWNER = """
import os, sys
from gradwise.arena.store import Store
store = Store(sys.argv[1])
write = store.storage.set_trial_user_attr
def die_at_owner(trial_id, key, value):
    if key == "worker":
        os._exit(3)  # claimed, owner not yet written
    write(trial_id, key, value)
store.storage.set_trial_user_attr = die_at_owner
store.claim(sys.argv[2])
"""


def test_claimer_that_dies_before_writing_its_owner_is_requeued_at_once(tmp_path, monkeypatch):
    db = str(tmp_path / "a.db")
    store = Store(db)
    first, second = plan(self_tuning_entry("AdamW"), "digits_cnn", studies=2, budget_scale=0.1, suite="t")
    for p in (first, second):
        store.prepare(*_prep(p))
    died = subprocess.run([sys.executable, "-c", DIE_AT_OWNER, db, first.name], capture_output=True, text=True)
    assert died.returncode == 3, died.stderr
    [orphan] = store.storage.get_all_trials(store.storage.get_study_id_from_name(first.name), deepcopy=False)
    assert orphan.state == TrialState.RUNNING and "worker" not in orphan.user_attrs
    assert store.recover(first.name) == 1  # at once: its only claimer is a dead process on this host
    claimed = store.claim(first.name)
    assert claimed is not None and (claimed.index, claimed.seed) == (orphan.user_attrs["index"], 0)
    # an ownerless trial whose claimer is alive (this process, between its claim and its owner) stays RUNNING
    write = store.storage.set_trial_user_attr
    monkeypatch.setattr(store.storage, "set_trial_user_attr",
                        lambda trial_id, key, value: None if key == "worker" else write(trial_id, key, value))
    assert store.claim(second.name) is not None
    assert store.recover(second.name) == 0
