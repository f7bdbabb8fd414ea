"""The arena store under faults: files that are not arena stores, damaged stores, processes killed (SIGKILL) at
every moment of creating and preparing a store, and bad arguments to the store's commands. Every refusal is a
clear error (it names the file or the argument, and says what to do), and no refused operation changes a byte of
any file (every file under the test's folder is hashed before and after)."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
from optuna.distributions import distribution_to_json
from optuna.trial import TrialState

from gradwise import cli
from gradwise.arena.rulesets import Entry, plan, work
from gradwise.arena.store import PREPARED, Store

ROOT = Path(__file__).resolve().parents[1]
SQLITE_HEADER = b"SQLite format 3\x00"
SPACE = {"lr": {"min": 1e-3, "max": 1e-1, "scaling": "log"}, "momentum": {"feasible_points": [0.9, 0.95]}}
PLANS = plan(Entry("sgd-space", "SGD", space=SPACE), "lstsq_ill_conditioned", studies=2, trials=2,
             budget_scale=0.01, suite="t")


def _files(root: Path) -> dict[str, str]:
    """Every file and folder under ``root``: a folder as "dir", a file as the sha256 of its bytes."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def _prepare(store: Store) -> None:
    for p in PLANS:
        store.prepare(p.name, p.spec, p.points, p.seeds, p.distributions)


def _prepared(store: Store) -> dict:
    """What preparation leaves: per study its spec, attributes and (index, seed, point, state) per trial."""
    result = {}
    for s in store.storage.get_all_studies():
        trials = store.storage.get_all_trials(s._study_id, deepcopy=False)
        result[s.study_name] = (s.user_attrs, s.system_attrs.get(PREPARED), sorted(
            (t.user_attrs["index"], t.user_attrs["seed"], json.dumps(t.user_attrs["hyperparameters"]), t.state.name)
            for t in trials))
    return result


# -- files that are not arena stores ---------------------------------------------------------------------------
def _other_apps_db(path: Path, application_id: int = 0, journal: str = "delete") -> None:
    db = sqlite3.connect(path)
    db.execute(f"pragma journal_mode = {journal}")
    db.execute(f"pragma application_id = {application_id}")
    db.execute("create table notes (id integer primary key, text text)")
    db.executemany("insert into notes (text) values (?)", [("keep me",), ("and me",)])
    db.commit()
    db.close()


