"""bfloat16 parameters written with stochastic rounding (``param_rounding="stochastic"``): unbiased,
closer to float32 training than round-to-nearest, reproducible, eager equal to compiled."""
from __future__ import annotations

import io

import pytest
import torch

import gradwise
from gradwise.core.eager import EAGER_CHUNK
from tests.models import mlp, regression_batch

ULP = 2.0**-7  # of bfloat16 in [1, 2)


def _one_step(rounding: str, fraction: torch.Tensor) -> torch.Tensor:
    """p = 1 (bfloat16), one SGD step that adds ``fraction`` of a bfloat16 ulp: the written change / ulp."""
    p = torch.ones(fraction.numel(), dtype=torch.bfloat16, requires_grad=True)
    optimizer = gradwise.SGD([p], lr=1.0, param_rounding=rounding, compile=False)
    p.grad = (-fraction * ULP).to(torch.bfloat16)
    exact = 1.0 + p.grad.float() * -1.0
    optimizer.step()
    return (p.detach().float() - exact) / ULP


def test_stochastic_rounding_is_unbiased():
    n = 1 << 16
    fraction = 0.05 + 0.4 * torch.rand(n, generator=torch.Generator().manual_seed(0))
    error = _one_step("stochastic", fraction)
    nearest = _one_step("nearest", fraction)
    bound = 5 * 0.5 / n**0.5  # 5 standard deviations of the mean of n errors, each of variance <= 1/4
    assert abs(float(error.mean())) < bound, "stochastic rounding is biased"
    assert float(nearest.mean()) < -0.2, "round-to-nearest loses updates under half an ulp"
    assert set(torch.unique(error + fraction.to(torch.bfloat16).float()).tolist()) <= {0.0, 1.0}, \
        "each element goes to one of its two neighbours"
    assert 0.2 < float((error > 0).float().mean()) < 0.3, "rounded up about as often as the mean fraction (0.25)"


def _train(rounding, dtype, steps=120, lr=4e-4, compile=False, state=None):
    model = mlp(torch.float32).to(dtype)
    optimizer = gradwise.AdamW(model.parameters(), lr=lr, param_rounding=rounding, compile=compile, state=state)
    for step in range(steps):
        x, y = regression_batch(torch.float32, step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).backward()
        optimizer.step()
    x, y = regression_batch(torch.float32, 10**6)
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).item()
    return [p.detach().float() for p in model.parameters()], loss


def _distance(a, b):
    return float(sum(((x - y) ** 2).sum() for x, y in zip(a, b)).sqrt())


def test_bf16_training_tracks_fp32_with_stochastic_rounding():
    fp32, fp32_loss = _train("nearest", torch.float32)
    nearest, nearest_loss = _train("nearest", torch.bfloat16)
    stochastic, stochastic_loss = _train("stochastic", torch.bfloat16)
    start = [p.detach().float() for p in mlp(torch.float32).parameters()]
    moved = _distance(fp32, start)
    assert _distance(stochastic, fp32) < 0.3 * moved < 0.5 * _distance(nearest, fp32)
    assert abs(stochastic_loss / fp32_loss - 1) < 0.01 < 0.05 < nearest_loss / fp32_loss - 1


def test_float32_parameters_are_written_as_before():
    (a, a_loss), (b, b_loss) = _train("stochastic", torch.float32, steps=20), _train("nearest", torch.float32, steps=20)
    assert a_loss == b_loss and all(torch.equal(x, y) for x, y in zip(a, b))


def test_resume_is_bit_identical():
    def run(model, optimizer, first, steps):
        for step in range(first, first + steps):
            x, y = regression_batch(torch.float32, step)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x.bfloat16()).float(), y).backward()
            optimizer.step()

    model = mlp(torch.float32).bfloat16()
    optimizer = gradwise.AdamW(model.parameters(), lr=1e-3, param_rounding="stochastic", compile=False)
    run(model, optimizer, 0, 4)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, buffer)
    run(model, optimizer, 4, 4)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed_model = mlp(torch.float32, seed=3).bfloat16()
    resumed_model.load_state_dict(saved["model"])
    resumed = gradwise.AdamW(resumed_model.parameters(), lr=1e-3, compile=False)  # the option comes from the checkpoint
    resumed.load_state_dict(saved["opt"])
    assert resumed.param_groups[0]["param_rounding"] == "stochastic"
    run(resumed_model, resumed, 4, 4)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed_model.parameters()))


def test_checkpoint_without_the_option_loads_with_its_default():
    p = torch.zeros(3, requires_grad=True)
    saved = gradwise.AdamW([p]).state_dict()
    del saved["param_groups"][0]["param_rounding"]
    optimizer = gradwise.AdamW([p], param_rounding="stochastic")
    optimizer.load_state_dict(saved)
    assert optimizer.param_groups[0]["param_rounding"] == "stochastic"


def _bf16_params():
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(3, EAGER_CHUNK + 5, generator=gen)  # stepped in pieces on the eager path
    shapes = [(), (7,), (5, 3)]
    params = [big] + [torch.randn(s, generator=gen) for s in shapes] + [torch.randn(6, 4, generator=gen).t()]
    return [t.bfloat16().requires_grad_() for t in params]


@pytest.mark.slow
@pytest.mark.parametrize("state", [None, "bf16"], ids=["fp32-state", "bf16-state"])
def test_compiled_equals_eager(state):
    runs, compiled_optimizer = [], None
    for compile in (True, False):
        params = _bf16_params()
        optimizer = gradwise.SGD(params, lr=0.01, momentum=0.9, param_rounding="stochastic", compile=compile,
                                 state=state)
        for step in range(4):
            gen = torch.Generator().manual_seed(step)
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen).bfloat16()
            optimizer.step()
        runs.append(params)
        compiled_optimizer = compiled_optimizer or optimizer
    assert compiled_optimizer.compile_stats["compiles"] >= 1
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_in_backward_equals_step():
    fused_model, plain_model = mlp(torch.float32).bfloat16(), mlp(torch.float32).bfloat16()
    # steps inside backward, through the hooks it installs
    gradwise.LOMO(fused_model.parameters(), lr=1e-3, param_rounding="stochastic", compile=False)
    plain = gradwise.LOMO(plain_model.parameters(), lr=1e-3, param_rounding="stochastic", compile=False,
                          fused_backward=False)
    for step in range(5):
        x, y = regression_batch(torch.float32, step)
        torch.nn.functional.mse_loss(fused_model(x.bfloat16()).float(), y).backward()
        plain.zero_grad()
        torch.nn.functional.mse_loss(plain_model(x.bfloat16()).float(), y).backward()
        plain.step()
    assert all(torch.equal(a, b) for a, b in zip(fused_model.parameters(), plain_model.parameters()))


def test_bad_value():
    with pytest.raises(ValueError, match=r"param_rounding='up': expected one of \['nearest', 'stochastic'\]"):
        gradwise.AdamW([torch.zeros(2, requires_grad=True)], param_rounding="up")
