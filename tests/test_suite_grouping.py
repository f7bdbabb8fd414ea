"""``make test``'s workers keep a module with a module-scoped fixture (spawned ranks, a model trained once) on one
worker (tests/conftest.py marks it, pytest-xdist's ``--dist loadgroup`` appends the group to the test's id and
schedules by it), so that fixture runs once. Under pytest 9 the id stayed as it was, and such modules' ranks were
spawned once per worker."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def once() -> str:
    return "module-scoped"


def test_a_module_scoped_fixtures_tests_carry_their_group(request, once):
    if not getattr(request.config.option, "loadgroup", False):  # pytest-xdist sets it in each worker
        pytest.skip("only under pytest-xdist's --dist loadgroup (make test)")
    assert request.node.nodeid.endswith("@" + __name__), request.node.nodeid
