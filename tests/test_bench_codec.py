"""``bench/codec.py``: the codecs' own cost against a torch AdamW step, on a small buffer.

Timings are checked for sanity only (positive, finite, summed as documented), never against thresholds.
"""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench import codec as bench_codec

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_codec_floor_measures_every_map_and_sums_its_floors():
    lines = []
    result = bench_codec.measure(numel=4096 + 7, rounds=2, log=lines.append)
    items = {r["item"]: r for r in result["rows"]}
    assert len(items) == 2 + 2 * len(bench_codec.MAPS)  # torch's step, the copy, two per map
    reference = items["torch AdamW fused step"]["median_ms"]
    for r in result["rows"]:
        assert math.isfinite(r["median_ms"]) and r["median_ms"] > 0
        assert r["vs_fused"] == pytest.approx(r["median_ms"] / reference)
    per_byte = items["copy (memory baseline)"]["median_ms"] / 8
    for codec, bits in (("int8", 8), ("int4", 4), ("fp8", 8)):
        parts = [r["median_ms"] for name, r in items.items() if name.startswith(codec + " ")]
        assert len(parts) == 4  # decode and encode of both moments
        floor = result["floors"][codec]
        assert floor["ms"] == pytest.approx(sum(parts))
        assert floor["compute_ms"] == pytest.approx(sum(parts) - 4 * per_byte * (4 + bits / 8))
    assert any("encode stochastic" in line for line in lines)  # int4's first moment rounds stochastically


def test_codec_bench_refuses_an_empty_buffer(capsys):
    with pytest.raises(SystemExit):
        bench_codec.main(["--numel", "0"])
    assert "--numel 0" in capsys.readouterr().err


@pytest.mark.slow
def test_codec_bench_script_help():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "codec.py"), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "--numel" in proc.stdout and "--rounds" in proc.stdout
