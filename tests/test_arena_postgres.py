"""Two worker processes share one study through a real PostgreSQL server (Optuna's RDB storage): every trial
is recorded exactly once; a half-prepared study is finished, and one study can be deleted. ``.ci/run`` starts
the server (``.ci/postgres.sh``) and sets GRADWISE_TEST_POSTGRES; elsewhere the tests run against that URL
when a server answers on localhost, and are skipped otherwise. In CI (CI=true) an unreachable server is a
failure, not a skip."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
URL = os.environ.get("GRADWISE_TEST_POSTGRES", "postgresql://gradwise:gradwise@localhost:5432/gradwise_test")

WORKER = """
import sys
from gradwise.arena.rulesets import Entry, plan, work
from gradwise.arena.store import Store
space = {"lr": {"min": 1e-3, "max": 1e-1, "scaling": "log"}}
plans = plan(Entry("sgd", "SGD", space=space), "lstsq_ill_conditioned", studies=2, trials=6, budget_scale=0.03,
             suite=sys.argv[2])
ran = []
work(Store(sys.argv[1]), plans, on_trial=lambda p, c, r: r and ran.append((p.name, c.index)))
print(ran)
"""


def _server_reachable() -> str | None:
    try:
        import sqlalchemy

        from gradwise.arena.store import storage_url

        engine = sqlalchemy.create_engine(storage_url(URL), connect_args={"connect_timeout": 3})
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("select 1"))
        engine.dispose()
    except Exception as error:  # noqa: BLE001 - any failure to connect means no server to test against
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


@pytest.mark.slow
def test_two_workers_record_every_trial_exactly_once():
    problem = _server_reachable()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run this test: no PostgreSQL at {URL} ({problem}); see .ci/postgres.sh")
        pytest.skip(f"no PostgreSQL server reachable at {URL} ({problem}); run .ci/postgres.sh as root")
    from gradwise.arena.store import Store

    suite = f"pg-{uuid.uuid4().hex[:8]}"
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, URL, suite], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=300) for w in workers]
    for w, (out, err) in zip(workers, outputs):
        assert w.returncode == 0, err
    ran = [eval(out.strip().splitlines()[-1]) for out, _ in outputs]  # noqa: S307 - our own printed lists
    assert all(ran), f"both workers should have run trials: {ran}"
    assert not set(ran[0]) & set(ran[1]), "a trial ran in both workers"
    studies = [s for s in Store(URL).studies() if s["spec"]["suite"] == suite]
    assert len(studies) == 2
    for s in studies:
        assert s["trials"] == 6 and s["pending"] == 0, s["name"]
        assert [r["index"] for r in s["records"]] == list(range(6))
    assert sorted(ran[0] + ran[1]) == sorted((s["name"], i) for s in studies for i in range(6))


def test_a_half_prepared_study_is_finished_and_one_study_can_be_deleted():
    """A preparer killed after creating its study (no spec, no trials) on PostgreSQL: the next prepare, under
    the advisory lock, finishes it; delete_study removes that study only."""
    problem = _server_reachable()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run this test: no PostgreSQL at {URL} ({problem}); see .ci/postgres.sh")
        pytest.skip(f"no PostgreSQL server reachable at {URL} ({problem}); run .ci/postgres.sh as root")
    import optuna

    from gradwise.arena.rulesets import Entry, plan
    from gradwise.arena.store import PREPARED, Store

    store = Store(URL)
    first, second = plan(Entry("sgd", "SGD", space={"lr": {"min": 1e-3, "max": 1e-1, "scaling": "log"}}),
                         "lstsq_ill_conditioned", studies=2, trials=3, suite=f"pg-{uuid.uuid4().hex[:8]}")
    store.storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], first.name)  # then the kill
    for p in (first, second):
        store.prepare(p.name, p.spec, p.points, p.seeds, p.distributions)
    study_id = store.storage.get_study_id_from_name(first.name)
    assert store.storage.get_study_system_attrs(study_id)[PREPARED] == 3
    trials = store.storage.get_all_trials(study_id, deepcopy=False)
    assert sorted((t.user_attrs["index"], t.user_attrs["hyperparameters"] == first.points[t.user_attrs["index"]])
                  for t in trials) == [(0, True), (1, True), (2, True)]
    assert store.delete_study(first.name) == 3
    names = {s.study_name for s in store.storage.get_all_studies()}
    assert first.name not in names and second.name in names
    store.delete_study(second.name)
