"""Which SQLite files are arena stores, how a new one comes to exist, and the lock its preparers share.

The rule: an arena store is a SQLite file that gradwise created and marked. The mark is the database header's
``application_id`` (bytes 68-71, SQLite's field for saying which application owns a file), set to
``APPLICATION_ID``. Before anything opens a file for writing it is read as raw bytes, and a file without the mark
is refused, its bytes unchanged: a text file, another application's database, an empty file, an empty-schema
SQLite database. The one exception is a store made before stores were marked (Optuna's tables only, and studies
with gradwise's ``spec``), which is marked and used. A marked file is checked with ``PRAGMA quick_check``; a
damaged one is refused with its name and what to do.

A path that does not exist becomes a new store: it is built under a temporary name beside it (marked, Optuna's
tables created) and hard-linked into place, which fails if the path exists meanwhile, so a kill at any moment
leaves either no store or a whole one at the path, and of two workers creating it together one store wins.
"""
from __future__ import annotations

import fcntl
import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

APPLICATION_ID = 0x67726164  # "grad"
SQLITE_HEADER = b"SQLite format 3\x00"
OPTUNA_TABLES = {"studies", "study_directions", "study_user_attributes", "study_system_attributes", "trials",
                 "trial_user_attributes", "trial_system_attributes", "trial_params", "trial_values",
                 "trial_intermediate_values", "trial_heartbeats", "version_info", "alembic_version"}
CREATING = ".creating"  # suffix of a store being built: ".<name>.<pid>.creating"


def open_store_file(path: Path, create_tables) -> None:
    """Make sure ``path`` is an arena store: create it if it does not exist (``create_tables(tmp_path)`` puts
    Optuna's tables into the new file), else check that it is one; raises ValueError for any other file."""
    _remove_abandoned_builds(path)
    if not path.exists() and not path.is_symlink():
        _create(path, create_tables)
    check_store_file(path)


def check_store_file(path: Path) -> None:
    """Raises ValueError unless ``path`` is an undamaged arena store (see the module's rule)."""
    if path.is_dir():
        raise ValueError(f"invalid store {str(path)!r}: a directory, expected an arena store file; pass a file"
                         " path as --storage")
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError as error:
        raise ValueError(f"cannot read store {str(path)!r}: {error.strerror}; pass another --storage") from error
    if len(header) < 100 or not header.startswith(SQLITE_HEADER):
        what = "an empty file" if not header else "not a SQLite database"
        raise ValueError(f"{str(path)!r} is not an arena store ({what}); gradwise leaves it as it is: pass another"
                         " --storage (a path that does not exist yet becomes a new store)")
    application_id = int.from_bytes(header[68:72], "big")
    if application_id != APPLICATION_ID:
        if not (application_id == 0 and _unmarked_store(path)):
            raise ValueError(f"{str(path)!r} is not an arena store: a SQLite database gradwise did not create"
                             f" (application_id {application_id:#x}, an arena store has {APPLICATION_ID:#x});"
                             " gradwise leaves it as it is: pass another --storage (a path that does not exist"
                             " yet becomes a new store)")
        _mark(path)
    _check_pages(path)


def _unmarked_store(path: Path) -> bool:
    """Whether ``path`` is a store made before the mark: Optuna's tables only, and a study with a ``spec``."""
    try:
        # immutable: SQLite takes no lock and writes no journal, WAL or shared-memory file beside it
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            tables = {r[0] for r in db.execute("select name from sqlite_master where type = 'table'")}
            if not tables or not tables <= OPTUNA_TABLES:
                return False
            return db.execute("select count(*) from study_user_attributes where key = 'spec'").fetchone()[0] > 0
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return False


def _mark(path: Path) -> None:
    db = sqlite3.connect(path)
    try:
        db.execute(f"pragma application_id = {APPLICATION_ID}")
        db.commit()
    finally:
        db.close()


def _check_pages(path: Path) -> None:
    """Raises ValueError naming ``path`` if SQLite finds damaged pages. The connection may write: it rolls back
    the transaction of a process killed mid-commit (the journal beside the file), as any opener would."""
    try:
        db = sqlite3.connect(path, timeout=120)
        try:
            problems = [r[0] for r in db.execute("pragma quick_check(3)")]
        finally:
            db.close()
    except sqlite3.DatabaseError as error:
        problems = [str(error)]
    if problems != ["ok"]:
        raise ValueError(f"damaged store {str(path)!r}: SQLite reports {'; '.join(problems)}. Move it away (or pass"
                         " another --storage) and run again to start afresh, or salvage its rows first with"
                         f" `sqlite3 {path} .recover`")


def _create(path: Path, create_tables) -> None:
    if not path.parent.is_dir():
        raise ValueError(f"invalid store {str(path)!r}: its folder {str(path.parent)!r} does not exist; create it"
                         " or pass another --storage")
    tmp = path.with_name(f".{path.name}.{os.getpid()}{CREATING}")
    try:
        tmp.unlink(missing_ok=True)
        _mark(tmp)
        create_tables(tmp)
        os.link(tmp, path)
    except FileExistsError:
        pass  # another worker created the store meanwhile: use theirs
    except (OSError, sqlite3.Error) as error:
        raise ValueError(f"cannot create store {str(path)!r}: {error}; pass another --storage") from error
    finally:
        tmp.unlink(missing_ok=True)


def _remove_abandoned_builds(path: Path) -> None:
    """Remove the files of store builds whose process (on this host) is gone."""
    for tmp in path.parent.glob(f".{path.name}.*{CREATING}*"):  # with its journal, if a kill left one
        pid = tmp.name.removeprefix(f".{path.name}.").partition(CREATING)[0]
        if pid.isdigit() and not alive(int(pid)):
            tmp.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock for the store at ``path``, held until the block ends or the process dies: ``flock`` on
    its folder, since closing a descriptor of the store file itself would drop this process's SQLite locks on
    it (POSIX locks belong to the process and the file, not the descriptor)."""
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)
