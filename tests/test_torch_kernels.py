"""torch's fused kernels on the eager path: under ``compile="auto"`` a small model's Adam and AdamW step runs
``torch._fused_adamw_`` (``transforms/adam.py``) and SGD's ``torch._fused_sgd_`` (``transforms/momentum.py``),
torch.optim's ``fused=True``; so does the recipe given torch's ``fused=True`` (else it compiles); under
``compile=False`` the list ops keep the bits of torch.optim's for-loop
(``test_parity.py::test_adam_eagerly_has_torchs_bits``)."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise.core.eager import EAGER_CHUNK
from tests.models import mlp, regression_batch
from tests.test_parity import run_bag

ADAM = [("AdamW", {}), ("AdamW", {"amsgrad": True}), ("AdamW", {"maximize": True}), ("AdamW", {"weight_decay": 0.0}),
        ("Adam", {"decoupled_weight_decay": True, "weight_decay": 0.1})]
SGD = [("SGD", {}), ("SGD", {"momentum": 0.9}), ("SGD", {"momentum": 0.9, "nesterov": True}),
       ("SGD", {"momentum": 0.9, "dampening": 0.2}), ("SGD", {"momentum": 0.8, "maximize": True})]
#: L2 weight decay is a link of its own before the kernel (g + wd p), which torch's kernel adds in its own loop
L2 = [("SGD", {"momentum": 0.9, "weight_decay": 0.01}), ("Adam", {"weight_decay": 0.1})]


def _contiguous_params(dtype):
    """Small tensors batched together, and one long enough to run in pieces (``EAGER_CHUNK``)."""
    gen = torch.Generator().manual_seed(6)
    shapes = [(7,), (5, 3), (2, 3, 4, 5), (EAGER_CHUNK + 7,)]
    return [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in shapes]


def _halve_lr_every_fourth(optimizer, step):
    if step and step % 4 == 0:
        for group in optimizer.param_groups:
            group["lr"] *= 0.5


def _trajectories(name, options, dtype, made=None, **ours):
    """gradwise's and torch.optim's ``fused=True`` trajectories; ``made``: a list that gets gradwise's optimizer."""
    kwargs = dict(lr=0.01, **({"betas": (0.8, 0.99)} if name != "SGD" else {}), **options)
    params = _contiguous_params(dtype)

    def run(make):
        copies = [p.detach().clone().requires_grad_() for p in params]
        return run_bag(make, copies, dtype, 20, before_step=_halve_lr_every_fourth)

    def ours_made(p):
        optimizer = getattr(gradwise, name)(p, **ours, **kwargs)
        if made is not None:
            made.append(optimizer)
        return optimizer
    return run(ours_made), run(lambda p: getattr(torch.optim, name)(p, fused=True, **kwargs))


def _assert_same(mine, fused):
    for step, (a, b) in enumerate(zip(mine, fused)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), f"step {step}"


@pytest.mark.parametrize("name, options", ADAM + SGD, ids=str)
def test_auto_runs_torchs_fused_kernel_bit_for_bit_in_float64(name, options):
    mine, fused = _trajectories(name, options, torch.float64)
    _assert_same(mine, fused)
    eager, _ = _trajectories(name, options, torch.float64, compile=False)
    assert any(not torch.equal(x, y) for x, y in zip(eager[-1], mine[-1])), "the list ops ran, not the kernel"


@pytest.mark.parametrize("name, options", SGD, ids=str)
def test_auto_sgd_is_torchs_fused_step_bit_for_bit_in_float32(name, options):
    """SGD's kernel computes in float32 whatever the precision of its numbers: torch's bits."""
    _assert_same(*_trajectories(name, options, torch.float32))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name, options", L2, ids=str)
def test_auto_with_l2_decay_is_torchs_fused_step_within_a_rounding(name, options, dtype):
    mine, fused = _trajectories(name, options, dtype)
    tolerance = 1e-14 if dtype == torch.float64 else 2e-6
    for step, (a, b) in enumerate(zip(mine, fused)):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=tolerance, atol=tolerance / 10, msg=f"step {step}")
    eager, _ = _trajectories(name, options, dtype, compile=False)
    assert any(not torch.equal(x, y) for x, y in zip(eager[-1], mine[-1])), "the list ops ran, not the kernel"


@pytest.mark.parametrize("name, options", ADAM, ids=str)
def test_auto_adam_is_torchs_fused_step_bit_for_bit_in_float32(name, options):
    """The kernel reads lr, betas, eps and weight decay as the doubles torch passes it (the bucket's
    constants are packed in float64 where its step ends in the kernel)."""
    _assert_same(*_trajectories(name, options, torch.float32))


