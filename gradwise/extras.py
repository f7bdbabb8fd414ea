"""Optional dependencies: one check that names the extra to install.

``pip install gradwise`` installs torch alone; the command line's tables need ``rich`` (``gradwise[cli]``), the
arena needs ``gradwise[arena]`` and a PostgreSQL store ``gradwise[postgres]``. A command calls ``require`` before it
imports any of them, so a bare install gets the ``pip install`` line to run instead of a ``ModuleNotFoundError``.
"""
from __future__ import annotations

import importlib.util

#: module imported -> the distribution that provides it, where the names differ.
DISTRIBUTIONS = {"sklearn": "scikit-learn", "absl": "absl-py"}
#: the modules of each extra (pyproject.toml's optional dependencies), as imported.
EXTRAS = {
    "cli": ("rich",),
    "arena": ("rich", "numpy", "optuna", "matplotlib", "sklearn", "mnist1d"),
    "postgres": ("psycopg",),
    "algoperf": ("absl",),  # AlgoPerf's submissions log with absl; the arena's shim needs nothing more
}


class MissingExtra(SystemExit):
    """A command needs a module that is not installed; the message names the extra to install."""


def missing(*modules: str) -> list[str]:
    """The modules of ``modules`` that cannot be imported here (found without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(command: str, extra: str) -> None:
    """Raise ``MissingExtra`` naming ``pip install 'gradwise[extra]'`` if a module of ``extra`` is missing."""
    absent = missing(*EXTRAS[extra])
    if absent:
        names = ", ".join(DISTRIBUTIONS.get(m, m) for m in absent)
        raise MissingExtra(f"{command} needs {names}: pip install 'gradwise[{extra}]'")
