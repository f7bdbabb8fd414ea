"""The peak-memory benchmark runs: each configuration builds, steps and reads the high-water mark."""
from __future__ import annotations

import sys

import pytest

from bench._memory_peak import CONFIGS, measure, small_transformer

TINY = dict(vocab=64, context=16, width=32, blocks=1, heads=2)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("name", ["torch AdamW, step()", "AdamW, fused_backward", "AdaLomo, in backward"])
def test_measure_reports_a_step_peak(name):
    assert name in CONFIGS
    row = measure(name, TINY)
    assert row["params"] == sum(p.numel() for p in small_transformer(**TINY).parameters())
    assert row["hwm_kib"] >= row["rss_before_kib"] > 0
