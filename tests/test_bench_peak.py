"""The peak-memory benchmark runs: each configuration builds, steps and reads the high-water mark."""
from __future__ import annotations

import sys

import pytest

from gradwise.bench_peak import CONFIGS, MODEL, measure, small_transformer


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("name", ["AdaLomo, in backward"])
def test_measure_reports_a_step_peak(name):
    assert name in CONFIGS
    row = measure(name)
    assert row["params"] == sum(p.numel() for p in small_transformer(**MODEL).parameters())
    assert row["hwm_kib"] >= row["rss_before_kib"] > 0
