"""Optional dependencies: which extra installs each, and one check that names it.

``pip install gradwise`` installs torch alone; the command line's tables need ``rich`` (``gradwise[cli]``), the
arena needs ``gradwise[arena]`` and a PostgreSQL store ``gradwise[postgres]``. A command calls ``require`` before it
imports any of them, so a bare install gets the ``pip install`` line to run instead of a ``ModuleNotFoundError``.
"""
from __future__ import annotations

import importlib.util

#: module imported -> (distribution, the extra that installs it).
EXTRAS = {
    "rich": ("rich", "cli"),
    "numpy": ("numpy", "arena"),
    "optuna": ("optuna", "arena"),
    "matplotlib": ("matplotlib", "arena"),
    "sklearn": ("scikit-learn", "arena"),
    "mnist1d": ("mnist1d", "arena"),
    "psycopg": ("psycopg", "postgres"),
}
#: what each extra's modules are, in the order they are checked.
ARENA = ("rich", "numpy", "optuna", "matplotlib", "sklearn", "mnist1d")


class MissingExtra(SystemExit):
    """A command needs a module that is not installed; the message names the extra to install."""


def missing(*modules: str) -> list[str]:
    """The modules of ``modules`` that cannot be imported here (found without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(command: str, *modules: str) -> None:
    """Raise ``MissingExtra`` naming the ``pip install`` line if any of ``modules`` is not installed."""
    absent = missing(*modules)
    if absent:
        extras = sorted({EXTRAS[m][1] for m in absent})
        names = ", ".join(EXTRAS[m][0] for m in absent)
        install = " ".join(f"'gradwise[{e}]'" for e in extras)
        raise MissingExtra(f"{command} needs {names}: pip install {install}")
