"""The command line: ``gradwise bench step`` on the tiny preset, ``gradwise list``, argument errors.

Timings are checked for sanity only (positive, finite), never against thresholds.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gradwise import cli

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"recipe", "path", "median_ms", "min_ms", "max_ms", "times_ms", "warmup_ms", "compile_s", "compiles",
          "timed_compiles", "fused_ms", "vs_fused", "foreach_ms", "vs_foreach", "state_bytes",
          "state_bytes_per_param", "bytes_moved_per_param", "bound_ms", "vs_bound", "hyperparameters"}


@pytest.mark.slow
def test_bench_step_tiny_json(tmp_path):
    out = tmp_path / "rows.json"
    # a subprocess: the benchmark sets torch's thread count and compiles, which must not leak into other tests
    proc = subprocess.run(
        [sys.executable, "-m", "gradwise.cli", "bench", "step", "--size", "tiny", "--steps", "2",
         "--recipes", "AdamW", "--paths", "eager,compiled", "--copy-mb", "4", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "x fused" in proc.stdout and "copy bandwidth" in proc.stdout
    assert "[1/" in proc.stderr and not re.search(r"\.py:\d+", proc.stderr), proc.stderr  # no source locations
    result = json.loads(out.read_text())
    header, rows = result["header"], result["rows"]
    assert header["threads"] == 1 and header["size"] == "tiny" and header["steps"] == 2
    assert header["tensors"] == 28 and header["params"] == 168_192
    assert header["copy_bandwidth_gbs"] > 0 and header["copy_mb"] == 4
    assert [(r["recipe"], r["path"]) for r in rows] == [
        ("AdamW", "eager"), ("AdamW", "compiled"), ("torch AdamW", "fused"), ("torch AdamW", "foreach")]
    step_counters = 4 * header["tensors"] / header["params"]  # one 0-d float32 'step' per tensor
    for r in rows:
        assert FIELDS <= set(r), FIELDS - set(r)
        assert len(r["times_ms"]) == 2 or r["recipe"] == "torch AdamW"
        for key in ("median_ms", "min_ms", "max_ms", "fused_ms", "foreach_ms", "vs_fused", "vs_foreach",
                    "bound_ms", "vs_bound"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["recipe"], r["path"], key, r[key])
        assert r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["bytes_moved_per_param"] == 28
        assert r["state_bytes_per_param"] == pytest.approx(8 + step_counters, abs=1e-9)
        assert r["timed_compiles"] == 0
    eager, compiled, fused, foreach = rows
    assert eager["compiles"] == 0 and eager["compile_s"] == 0
    assert compiled["compiles"] >= 1 and compiled["compile_s"] > 0
    assert fused["vs_fused"] == pytest.approx(1.0) and foreach["vs_foreach"] == pytest.approx(1.0)
    assert foreach["vs_fused"] == pytest.approx(foreach["median_ms"] / fused["median_ms"])


@pytest.mark.slow
def test_bench_step_phases_times_each_phase_of_a_phased_step(tmp_path):
    """``--phases``: Ranger21's step runs in three phases (shaping, shrink, the elementwise rest), each timed; a
    steady AdamW step runs as one, and reports none."""
    proc, result = _bench_step(tmp_path, "--steps", "3", "--recipes", "Ranger21,AdamW", "--paths", "eager", "--phases")
    ranger21, adamw = result["rows"][:2]
    phases = ranger21["phases_ms"]
    assert [name.split("(")[1] for name in phases] == ["shape_gradient", "shrink_like_ranger21", "scale_by_pnm_adam"]
    assert all(ms > 0 for ms in phases.values()) and sum(phases.values()) <= ranger21["max_ms"]
    assert adamw["phases_ms"] == {}
    assert "ms a step in phase(shape_gradient" in proc.stdout


def test_list(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("AdamW", "Adam", "NAdamW", "Lion", "SGD", "scale_by_adam()", "exp_avg_sq", "momentum_buffer"):
        assert name in out


def test_recipe_table_state():
    rows = {r["name"]: r for r in cli.recipe_table()}
    assert "mu_product (scalar)" in rows["NAdamW"]["state"]
    assert "momentum.momentum_buffer (like param)" in rows["SGD"]["state"]
    assert rows["Lion"]["state"].count("like param") == 1


@pytest.mark.parametrize("argv, named", [
    (["--size", "big"], ["--size", "'big'", "tiny", "25m", "124m"]),
    (["--recipes", "AdamW,Foo"], ["--recipes", "'Foo'", "AdamW", "NAdamW", "Lion", "SGD"]),
    (["--paths", "jit"], ["--paths", "'jit'", "eager", "compiled"]),
    (["--steps", "0"], ["--steps", "'0'", ">= 1"]),
    (["--threads", "two"], ["--threads", "'two'", ">= 1"]),
    (["--device", "tpu"], ["--device", "'tpu'", "cpu", "cuda"]),
])
def test_bad_arguments_name_argument_value_and_allowed(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "step", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    for text in named:
        assert text in err, (text, err)


def test_bench_step_peers_times_each_recipes_reference_beside_it(tmp_path):
    """``--peers``: a row for each recipe's reference implementation (lion-pytorch's Lion, torch's foreach NAdam),
    after the recipe's own, timed in the same interleaved rounds against torch's AdamW."""
    proc, result = _bench_step(tmp_path, "--steps", "2", "--recipes", "Lion,NAdamW,AdamW", "--paths", "eager",
                               "--peers")
    rows = result["rows"]
    assert [(r["recipe"], r["path"]) for r in rows] == [
        ("Lion", "eager"), ("Lion", "peer: lion-pytorch"), ("NAdamW", "eager"), ("NAdamW", "peer: torch NAdam foreach"),
        ("AdamW", "eager"), ("torch AdamW", "fused"), ("torch AdamW", "foreach")]
    for r in rows[1], rows[3]:
        assert len(r["times_ms"]) == 2 and r["compiles"] == 0 and math.isfinite(r["vs_foreach"]) and r["median_ms"] > 0
        assert r["state_bytes"] > 0  # the peer's own state, counted as gradwise's
    assert "peer: lion-pytorch" in proc.stdout


def _bench_step(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``bench/step.py --size tiny ARGS`` in a subprocess (it sets torch's thread count), its copy bandwidth timed on 4
    MiB (the default 512 MiB takes seconds a run): the process, and its JSON."""
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "bench/step.py", "--size", "tiny", *args, "--copy-mb", "4",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(out.read_text())