def _empty_schema_db(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("pragma user_version = 7")  # a valid SQLite file with no tables, owned by someone else
    db.commit()
    db.close()


def _plain_optuna_db(path: Path) -> None:  # another Optuna user's storage: Optuna's tables, no gradwise study
    optuna.create_study(storage=f"sqlite:///{path}", study_name="theirs").optimize(lambda t: t.suggest_float(
        "x", 0, 1), n_trials=1)


def _optuna_plus_other_table(path: Path) -> None:  # Optuna's tables with a gradwise spec, and someone's table too
    study = optuna.create_study(storage=f"sqlite:///{path}", study_name="t/x")
    study.set_user_attr("spec", {"suite": "t"})
    db = sqlite3.connect(path)
    db.execute("create table mine (x)")
    db.commit()
    db.close()


FOREIGN = {
    "text": lambda p: p.write_text("name,value\na,1\n"),
    "empty file": lambda p: p.touch(),
    "binary": lambda p: p.write_bytes(bytes(range(256)) * 8),
    "truncated header": lambda p: p.write_bytes(SQLITE_HEADER + bytes(20)),
    "empty-schema sqlite": _empty_schema_db,
    "another app's sqlite": _other_apps_db,
    "another app's id": lambda p: _other_apps_db(p, application_id=0x4D504244),
    "another app's wal db": lambda p: _other_apps_db(p, journal="wal"),
    "plain optuna storage": _plain_optuna_db,
    "optuna plus a foreign table": _optuna_plus_other_table,
}
KINDS = [*FOREIGN, "directory"]
NOT_A_STORE = r"is not an arena store|a directory, expected an arena store file"


def _cli(command: str, storage: Path, tmp_path: Path) -> list[str]:
    tail = ["--storage", str(storage)]
    if command == "run":
        space = tmp_path / "space.json"  # written by the fixture below, outside the hashed folder
        return ["arena", "run", "--workloads", "lstsq_ill_conditioned", "--search-space", str(space), "--trials",
                "1", "--studies", "1", "--budget-scale", "0.01", "--out", str(tmp_path / "report"), "--no-live",
                *tail]
    if command == "delete-study":
        return ["arena", "delete-study", PLANS[0].name, *tail]
    return ["arena", command, *tail, "--out", str(tmp_path / "report")]


@pytest.fixture(scope="module")
def foreign_bytes(tmp_path_factory) -> dict[str, bytes]:
    """Each kind of foreign file, made once; a test writes a copy of its bytes."""
    root = tmp_path_factory.mktemp("foreign")
    for i, make in enumerate(FOREIGN.values()):
        make(root / f"{i}.db")
    return {kind: (root / f"{i}.db").read_bytes() for i, kind in enumerate(FOREIGN)}


def _foreign(kind: str, path: Path, foreign_bytes: dict[str, bytes]) -> None:
    if kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(foreign_bytes[kind])


@pytest.fixture
def space_file(tmp_path):
    (tmp_path / "space.json").write_text(json.dumps({"optimizer": "SGD", "space": SPACE}))
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


@pytest.mark.parametrize("kind", KINDS)
def test_foreign_file_is_refused_by_the_store_unchanged(kind, foreign_bytes, tmp_path):
    path = tmp_path / "theirs.db"
    _foreign(kind, path, foreign_bytes)
    before = _files(tmp_path)
    with pytest.raises(ValueError, match=NOT_A_STORE) as error:
        Store(str(path))
    assert "theirs.db" in str(error.value) and "--storage" in str(error.value)
    assert _files(tmp_path) == before


@pytest.mark.parametrize("command", ["run", "score", "report", "delete-study"])
@pytest.mark.parametrize("kind", KINDS)
def test_foreign_file_is_refused_by_every_command_unchanged(kind, command, foreign_bytes, space_file, tmp_path,
                                                            capsys):
    path = space_file / "theirs.db"
    _foreign(kind, path, foreign_bytes)
    before = _files(space_file)
    assert cli.main(_cli(command, path, tmp_path)) == 2
    err = capsys.readouterr().err
    assert "error: " in err and "theirs.db" in err and ("is not an arena store" in err or "a directory" in err)
    assert "Traceback" not in err and _files(space_file) == before


# -- damaged stores --------------------------------------------------------------------------------------------
def _page(path: Path, number: int, data: bytes) -> None:
    """Overwrite the start of page ``number`` (1-based) of a SQLite file."""
    size = int.from_bytes(path.read_bytes()[16:18], "big")
    with open(path, "r+b") as f:
        f.seek((number - 1) * size)
        f.write(data)


DAMAGE = {
    "garbage in a table page": lambda p: _page(p, 3, b"\x0d" + b"\xff" * 400),
    "truncated to half": lambda p: os.truncate(p, p.stat().st_size // 2),
    "bad page size in the header": lambda p: _page(p, 1, p.read_bytes()[:16] + b"\x00\x03"),
    "zeroed header": lambda p: _page(p, 1, bytes(16)),
}


@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("good") / "arena.db"
    _prepare(Store(str(path)))
    return path.read_bytes()


@pytest.mark.parametrize("command", ["store", "run", "score", "report", "delete-study"])
@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_store_is_refused_with_its_name_unchanged(damage, command, good_store, space_file, tmp_path,
                                                          capsys):
    path = space_file / "arena.db"
    path.write_bytes(good_store)
    DAMAGE[damage](path)
    before = _files(space_file)
    if command == "store":
        with pytest.raises(ValueError, match=r"damaged store '.*arena\.db'|arena\.db' is not an arena store"):
            Store(str(path))
    else:
        assert cli.main(_cli(command, path, tmp_path)) == 2
        err = capsys.readouterr().err
        assert "arena.db" in err and ("damaged store" in err or "not an arena store" in err), err
        assert "Traceback" not in err and ("Move it away" in err or "--storage" in err)
    assert _files(space_file) == before


# -- kills at every moment of creating and preparing a store --------------------------------------------------
KILLER = """
import json, os, shutil, signal, sys
from optuna.distributions import json_to_distribution
from sqlalchemy import event
from sqlalchemy.engine import Engine
from gradwise.arena.store import Store

root, plans = sys.argv[1], json.loads(sys.stdin.read())
template = os.path.join(root, "template", "arena.db")
os.mkdir(os.path.dirname(template))
Store(template).storage.engine.dispose()  # a new, empty store: preparation victims start from a copy of it
commits, link = [0], os.link

def die_at(stage):
    def on_commit(connection):  # before the COMMIT is sent: the transaction is in flight
        commits[0] += 1
        if stage in (f"build commit {commits[0]}", f"prepare commit {commits[0]}"):
            os.kill(os.getpid(), signal.SIGKILL)
    def linking(src, dst):
        if stage == "before link":
            os.kill(os.getpid(), signal.SIGKILL)
        link(src, dst)
        if stage == "after link":
            os.kill(os.getpid(), signal.SIGKILL)
    path = os.path.join(root, stage.replace(" ", "_") + ".db")
    if stage.startswith("prepare"):
        shutil.copy(template, path)
    event.listen(Engine, "commit", on_commit)
    os.link = linking
    store = Store(path)
    for name, spec, points, seeds, dists in plans:
        store.prepare(name, spec, points, seeds, {k: json_to_distribution(v) for k, v in dists.items()})

stages = ["build commit 1", "before link", "after link"] + [f"prepare commit {k}" for k in range(1, 1000)]
killed = []
for stage in stages:
    pid = os.fork()
    if pid == 0:
        die_at(stage)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        break  # no commit left to die at
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (stage, status)
    killed.append(stage)
print(json.dumps(killed))
"""


def _killed_stores(root: Path) -> list[str]:
    """Stores left by processes SIGKILLed at each moment: while the new file is built aside (its first
    transaction), just before and just after it is linked into place, and inside each transaction of opening
    and preparing an existing store (creating each study, writing its spec, enqueueing each trial, marking it
    prepared). One helper process forks a victim per moment."""
    plans = [[p.name, p.spec, p.points, p.seeds, {k: distribution_to_json(d) for k, d in p.distributions.items()}]
             for p in PLANS]
    done = subprocess.run([sys.executable, "-c", KILLER, str(root)], input=json.dumps(plans), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_store_killed_at_any_moment_of_preparation_is_finished_by_the_next_run(tmp_path):
    (tmp_path / "clean").mkdir()
    clean = Store(str(tmp_path / "clean" / "arena.db"))
    _prepare(clean)
    expected = _prepared(clean)
    assert all(len(trials) == 2 and prepared == 2 for _, prepared, trials in expected.values())
    killed = _killed_stores(tmp_path)
    commits = [s for s in killed if s.startswith("prepare commit")]
    assert killed[:3] == ["build commit 1", "before link", "after link"], killed
    assert len(commits) >= 2 * (1 + 1 + 2 + 1), killed  # each study: create, spec, 2 trials, prepared
    journals = 0
    for stage in killed:
        path = tmp_path / (stage.replace(" ", "_") + ".db")
        journals += Path(f"{path}-journal").exists()
        # a kill while the file is built aside leaves no store at the path, only the build, which the next
        # open removes
        assert path.exists() == (stage not in ("build commit 1", "before link")), stage
        store = Store(str(path))
        assert not list(tmp_path.glob(f".{path.name}.*")), stage
        _prepare(store)
        assert _prepared(store) == expected, stage
        store.storage.engine.dispose()
    assert journals > 0  # some kills left a transaction to roll back (a hot journal beside the file)


@pytest.fixture
def own_threads(monkeypatch):
    """Trials pin torch's and OpenMP's thread counts; give the rest of the session its own back."""
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_killed_preparation_is_finished_by_the_next_run_and_delete_study_restarts_it(tmp_path, capsys,
                                                                                     own_threads):
    """A study created but never prepared (its preparer killed after writing the spec) is finished by the next
    run; deleting one study leaves the others, and the next run prepares and runs it again."""
    db = tmp_path / "arena.db"
    store = Store(str(db))
    first, second = PLANS
    study_id = store.storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], first.name)
    store.storage.set_study_user_attr(study_id, "spec", json.loads(json.dumps(first.spec)))  # then the kill
    assert work(store, PLANS) == 4
    studies = {s["name"]: s for s in store.studies()}
    assert [r["index"] for r in studies[first.name]["records"]] == [0, 1] and studies[first.name]["pending"] == 0
    assert cli.main(["arena", "delete-study", first.name, "--storage", str(db)]) == 0
    assert f"deleted study {first.name!r} (2 trial(s))" in capsys.readouterr().out
    assert [s["name"] for s in store.studies()] == [second.name]
    assert work(store, PLANS) == 2
    assert [r["hyperparameters"] for r in {s["name"]: s for s in store.studies()}[first.name]["records"]] == \
        first.points


RACERS = """
import json, os, sys, time
from optuna.distributions import json_to_distribution
from gradwise.arena.store import Store

root, plans = sys.argv[1], json.loads(sys.stdin.read())
Store(os.path.join(root, "prepared.db")).storage.engine.dispose()  # an empty store for the preparers' race
(create_r, create_w), (created_r, created_w), (prepare_r, prepare_w) = os.pipe(), os.pipe(), os.pipe()
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        os.read(create_r, 1)
        Store(os.path.join(root, "created.db"))  # all four create the same new store at once
        os.write(created_w, b"x")
        os.read(prepare_r, 1)
        store = Store(os.path.join(root, "prepared.db"))  # all four prepare the same studies at once
        for name, spec, points, seeds, dists in plans:
            store.prepare(name, spec, points, seeds, {k: json_to_distribution(v) for k, v in dists.items()})
        os._exit(0)
    children.append(pid)
os.write(create_w, b"x" * 4)
created = b""
while len(created) < 4:
    created += os.read(created_r, 4)
os.write(prepare_w, b"x" * 4)
print(json.dumps([os.waitpid(pid, 0)[1] for pid in children]))
"""


@pytest.mark.slow
def test_workers_creating_and_preparing_one_store_at_once_enqueue_each_trial_once(tmp_path):
    plans = [[p.name, p.spec, p.points, p.seeds, {k: distribution_to_json(d) for k, d in p.distributions.items()}]
             for p in PLANS]
    done = subprocess.run([sys.executable, "-c", RACERS, str(tmp_path)], input=json.dumps(plans), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and json.loads(done.stdout.strip().splitlines()[-1]) == [0] * 4, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["created.db", "prepared.db"]
    assert _prepared(Store(str(tmp_path / "created.db"))) == {}
    clean = tmp_path / "clean" / "arena.db"
    clean.parent.mkdir()
    _prepare(Store(str(clean)))
    assert _prepared(Store(str(tmp_path / "prepared.db"))) == _prepared(Store(str(clean)))


# -- bad arguments to the store's commands ---------------------------------------------------------------------
def test_delete_study_of_an_unknown_name_is_refused_unchanged(tmp_path, capsys):
    db = tmp_path / "arena.db"
    _prepare(Store(str(db)))
    before = _files(tmp_path)
    assert cli.main(["arena", "delete-study", "t/nope", "--storage", str(db)]) == 2
    err = capsys.readouterr().err
    assert "invalid study 't/nope'" in err and repr(PLANS[0].name) in err and repr(PLANS[1].name) in err
    assert _files(tmp_path) == before


@pytest.mark.parametrize("command", ["score", "report", "delete-study"])
def test_reading_commands_on_a_missing_store_create_nothing(command, tmp_path, capsys):
    missing = tmp_path / "nowhere" / "arena.db"
    assert cli.main(_cli(command, missing, tmp_path)) == 2
    assert f"no store at '{missing}'" in capsys.readouterr().err and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("storage, message", [
    ("nosuchdriver://host/db", "cannot open store 'nosuchdriver://host/db'"),
    (".", "a directory, expected an arena store file"),
])
def test_unusable_storage_arguments_are_refused(storage, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path)
    assert cli.main(["arena", "score", "--storage", storage]) == 2
    assert message in capsys.readouterr().err and _files(tmp_path) == before


def test_a_study_with_another_spec_is_refused_and_its_rows_unchanged(tmp_path):
    db = tmp_path / "arena.db"
    store = Store(str(db))
    _prepare(store)
    before, rows = _files(tmp_path), _prepared(store)
    other = plan(Entry("sgd-space", "SGD", space=SPACE), "lstsq_ill_conditioned", studies=1, trials=3,
                 budget_scale=0.01, suite="t")[0]
    with pytest.raises(ValueError, match=r"already holds study 't/external/sgd-space/lstsq_ill_conditioned/study0'"
                                         r" with another spec.*delete-study"):
        store.prepare(other.name, other.spec, other.points, other.seeds, other.distributions)
    assert _prepared(store) == rows and _files(tmp_path) == before
    assert all(t.state == TrialState.WAITING for s in store.storage.get_all_studies()
               for t in store.storage.get_all_trials(s._study_id, deepcopy=False))


def test_a_store_made_before_the_mark_is_adopted(tmp_path):
    """Stores written before stores were marked hold Optuna's tables and gradwise's studies only: they are
    marked in place and open with their studies intact."""
    path = tmp_path / "old.db"
    _prepare(Store(str(path)))
    rows = _prepared(Store(str(path)))
    with open(path, "r+b") as f:  # as an unmarked store looks
        f.seek(68)
        f.write(bytes(4))
    assert _prepared(Store(str(path))) == rows


def test_a_store_in_a_missing_folder_is_refused_with_the_folder_named(tmp_path):
    with pytest.raises(ValueError, match=r"invalid store '.*nowhere/arena\.db': its folder '.*nowhere' does not"):
        Store(str(tmp_path / "nowhere" / "arena.db"))
    assert _files(tmp_path) == {}
