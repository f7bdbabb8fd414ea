"""Every trial in an Optuna RDB storage: a SQLite file by default, or any SQLAlchemy URL
(``postgresql://user@host/db``) so that workers on several machines share the same studies.

One Optuna study per (ruleset, submission, workload, study index); its trials are enqueued up front
(``prepare``) with their hyperparameters, index and seed, so the work is fixed before anything runs. A worker
``claim``s a waiting trial (Optuna's row-locked WAITING -> RUNNING transition, so two workers never get the
same trial), runs it, and ``finish``es it: the record goes into a user attribute, then one transaction sets
the value and COMPLETE. A trial is done only once COMPLETE: a process killed mid-trial leaves it RUNNING,
and the next run on that host puts it back in the queue (``recover``), so a resumed run ends with the same
trials, hyperparameters and seeds as an uninterrupted one.

Preparation resumes too: a study whose preparer was killed before marking it prepared is finished by the next
``prepare`` (each enqueued trial is one transaction that carries its index, so only the missing indices are
enqueued). Preparers take a lock (``flock`` on a SQLite store's folder, an advisory lock on PostgreSQL), so two
of them never enqueue the same index. A SQLite store must be a file gradwise created (see ``store_file``); any other
file is refused unchanged.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.trial import TrialState

from gradwise.arena.store_file import alive, file_lock, open_store_file

optuna.logging.set_verbosity(optuna.logging.WARNING)

PREPARED = "gradwise:prepared"
UNOWNED_GRACE_S = 60.0
CLAIMER = "claimer:"  # user attribute prefix: "claimer:<host>:<pid>" marks a process that tried to claim
PREPARE_LOCK = 0x67726164  # the PostgreSQL advisory lock key preparers share


def storage_url(storage: str) -> str:
    """A SQLAlchemy URL: a URL is kept as it is (``postgresql://`` names the psycopg 3 driver, which the
    ``postgres`` extra installs), anything else is a SQLite file path."""
    if storage.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + storage.split("://", 1)[1]
    if "://" in storage:
        return storage
    return f"sqlite:///{Path(storage).resolve()}"


@dataclass
class Claimed:
    """A trial this worker runs: its Optuna ids, hyperparameters, index in its study and seed."""

    study: str
    trial_id: int
    number: int
    hyperparameters: dict[str, Any]
    index: int
    seed: int


class Store:
    def __init__(self, storage: str):
        self.url = storage_url(storage)
        self.path = Path(self.url.removeprefix("sqlite:///")) if self.url.startswith("sqlite:///") else None
        kwargs: dict[str, Any] = {}
        if self.path is not None:
            open_store_file(self.path, lambda tmp: self._connect(f"sqlite:///{tmp}", {}).engine.dispose())
            kwargs = {"connect_args": {"timeout": 120}}
        self.storage = self._connect(self.url, kwargs)

    def _connect(self, url: str, kwargs: dict[str, Any]) -> optuna.storages.RDBStorage:
        for attempt in range(3):  # workers starting together on an empty server database race to create tables
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
            except Exception as error:  # noqa: BLE001 - SQLAlchemy and Optuna raise many kinds; say which store
                if attempt == 2 or isinstance(error, sqlalchemy.exc.ArgumentError):  # a bad URL: no retry
                    raise ValueError(f"cannot open store {url!r}: {type(error).__name__}: {error}") from error
                time.sleep(1.0)
        raise AssertionError("unreachable")

    @contextmanager
    def _preparing(self) -> Iterator[None]:
        """Held while preparing or deleting studies: one process at a time per store."""
        if self.path is not None:
            with file_lock(self.path):
                yield
        elif self.storage.engine.dialect.name == "postgresql":
            with self.storage.engine.connect() as connection:
                connection.execute(sqlalchemy.text("select pg_advisory_lock(:key)"), {"key": PREPARE_LOCK})
                try:
                    yield
                finally:
                    connection.execute(sqlalchemy.text("select pg_advisory_unlock(:key)"), {"key": PREPARE_LOCK})
        else:
            yield

    # -- studies --------------------------------------------------------------------------------------
    def prepare(self, name: str, spec: dict[str, Any], points: list[dict[str, Any]], seeds: list[int],
                distributions: dict[str, BaseDistribution] | None = None) -> None:
        """Create study ``name`` with ``spec`` and enqueue one trial per point, unless it exists with the same
        spec (a resumed run); a study whose preparation was cut short is finished. Another worker preparing it
        at the same time waits for the lock, then finds it prepared."""
        spec = json.loads(json.dumps(spec))
        with self._preparing():
            try:
                study_id = self.storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], name)
                stored = None
            except optuna.exceptions.DuplicatedStudyError:
                study_id = self.storage.get_study_id_from_name(name)
                stored = self.storage.get_study_user_attrs(study_id).get("spec")
                if stored is not None and stored != spec:
                    raise ValueError(f"store {self.url!r} already holds study {name!r} with another spec: stored"
                                     f" {stored}, now {spec}; use another --storage, the same settings, or"
                                     f" 'gradwise arena delete-study {name}'") from None
                if PREPARED in self.storage.get_study_system_attrs(study_id):
                    return
            if stored is None:
                self.storage.set_study_user_attr(study_id, "spec", spec)
            self._enqueue(study_id, name, points, seeds, distributions)

    def _enqueue(self, study_id: int, name: str, points, seeds, distributions) -> None:
        study = optuna.load_study(study_name=name, storage=self.storage)
        have = {t.user_attrs.get("index") for t in study.get_trials(deepcopy=False)}
        for index, (params, seed) in enumerate(zip(points, seeds)):
            if index not in have:
                study.enqueue_trial(params, user_attrs={"index": index, "seed": seed,
                                                        "hyperparameters": params})
        if distributions:
            self.storage.set_study_user_attr(
                study_id, "distributions", {k: distribution_to_json(d) for k, d in distributions.items()})
        self.storage.set_study_system_attr(study_id, PREPARED, len(points))

    def delete_study(self, name: str) -> int:
        """Delete study ``name`` and its trials (one transaction); returns how many trials it held. The next run
        that plans it prepares it afresh."""
        names = sorted(s.study_name for s in self.storage.get_all_studies())
        if name not in names:
            shown = ", ".join(repr(n) for n in names[:20]) + (f" and {len(names) - 20} more" if names[20:] else "")
            raise ValueError(f"invalid study {name!r}: store {self.url!r} holds no such study; its studies:"
                             f" {shown or 'none'}")
        with self._preparing():
            study_id = self.storage.get_study_id_from_name(name)
            trials = len(self.storage.get_all_trials(study_id, deepcopy=False))
            self.storage.delete_study(study_id)
        return trials

    # -- trials ---------------------------------------------------------------------------------------
    def recover(self, name: str) -> int:
        """Put back in the queue the RUNNING trials of ``name`` whose worker is gone: its owner is a dead process
        on this host, or it has no owner yet (its claimer died between the claim and writing the owner) and every
        process that tried to claim it is a dead process on this host. An ownerless trial claimed from another
        host, or by a process still alive, is requeued only after ``UNOWNED_GRACE_S``."""
        study_id = self.storage.get_study_id_from_name(name)
        recovered = 0
        for t in self.storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            if "worker" in t.user_attrs:
                gone = _dead_here(t.user_attrs["worker"])
            else:
                claimers = [k.removeprefix(CLAIMER) for k in t.user_attrs if k.startswith(CLAIMER)]
                gone = (bool(claimers) and all(_dead_here(c) for c in claimers)) or (
                    t.datetime_start is not None
                    and (datetime.now() - t.datetime_start).total_seconds() > UNOWNED_GRACE_S)
            if gone:
                try:
                    self.storage.set_trial_state_values(t._trial_id, TrialState.WAITING)
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue  # its worker finished it after all
                recovered += 1
        return recovered

    def claim(self, name: str) -> Claimed | None:
        """The next waiting trial of study ``name``, now RUNNING and owned by this process; None when none.
        Before the claim, the process signs the trial as a claimer (committed before the WAITING -> RUNNING
        transition), so a RUNNING trial without an owner always names the process that claimed it."""
        study_id = self.storage.get_study_id_from_name(name)
        me = f"{platform.node()}:{os.getpid()}"
        for t in sorted(self.storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,)),
                        key=lambda t: t.number):
            try:
                self.storage.set_trial_user_attr(t._trial_id, CLAIMER + me, True)
                if not self.storage.set_trial_state_values(t._trial_id, TrialState.RUNNING):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another worker claimed and finished it meanwhile
            self.storage.set_trial_user_attr(t._trial_id, "worker", me)
            return Claimed(name, t._trial_id, t.number, dict(t.user_attrs["hyperparameters"]),
                           int(t.user_attrs["index"]), int(t.user_attrs["seed"]))
        return None

    def finish(self, claimed: Claimed, record: dict[str, Any],
               distributions: dict[str, BaseDistribution] | None = None) -> None:
        """Record the trial; the final transaction sets its value (time to target, inf on a miss) and COMPLETE."""
        for key, dist in (distributions or {}).items():
            value = claimed.hyperparameters[key]
            self.storage.set_trial_param(claimed.trial_id, key, dist.to_internal_repr(value), dist)
        self.storage.set_trial_user_attr(claimed.trial_id, "record", record)
        value = record["time_to_target"]
        self.storage.set_trial_state_values(claimed.trial_id, TrialState.COMPLETE,
                                            [math.inf if value is None else float(value)])

    # -- reading --------------------------------------------------------------------------------------
    def studies(self) -> list[dict[str, Any]]:
        """Every arena study: its name, spec, and the records of its completed trials in index order."""
        result = []
        for summary in optuna.get_all_study_summaries(self.storage, include_best_trial=False):
            study_id = self.storage.get_study_id_from_name(summary.study_name)
            spec = self.storage.get_study_user_attrs(study_id).get("spec")
            if spec is None:
                continue
            trials = self.storage.get_all_trials(study_id, deepcopy=False)
            done = sorted((t for t in trials if t.state == TrialState.COMPLETE),
                          key=lambda t: t.user_attrs["index"])
            result.append({"name": summary.study_name, "spec": spec, "trials": len(trials),
                           "records": [t.user_attrs["record"] for t in done],
                           "pending": sum(t.state != TrialState.COMPLETE for t in trials)})
        return result


def _dead_here(worker: str) -> bool:
    """Whether ``worker`` ("<host>:<pid>") is a process on this host that no longer exists."""
    host, _, pid = str(worker).rpartition(":")
    return host == platform.node() and pid.isdigit() and not alive(int(pid))
