"""compile="auto" | True | False: when the compiled path is used, and what happens when it cannot be."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise.core import stepping


class scale_by_data_dependent_sign(gradwise.Transform):  # noqa: N801
    """u <- u * sign(sum u): a Python branch on tensor data, which fullgraph compilation rejects."""

    name = "data_dependent"

    def update(self, updates, state, ctx):
        return [u if float(u.sum()) >= 0 else -u for u in updates]


def _params(n, numel, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ps = [torch.randn(numel + i, generator=gen).requires_grad_() for i in range(n)]
    for i, p in enumerate(ps):
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(100 + i))
    return ps


def test_auto_runs_small_models_eagerly():
    opt = gradwise.AdamW(_params(3, 10), lr=0.1)
    opt.step()
    assert opt.compile_stats["compiles"] == 0


@pytest.mark.slow
def test_auto_compiles_large_models():
    params = _params(1, stepping.AUTO_COMPILE_MIN_NUMEL)
    opt = gradwise.NAdamW(params, lr=0.1)
    opt.step()
    assert opt.compile_stats["compiles"] == 1 and opt.compile_stats["seconds"] > 0


@pytest.mark.parametrize("recipe", ["AdamW", "SGD"])
def test_auto_runs_torchs_fused_kernel_on_large_cpu_models_compiling_nothing(recipe):
    """A step that ends in torch's fused kernel (Adam's, SGD's) runs it eagerly on CPU float parameters of any
    size: torch.optim's ``fused=True`` step, bit for bit in float64 (``test_torch_kernels.py``), nothing compiled."""
    params = [p.detach().double().requires_grad_() for p in _params(1, stepping.AUTO_COMPILE_MIN_NUMEL)]
    theirs = [p.detach().clone().requires_grad_() for p in params]
    kwargs = dict(lr=0.1, momentum=0.9) if recipe == "SGD" else dict(lr=0.1)
    opts = [getattr(gradwise, recipe)(params, **kwargs), getattr(torch.optim, recipe)(theirs, fused=True, **kwargs)]
    for step in range(3):
        for p, q in zip(params, theirs):
            p.grad = q.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(step), dtype=p.dtype)
        for opt in opts:
            opt.step()
    assert opts[0].compile_stats["compiles"] == 0
    assert all(torch.equal(p, q) for p, q in zip(params, theirs))


@pytest.mark.slow
def test_auto_compiles_a_large_adamw_whose_parameters_the_kernel_does_not_take():
    """bfloat16 parameters (float32 updates, written with rounding): the compiled step, as before."""
    params = [p.detach().bfloat16().requires_grad_() for p in _params(1, stepping.AUTO_COMPILE_MIN_NUMEL)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = gradwise.AdamW(params, lr=0.1)
    opt.step()
    assert opt.compile_stats["compiles"] == 1


def _chain():
    return gradwise.chain(scale_by_data_dependent_sign(), gradwise.scale_by_learning_rate())


@pytest.mark.slow
def test_compile_true_raises_when_the_chain_cannot_compile():
    params = _params(3, 10)
    before = [p.detach().clone() for p in params]
    opt = gradwise.Optimizer(params, _chain(), lr=0.1, compile=True)
    with pytest.raises(Exception, match="(?i)data-dependent|unsupported|graph break"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, params)), "a failed compile changed parameters"


@pytest.mark.slow
def test_auto_falls_back_to_eager_once_and_steps_every_parameter_once(monkeypatch):
    monkeypatch.setattr(stepping, "AUTO_COMPILE_MIN_NUMEL", 0)
    params, reference = _params(11, 10), _params(11, 10)
    opt = gradwise.Optimizer(params, _chain(), lr=0.1)
    eager = gradwise.Optimizer(reference, _chain(), lr=0.1, compile=False)
    with pytest.warns(UserWarning, match="torch.compile failed"):
        opt.step()
    eager.step()
    assert all(torch.equal(a, b) for a, b in zip(params, reference))
    opt.step()  # from now on eager, without another warning
    eager.step()
    assert all(torch.equal(a, b) for a, b in zip(params, reference))


@pytest.mark.slow
def test_failed_compiled_step_changes_no_state():
    """compile=True and a chain that cannot compile: the step raises and leaves params and state as they were."""
    params = _params(11, 10)
    chain = gradwise.chain(gradwise.scale_by_nadam(), scale_by_data_dependent_sign(), gradwise.scale_by_learning_rate())
    eager = gradwise.Optimizer(params, chain, lr=0.1, compile=False)
    eager.step()  # some state to keep: step counters, moments, NAdam's running product
    opt = gradwise.Optimizer(params, chain, lr=0.1, compile=True)
    opt.load_state_dict(eager.state_dict())
    before = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in params}
    values = [p.detach().clone() for p in params]
    with pytest.raises(Exception, match="(?i)data-dependent|unsupported|graph break"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(values, params))
    for p in params:
        assert set(opt.state[p]) == set(before[id(p)])
        for k, v in opt.state[p].items():
            assert torch.equal(v, before[id(p)][k]), k