def test_steady_steps_with_the_kernel_equal_the_general_step():
    models = [mlp(torch.float32), mlp(torch.float32)]
    opts = [gradwise.AdamW(m.parameters(), lr=0.01) for m in models]
    opts[1].steady_steps = False
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5) for o in opts]
    for step in range(12):
        x, y = regression_batch(torch.float32, step)
        for model, opt, scheduler in zip(models, opts, schedulers):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            scheduler.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
        assert all(torch.equal(opts[0].state[a][k], opts[1].state[b][k]) for k in opts[0].state[a])


def test_a_non_contiguous_parameter_runs_the_list_ops_with_torchs_for_loop_bits():
    """The kernel takes contiguous tensors only; a transposed weight's step is the list ops' (torch's for-loop
    bits, as under ``compile=False``)."""
    weight = torch.randn(6, 4, generator=torch.Generator().manual_seed(3)).t().requires_grad_()
    runs = [run_bag(lambda p: make(p, lr=0.01), [weight.detach().clone().t().contiguous().t().requires_grad_()],
                    torch.float32, 10)
            for make in (gradwise.AdamW, lambda p, **kw: torch.optim.AdamW(p, foreach=False, **kw))]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(*runs))


@pytest.mark.parametrize("name, options", [ADAM[1], SGD[1]], ids=str)
def test_fused_true_is_torchs_fused_step_and_compiles_nothing(name, options):
    """torch's ``fused=True`` runs torch's fused kernel on CPU float parameters, as torch.optim does,
    instead of compiling a graph (bit for bit in float64, at any size)."""
    made = []
    _assert_same(*_trajectories(name, options, torch.float64, made=made, fused=True))
    assert made[0].compile is True and made[0].torch_kernels
    assert made[0].compile_stats["compiles"] == 0


@pytest.mark.slow
def test_fused_true_compiles_the_step_where_no_kernel_takes_the_parameters():
    """A bfloat16 parameter is none of torch's fused CPU kernels' (nor of gradwise's ``compile="auto"``
    kernel path): ``fused=True`` compiles its one-pass step, equal to the eager one."""
    params = [torch.linspace(-1, 1, 24, dtype=torch.bfloat16).view(4, 6).requires_grad_() for _ in range(2)]
    opts = [gradwise.AdamW([params[0]], lr=0.01, fused=True), gradwise.AdamW([params[1]], lr=0.01, compile=False)]
    for step in range(3):
        for p, opt in zip(params, opts):
            p.grad = torch.full_like(p, 0.5 - step)
            opt.step()
    assert opts[0].compile_stats["compiles"] >= 1
    assert torch.equal(params[0], params[1])


@pytest.mark.parametrize("name", ["Adam", "SGD"])
def test_a_0d_parameter_with_l2_decay_stays_in_its_dtype(name):
    """The bucket of a 0-d parameter keeps its numbers in float32: L2 decay's ``p wd`` on a 0-d float32
    tensor with a float64 number would be float64. Torch's fused step within a float32 rounding."""
    kwargs = dict(lr=0.01, weight_decay=0.1, **({"momentum": 0.9} if name == "SGD" else {}))
    params = [torch.tensor(0.5), torch.randn(3, 4, generator=torch.Generator().manual_seed(1))]
    runs = [run_bag(make, [p.clone().requires_grad_() for p in params], torch.float32, 20)
            for make in (lambda p: getattr(gradwise, name)(p, **kwargs),
                         lambda p: getattr(torch.optim, name)(p, fused=True, **kwargs))]
    for a, b in zip(*runs):
        for x, y in zip(a, b):
            assert x.dtype == torch.float32
            torch.testing.assert_close(x, y, rtol=2e-6, atol=2e-7)


@pytest.mark.slow
def test_a_group_added_later_is_weighed_for_the_kernel_again():
    """``fused=True`` runs torch's kernel while every parameter is a CPU float tensor; once a bfloat16 group is
    added the kernels no longer take them all, and the step compiles its graph as for any other parameters."""
    weight = torch.linspace(-1, 1, 12).view(4, 3).requires_grad_()
    optimizer = gradwise.AdamW([weight], lr=0.01, fused=True)
    weight.grad = torch.full_like(weight, 0.5)
    optimizer.step()
    assert optimizer.compile_stats["compiles"] == 0
    half = torch.linspace(-1, 1, 10, dtype=torch.bfloat16).view(5, 2).requires_grad_()
    optimizer.add_param_group({"params": [half]})
    half.grad = torch.full_like(half, 0.25)
    optimizer.step()
    assert optimizer.compile_stats["compiles"] >= 1
