"""The modifiers on Lion's and Muon's chains: ``spam`` and ``mars_correction`` against a float64 reference written
from the papers (SPAM, arXiv:2501.06842; MARS, arXiv:2411.10438; Lion; Muon), and MARS-Lion against
pytorch-optimizer 4.1.0's ``MARS(mars_type="lion")``. ``cautious`` on both: tests/test_cautious.py."""
from __future__ import annotations

import math

import pytest
import torch

from gradwise import Optimizer, chain
from gradwise.transforms import (
    add_decayed_weights,
    mars_correction,
    orthogonalize_by_newton_schulz,
    scale_by_learning_rate,
    scale_by_lion,
    scale_by_shape,
    spam,
    trace_ema,
)
from gradwise.transforms.newton_schulz import MUON_COEFFICIENTS
from tests.models import bag_of_tensors
from tests.registry import _pytorch_optimizer
from tests.test_parity import _clone, assert_trajectories_close, run_bag

STEPS = 25
SPAM = dict(update_proj_gap=7, warmup_epoch=3, threshold=1.5, grad_accu_steps=2, spike_beta=0.9)


def newton_schulz5(x, eps=1e-7):
    """Muon's quintic iteration, five times, on the wide orientation of x."""
    a, b, c = MUON_COEFFICIENTS
    tall = x.shape[0] > x.shape[1]
    x = x.mT if tall else x
    x = x / max(float(x.norm()), eps)
    for _ in range(5):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x) * math.sqrt(max(1.0, x.shape[1] / x.shape[0]) if tall else 1.0)


class Modified(torch.optim.Optimizer):
    """Lion (b1, b2 = ``betas``) or Muon (mu = ``momentum``, Nesterov) in float64, with optionally MARS's corrected
    gradient c = g + gamma b1 / (1 - b1) (g - g_prev) over max(||c||, 1) (b1: Lion's beta1, Muon's mu) and SPAM's
    reset of every moment when t mod T = 0, its clip g <- sign(g) sqrt(theta v) where g^2 > theta v once
    t mod T >= A (v <- b v + (1-b) g^2 of the clipped g) and its cosine warmup of the step over N steps after a
    reset; p <- p - lr (s_t u + wd p)."""

    def __init__(self, params, core, lr, weight_decay, betas=(0.9, 0.99), momentum=0.95, gamma=None, spam=None):
        self.core, self.gamma, self.spam = core, gamma, spam
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas, momentum=momentum))

    def scale(self, t):
        s = self.spam
        j = t % s["update_proj_gap"]
        if t < s["update_proj_gap"] or j >= s["warmup_epoch"]:
            return 1.0
        return 1.0 - 0.99 * (1.0 + math.cos(math.pi * (j + 1) / (s["warmup_epoch"] + 1))) / 2.0

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            (b1, b2), mu = group["betas"], group["momentum"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p), last=torch.zeros_like(p))
                state["t"] += 1
                t, g = state["t"], p.grad.clone()
                if self.gamma is not None:
                    beta = b1 if self.core == "lion" else mu
                    c = g + self.gamma * beta / (1 - beta) * (g - state["last"])
                    state["last"], g = g, c / max(float(c.norm()), 1.0)
                if self.spam is not None:
                    s = self.spam
                    if t % s["update_proj_gap"] == 0:
                        state["m"], state["v"] = torch.zeros_like(p), torch.zeros_like(p)
                    limit = s["threshold"] * state["v"]
                    if t % s["update_proj_gap"] >= s["grad_accu_steps"]:
                        g = torch.where(g * g > limit, g.sign() * limit.sqrt(), g)
                    state["v"] = s["spike_beta"] * state["v"] + (1 - s["spike_beta"]) * g * g
                if self.core == "lion":
                    u = (b1 * state["m"] + (1 - b1) * g).sign()
                    state["m"] = b2 * state["m"] + (1 - b2) * g
                else:
                    state["m"] = mu * state["m"] + (1 - mu) * g
                    u = newton_schulz5((1 - mu) * g + mu * state["m"])
                s_t = self.scale(t) if self.spam is not None else 1.0
                p -= group["lr"] * (s_t * u + group["weight_decay"] * p)


def _lion(modifier):
    return chain(*modifier(scale_by_lion()), add_decayed_weights(), scale_by_learning_rate())


def _muon(modifier):
    return chain(*modifier(chain(trace_ema(), orthogonalize_by_newton_schulz())), scale_by_shape(),
                 add_decayed_weights(), scale_by_learning_rate())


MODIFIERS = {"spam": (lambda core: (spam(core),), dict(spam=SPAM), SPAM),
             "mars": (lambda core: (mars_correction(), core), dict(gamma=0.05), dict(gamma=0.05))}


def _matrices():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in ((8, 16), (12, 4), (5, 3))]


@pytest.mark.parametrize("core", ["lion", "muon"])
@pytest.mark.parametrize("modifier", sorted(MODIFIERS))
def test_matches_a_float64_reference(modifier, core):
    make, reference, hyper = MODIFIERS[modifier]
    params = bag_of_tensors(torch.float64) if core == "lion" else _matrices()
    kwargs = dict(lr=0.01, weight_decay=0.1)
    if core == "lion":
        transform, theirs_own = _lion(make), dict(betas=(0.9, 0.99))
        own = theirs_own
    else:
        transform, theirs_own = _muon(make), dict(momentum=0.9)
        own = dict(theirs_own, ns_dtype=torch.float64)
    ours = run_bag(lambda p: Optimizer(p, transform, compile=False, **kwargs, **own, **hyper), _clone(params),
                   torch.float64, STEPS)
    theirs = run_bag(lambda p: Modified(p, core, **kwargs, **theirs_own, **reference), _clone(params), torch.float64,
                     STEPS)
    assert_trajectories_close(ours, theirs, torch.float64)
    plain = run_bag(lambda p: Modified(p, core, **kwargs, **theirs_own), _clone(params), torch.float64, STEPS)
    assert max((a - b).abs().max() for a, b in zip(ours[-1], plain[-1]) if a.numel()) > 1e-3, "the modifier acted"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_mars_lion_matches_pytorch_optimizer(dtype):
    """pytorch-optimizer's MARS-Lion steps by sign(m), m <- b1 m + (1-b1) c: Lion with beta2 = beta1."""
    params = [p for p in bag_of_tensors(dtype) if p.dim() >= 2]
    kwargs = dict(lr=0.01, gamma=0.05, weight_decay=0.1)
    ours = run_bag(lambda p: Optimizer(p, _lion(MODIFIERS["mars"][0]), compile=False, betas=(0.9, 0.9), **kwargs),
                   _clone(params), dtype, STEPS)
    theirs = run_bag(lambda p: _pytorch_optimizer("MARS")(p, mars_type="lion", betas=(0.9, 0.99), **kwargs),
                     _clone(params), dtype, STEPS, reference=True)
    assert_trajectories_close(ours, theirs, dtype)
