"""``torch.compile(train_step)`` with ``optimizer.step()`` inside, the pattern torch documents for its own
optimizers: it compiles once, matches the same training step run eagerly, and never recompiles while a
scheduler changes lr, betas and weight decay every step. The step runs outside dynamo's graph (as
torch.optim's ``zero_grad`` does), on gradwise's own eager or compiled path."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

import gradwise

STEPS = 20
#: NAdamW and Schedule-Free compute per-parameter coefficients through ``Context.once``, which nothing collects here
CASES = {"AdamW": (gradwise.AdamW, {}), "Lion": (gradwise.Lion, {}),
         "AdamW-int8": (gradwise.AdamW, {"state": "int8"}), "NAdamW": (gradwise.NAdamW, {}),
         "ScheduleFreeAdamW": (gradwise.ScheduleFreeAdamW, {})}


def _train(case: str, backend, compile_step: bool | str = "auto"):
    """20 steps of a small MLP with ``optimizer.step()`` inside the (compiled, when ``backend`` is given)
    training step; lr, betas and weight decay change every step. Returns the parameters, the losses, the
    optimizer and, after each step, the graphs compiled so far: dynamo's around the training step (through
    ``backend``) and gradwise's own."""
    cls, options = CASES[case]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 8))
    optimizer = cls(model.parameters(), lr=1e-2, weight_decay=0.1, compile=compile_step, **options)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9 ** step)
    inputs, targets = torch.randn(32, 64), torch.randn(32, 8)

    def train_step():
        loss = (model(inputs) - targets).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    step = train_step if backend is None else torch.compile(train_step, backend=backend)
    losses, graphs = [], []
    for i in range(STEPS):
        losses.append(float(step()))
        graphs.append((getattr(backend, "frame_count", 0), optimizer.compile_stats["compiles"]))
        scheduler.step()
        for group in optimizer.param_groups:  # a schedule of betas and weight decay too
            group["betas"] = (0.9 - 0.01 * i, 0.99 - 0.001 * i)
            group["weight_decay"] = 0.1 / (1 + i)
    return [p.detach().clone() for p in model.parameters()], losses, optimizer, graphs


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_train_step_equals_eager_and_compiles_once(case):
    eager_params, eager_losses, *_ = _train(case, None)
    # dynamo without a code generator: its graphs run the same kernels as eager, so results are bit-equal
    compiled_params, compiled_losses, _, graphs = _train(case, CompileCounter())
    assert compiled_losses == eager_losses
    assert all(torch.equal(a, b) for a, b in zip(compiled_params, eager_params)), f"{case}: parameters differ"
    assert graphs[0][0] >= 1, "nothing was compiled"
    assert graphs == [graphs[0]] * STEPS, f"{case}: graphs compiled so far, step by step: {graphs}"


@pytest.mark.slow
def test_inductor_train_step_with_compiled_optimizer_compiles_once():
    """The user's setting: inductor around the training step, gradwise's own compiled step inside."""
    eager_params, eager_losses, *_ = _train("AdamW", None, compile_step=True)
    params, losses, _, graphs = _train("AdamW", CompileCounterWithBackend("inductor"), compile_step=True)
    assert graphs[0][0] >= 1 and graphs[0][1] >= 1, f"dynamo's and gradwise's graphs after one step: {graphs[0]}"
    assert graphs == [graphs[0]] * STEPS, f"graphs compiled so far, step by step: {graphs}"
    for a, b in zip(params, eager_params):  # inductor's forward and backward round differently from eager's
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert losses == pytest.approx(eager_losses, rel=1e-4)
