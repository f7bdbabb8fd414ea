"""The bench scripts as a newcomer runs them: ``--help`` prints the usage and measures nothing, and a flag
that names a measurement runs that measurement alone."""
from __future__ import annotations

import math
import os
import runpy
import sys
from pathlib import Path

import pytest

from bench import graph_calls as bench_graph_calls
from bench import memory as bench_memory
from bench import overhead as bench_overhead
from bench import step as bench_step

#: the scripts: every bench/*.py but the parts named _*.py (bench/__init__.py says so)
SCRIPTS = sorted(s for s in (Path(__file__).resolve().parents[1] / "bench").glob("*.py") if not s.name.startswith("_"))


def test_every_bench_script_is_here():
    assert {s.stem for s in SCRIPTS} >= {"codec", "convergence", "matrix_step", "memory", "peers", "step"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_help_exits_zero_without_measuring(script, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    captured = capsys.readouterr()
    assert exit_info.value.code == 0
    assert captured.out.startswith(f"usage: bench/{script.name}"), captured.out[:200]
    description = captured.out.split("\n\n")[1]
    assert description.rstrip().endswith((".", ":")), description  # a whole sentence, not its first line
    assert captured.err == ""  # no progress, no measurement


def test_a_named_measurement_runs_alone(capsys):
    assert bench_memory.main(["--bytes", "--size", "tiny", "--formats", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "state bytes per parameter element" in out and "Mean final loss" not in out
    assert bench_memory.main(["--quality", "--quality-formats", "fp32", "--seeds", "1", "--steps", "30"]) == 0
    out = capsys.readouterr().out
    assert "Mean final loss" in out and "state bytes" not in out


def test_overhead_times_every_row_on_a_small_set(capsys):
    assert bench_overhead.main(["--sets", "100 small", "--rounds", "1", "--steps", "1"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("100 small"))
    assert line.count("x)") == len(bench_overhead.DEFAULT_ROWS) and "(1.00x)" in line


def test_graph_calls_splits_a_compiled_step_around_its_graphs_and_torchs_kernel(capsys):
    assert bench_graph_calls.main(["--size", "tiny", "--recipes", "Lion", "--rounds", "2"]) == 0
    rows = {line[:20].strip(): line[20:].split() for line in capsys.readouterr().out.splitlines()[2:]}
    ours, theirs = rows["Lion"], rows["torch AdamW fused"]
    assert int(ours[4]) >= 1 and int(theirs[4]) == 1  # graph calls; torch's one kernel call
    assert theirs[1] == theirs[3] == "1.00" and float(theirs[6]) == 0.0  # torch against itself, no gap
    step, graphs, before, between, after = (float(ours[i]) for i in (0, 2, 5, 6, 7))
    # (the median of two rounds is their mean: the parts add up to the step, to the table's rounding)
    assert 0 < graphs < step and abs(graphs + before + between + after - step) <= 0.03


def test_overhead_rows_are_chosen_with_torchs_default_always_first(capsys):
    assert bench_overhead.main(["--sets", "100 small", "--rounds", "1", "--steps", "1", "--rows", "torch fused"]) == 0
    out = capsys.readouterr().out
    header = next(row for row in out.splitlines() if row.startswith("set"))
    assert header.split()[-4:] == ["torch", "default", "torch", "fused"]
    with pytest.raises(SystemExit):
        bench_overhead.main(["--sets", "100 small", "--rows", "torch fused,gradwise turbo"])
    assert "['gradwise turbo'] not among" in capsys.readouterr().err


def test_overhead_state_builds_the_gradwise_rows_with_encoded_state(capsys):
    import torch

    import gradwise

    params = [torch.nn.Parameter(torch.randn(16, 16)) for _ in range(3)]
    optimizer = bench_overhead.build("gradwise eager", params, gradwise.StatePolicy("bf16", min_numel=0))
    optimizer.step()
    assert all(any(key.endswith("@bf16.value") for key in optimizer.state[p]) for p in optimizer.state)
    assert not bench_overhead.build("torch fused", params, gradwise.StatePolicy("bf16")).state  # torch: as it is
    assert bench_overhead.main(["--sets", "100 small", "--rounds", "1", "--steps", "1", "--rows", "gradwise eager",
                                "--state", "int8", "--min-numel", "0"]) == 0
    out = capsys.readouterr().out
    assert "gradwise state int8-b2048, min_numel 0" in out and next(
        row for row in out.splitlines() if row.startswith("100 small")).count("x)") == 2
    with pytest.raises(SystemExit):
        bench_overhead.main(["--sets", "100 small", "--min-numel", "0"])
    assert "--min-numel: 0 needs --state" in capsys.readouterr().err


def test_overhead_schedule_sets_lr_before_every_step_as_a_trial(capsys):
    import torch

    import gradwise

    params = [torch.nn.Parameter(torch.ones(3))]
    params[0].grad = torch.ones(3)
    optimizer = gradwise.AdamW(params, lr=1e-3)
    step = bench_overhead.stepper(optimizer, True, total=40)
    seen = []
    for _ in range(4):
        seen.append(optimizer.param_groups[0]["lr"])
        step()
    # warmup over 5% of 40 steps (2), then cosine to 0 at step 40: lr set before every step
    expected = [1e-3 * k / 2 for k in (1, 2)] + [1e-3 * 0.5 * (1 + math.cos(math.pi * k / 38)) for k in (0, 1)]
    assert seen == pytest.approx(expected, rel=1e-12) and seen[3] < seen[2]
    assert int(optimizer.state[params[0]]["step"]) == 4
    assert bench_overhead.main(["--sets", "100 small", "--rounds", "1", "--steps", "1", "--schedule"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if row.startswith("100 small"))
    assert line.count("x)") == len(bench_overhead.DEFAULT_ROWS) and "(1.00x)" in line


@pytest.mark.parametrize("named", ["/somewhere/graphs", "0", None], ids=["a folder", "off", "unset"])
def test_a_cold_step_bench_compiles_into_a_fresh_cache_with_the_stored_graphs_there(named, monkeypatch):
    """``bench/step.py`` without ``--warm-cache``: inductor's cache and gradwise's stored graphs in a fresh folder (a
    folder ``GRADWISE_GRAPH_CACHE`` names is set aside, ``0`` kept: the store stays off), and both restored after."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/usual/cache")
    if named is None:
        monkeypatch.delenv("GRADWISE_GRAPH_CACHE", raising=False)
    else:
        monkeypatch.setenv("GRADWISE_GRAPH_CACHE", named)
    with bench_step._inductor_cache(warm=False):
        fresh = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        assert fresh.is_dir() and not any(fresh.iterdir())
        assert os.environ.get("GRADWISE_GRAPH_CACHE") == ("0" if named == "0" else None)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/usual/cache" and not fresh.exists()
    assert os.environ.get("GRADWISE_GRAPH_CACHE") == named
