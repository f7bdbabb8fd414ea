"""bench/gpu.sh's code on the CPU: bench/step.py's device path (every timing between two synchronize calls,
the copy on the device) and its Markdown table, in process; and, slow, the script end to end with DEVICE=cpu."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import _gpu_table
from bench import step as bench_step
from gradwise.cli_bench import add_step_arguments

ROOT = Path(__file__).resolve().parents[1]


def test_step_on_a_device_and_its_markdown_table():
    argv = ["--size", "tiny", "--steps", "1", "--paths", "eager", "--recipes", "AdamW,AdamW-fp8", "--device", "cpu",
            "--copy-mb", "4", "--warm-cache", "--threads", str(torch.get_num_threads())]  # no thread count leaks
    result = bench_step.measure(add_step_arguments(argparse.ArgumentParser()).parse_args(argv))
    header, rows = result["header"], result["rows"]
    assert header["device"] == bench_step.cpu_model() and header["copy_mb"] == 4
    assert [r["recipe"] for r in rows] == ["AdamW", "AdamW-fp8"] + ["torch AdamW"] * 2
    markdown = _gpu_table.table([result], "`pytest -m cuda`: 3 passed", ["Lion: not measured, ran out of its 45 s"])
    lines = markdown.splitlines()
    adamw = next(line for line in lines if line.startswith("| AdamW | eager |")).split(" | ")
    achieved = 28 * header["params"] / (rows[0]["median_ms"] / 1e3) / 1e9
    assert float(adamw[5]) == pytest.approx(achieved, abs=0.5)
    assert float(adamw[6]) == pytest.approx(1 / rows[0]["vs_bound"], abs=0.005)  # achieved over copy bandwidth
    assert float(adamw[3]) == pytest.approx(rows[0]["vs_fused"], abs=0.005)
    assert sum(line.startswith("| torch AdamW | fused |") for line in lines) == 1
    assert "- Lion: not measured, ran out of its 45 s" in lines and "Tests: `pytest -m cuda`: 3 passed" in lines


@pytest.mark.slow
def test_gpu_script_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.md"
    env = dict(os.environ, PYTHON=sys.executable, DEVICE="cpu", SIZE="tiny", STEPS="1", PATHS="eager", COPY_MB="4",
               ROWS="AdamW NoSuchRow", TESTS="--version")  # the test part runs pytest, not a second suite
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), str(out)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert lines[0].startswith(f"Optimizer step on {bench_step.cpu_model()}, GPT-2-shaped 168.2K parameters")
    assert "Tests: `pytest --version`: pytest " in "\n".join(lines)
    assert [line.split(" | ")[0] for line in lines if line.startswith("| ") and "---" not in line][1:] == [
        "| AdamW", "| torch AdamW"]
    note = next(line for line in lines if line.startswith("- NoSuchRow: not measured, "))
    assert "'NoSuchRow' not allowed" in note and note.endswith("(exit 2)")
