"""Test-session settings for running the suite in parallel with pytest-xdist (``make test`` runs two workers).

- Each worker runs torch on one thread: two workers with two threads each on two cores made small ops tens of
  times slower.
- A module whose fixture is module-scoped (ranks spawned once, a model trained once, for all its tests) runs
  whole on one worker (``--dist loadgroup``), so that fixture still runs once per module.
"""
import os

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(items):
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        if fixtures is None:
            continue
        if any(defs[-1].scope == "module" for defs in fixtures.name2fixturedefs.values() if defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
