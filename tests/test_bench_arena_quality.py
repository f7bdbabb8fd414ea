"""``bench/memory.py --arena-quality``: AdamW on an arena workload with each state format, every buffer encoded."""
from __future__ import annotations

import math

import pytest

from bench import _memory_arena_quality as bench_arena_quality


def test_each_format_trains_the_workload_and_is_compared_with_fp32():
    rows = bench_arena_quality.compare(workloads=("digits_cnn",), seeds=(0,), steps=20, log=lambda _: None)
    assert [r["format"] for r in rows] == list(bench_arena_quality.FORMATS)
    fp32 = rows[0]["loss"]
    assert rows[0]["vs_fp32"] == 1.0
    for r in rows:
        assert math.isfinite(r["loss"]) and r["metric"] == "accuracy" and 0 <= r["metric_value"] <= 1
        assert r["vs_fp32"] == pytest.approx(r["loss"] / fp32)
    # 20 steps move the loss from log(10) = 2.30 (a real run, not a copy of the untrained model)
    assert all(r["loss"] < 2.2 for r in rows)
