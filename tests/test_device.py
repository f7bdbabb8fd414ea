"""The GPU benchmark's recipes (``bench/gpu.sh``) on every device torch sees: the CPU always, CUDA when there is
one. ``bench/gpu.sh`` runs this module (``pytest -m cuda``) before it times the recipes on the GPU.

Each recipe matches its reference on the device, keeps its state on its parameters' device, and on an accelerator
steps as it does on the CPU (within a share of a step's size: matmuls and reductions round differently there)
and compiled as eagerly.
"""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise.cli_bench import RECIPES
from tests.models import bag_of_tensors
from tests.registry import REFERENCED
from tests.test_parity import TOLERANCE, _clone, assert_trajectories_close, run_bag

pytestmark = pytest.mark.cuda
CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA"))
DEVICES = ["cpu", CUDA]
#: bench/gpu.sh's rows
GPU_ROWS = ["AdamW", "AdamW-int8", "AdamW-fp8", "AdamW-bf16", "Lion", "Muon", "Ranger21"]
STEPS = 8


def _on(device: str, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of the parameters on ``device``, strides kept (the transposed one stays non-contiguous)."""
    return [p.detach().to(device, copy=True).requires_grad_() for p in params]


def _build(row: str, params, compile: bool = False):
    cls_name, hyper, _ = RECIPES[row]
    return getattr(gradwise, cls_name)(params, **hyper, compile=compile)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [c for c in REFERENCED if c.recipe in (gradwise.AdamW, gradwise.Lion,
                                                                        gradwise.Ranger21) and c.trains],
                         ids=lambda c: c.name)
def test_matches_its_reference_on_the_device(case, device):
    params = bag_of_tensors(torch.float32)
    ours = run_bag(lambda p: case.ours(p, compile=False), _on(device, params), torch.float32, STEPS)
    theirs = run_bag(case.theirs, _on(device, params), torch.float32, STEPS)
    assert ours[-1][0].device.type == device
    assert_trajectories_close(ours, theirs, torch.float32, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row", GPU_ROWS)
def test_state_stays_on_the_device_and_steps_as_on_the_cpu(row, device):
    params = [p for p in bag_of_tensors(torch.float32) if p.numel()] + [torch.randn(64, 96).requires_grad_()]
    on_device = _on(device, params)
    optimizer = _build(row, on_device)
    stepped = run_bag(lambda p: optimizer, on_device, torch.float32, STEPS)
    for p in on_device:
        for key, value in optimizer.state[p].items():
            if isinstance(value, torch.Tensor) and value.dim():
                assert value.device == p.device, f"{row}: state {key!r} on {value.device}, parameter on {p.device}"
    assert all(torch.isfinite(p).all() for p in stepped[-1])
    if device != "cpu":
        on_cpu = run_bag(lambda p: _build(row, p), _clone(params), torch.float32, STEPS)
        moved = max(float((a.cpu() - b).abs().max()) for a, b in zip(stepped[-1], params))
        for a, b in zip(stepped[-1], on_cpu[-1]):
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0.05 * moved)


@pytest.mark.slow
@pytest.mark.parametrize("device", [CUDA])  # the CPU's compiled path: tests/test_parity.py
@pytest.mark.parametrize("row", GPU_ROWS)
def test_compiled_equals_eager_on_cuda(row, device):
    params = bag_of_tensors(torch.float32)
    compiled = run_bag(lambda p: _build(row, p, compile=True), _on("cuda", params), torch.float32, STEPS)
    eager = run_bag(lambda p: _build(row, p), _on("cuda", params), torch.float32, STEPS)
    assert_trajectories_close(compiled, eager, torch.float32, rtol=1e-6, atol=1e-7)
