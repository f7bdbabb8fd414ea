"""``cautious(inner)`` on the cores of AdamW, Lion, Muon and ADOPT: against pytorch-optimizer 4.1.0's
``cautious=True`` where it has one (Lion, Muon, ADOPT) and a float64 C-AdamW written from the paper;
resume, the per-group resolution of ``inner`` (AMSGrad), ``estimate`` and bad input."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise import Optimizer, chain
from gradwise.transforms import (
    add_decayed_weights,
    cautious,
    clip_by_global_norm,
    orthogonalize_by_newton_schulz,
    scale_by_adam,
    scale_by_adopt,
    scale_by_learning_rate,
    scale_by_lion,
    scale_by_shape,
    trace_ema,
)
from tests.models import bag_of_tensors
from tests.registry import _pytorch_optimizer
from tests.test_parity import _clone, assert_trajectories_close, run_bag

STEPS = 25


def _decayed(core):
    return chain(cautious(core), add_decayed_weights(), scale_by_learning_rate())


class CautiousAdamW(torch.optim.Optimizer):
    """C-AdamW, Liang et al. (2024), Algorithm 1 with the authors' rescale, in float64: u = m_hat / (sqrt(v_hat)
    + eps); phi = 1(u g > 0); p <- p - lr (u phi numel / (sum(phi) + 1) + wd p)."""

    def __init__(self, params, lr, betas, eps, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            (b1, b2), lr = group["betas"], group["lr"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                state["t"] += 1
                t, g = state["t"], p.grad
                state["m"] = b1 * state["m"] + (1 - b1) * g
                state["v"] = b2 * state["v"] + (1 - b2) * g * g
                u = (state["m"] / (1 - b1**t)) / ((state["v"] / (1 - b2**t)).sqrt() + group["eps"])
                phi = (u * g > 0).to(p.dtype)
                p -= lr * (u * phi * phi.numel() / (phi.sum() + 1) + group["weight_decay"] * p)


ADAMW = dict(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def test_cautious_adamw_matches_the_paper_in_float64():
    params = bag_of_tensors(torch.float64)
    ours = run_bag(lambda p: Optimizer(p, _decayed(scale_by_adam()), compile=False, **ADAMW), _clone(params),
                   torch.float64, STEPS)
    theirs = run_bag(lambda p: CautiousAdamW(p, **ADAMW), _clone(params), torch.float64, STEPS)
    assert_trajectories_close(ours, theirs, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name, core, kwargs", [
    ("Lion", scale_by_lion(), dict(lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)),
    ("ADOPT", scale_by_adopt(), dict(lr=0.01, betas=(0.9, 0.99), weight_decay=0.1, weight_decouple=True)),
], ids=["lion", "adopt"])
def test_matches_pytorch_optimizers_cautious(name, core, kwargs, dtype):
    params = bag_of_tensors(dtype)
    own = {k: v for k, v in kwargs.items() if k != "weight_decouple"}
    ours = run_bag(lambda p: Optimizer(p, _decayed(core), compile=False, **own), _clone(params), dtype, STEPS)
    theirs = run_bag(lambda p: _pytorch_optimizer(name, cautious=True)(p, **kwargs), _clone(params), dtype, STEPS,
                     reference=True)
    assert_trajectories_close(ours, theirs, dtype)


def test_cautious_muon_matches_pytorch_optimizers_to_its_bfloat16_rounding():
    """pytorch-optimizer's Muon masks its bfloat16 Newton-Schulz output in bfloat16 (ours in float32), so
    the two differ by a bfloat16 rounding of the update per step; nesterov=False, as with nesterov its mask
    compares with the Nesterov blend, which it writes into the gradient, not with the gradient."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).requires_grad_() for s in ((8, 16), (12, 4))]
    muon = chain(cautious(chain(trace_ema(), orthogonalize_by_newton_schulz())), scale_by_shape(),
                 add_decayed_weights(), scale_by_learning_rate())
    kwargs = dict(lr=0.02, weight_decay=0.1, nesterov=False)
    ours = run_bag(lambda p: Optimizer(p, muon, compile=False, momentum=0.95, **kwargs), _clone(params),
                   torch.float32, 20)
    theirs = run_bag(lambda p: _pytorch_optimizer("Muon", cautious=True)([dict(params=p, use_muon=True)], **kwargs),
                     _clone(params), torch.float32, 20)
    assert_trajectories_close(ours, theirs, torch.float32, rtol=0, atol=5e-4)  # parameters of size about 3
    plain = run_bag(lambda p: gradwise.Muon(p, lr=0.02, weight_decay=0.1, nesterov=False, compile=False),
                    _clone(params), torch.float32, 20)
    assert (plain[-1][0] - ours[-1][0]).abs().max() > 1e-2, "the mask changed the trajectory"


def _steps(optimizer, params, steps):
    for step in steps:
        gen = torch.Generator().manual_seed(step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()


def test_resumes_bit_identically_and_resolves_amsgrad_per_group():
    def make(p):
        return Optimizer([{"params": p[:3], "amsgrad": True}, {"params": p[3:]}], _decayed(scale_by_adam()),
                         compile=False, **ADAMW)

    params = bag_of_tensors(torch.float32)
    straight, interrupted = _clone(params), _clone(params)
    _steps(make(straight), straight, range(12))
    optimizer = make(interrupted)
    _steps(optimizer, interrupted, range(6))
    assert "cautious.max_exp_avg_sq" in optimizer.state[interrupted[0]]
    assert "cautious.max_exp_avg_sq" not in optimizer.state[interrupted[5]]
    resumed = make(interrupted)
    resumed.load_state_dict(optimizer.state_dict())
    _steps(resumed, interrupted, range(6, 12))
    assert all(torch.equal(a, b) for a, b in zip(straight, interrupted))


def test_estimate_counts_the_inner_state():
    model = torch.nn.Linear(64, 32)
    estimated = gradwise.estimate(model, lambda p, **kw: Optimizer(p, _decayed(scale_by_adam()), **kw))
    assert estimated.rows == gradwise.estimate(model, gradwise.AdamW).rows
    assert estimated.by("format")["fp32"] == 8 * (64 * 32 + 32)


def test_bad_inner_is_named():
    with pytest.raises(TypeError, match=r"cautious\(\): inner=1\.0 must be a Transform"):
        cautious(1.0)
    with pytest.raises(ValueError, match=r"cautious\(\): inner=clip_by_global_norm\(\) reads statistics"):
        cautious(clip_by_global_norm())
