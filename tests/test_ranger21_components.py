"""Each Ranger21 component, alone in a chain, equals its paper's formula (float64, 100 steps); the
formulas themselves agree with the ranger21 package's functions."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise import chain, scale_by_learning_rate, schedules
from gradwise.transforms.gradient_shaping import centralize_gradient, clip_by_agc, normalize_gradient, unit_norm
from gradwise.transforms.learning_rate import scale_by_schedule
from gradwise.transforms.pnm import scale_by_pnm_adam
from gradwise.transforms.regularizers import add_norm_loss, add_stable_weight_decay, shrink_like_ranger21
from tests.models import bag_of_tensors
from tests.references import ranger21_components as ref
from tests.test_parity import _clone, _random_grads

STEPS = 100
LR = 0.01
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-6)}


def _compare(transform, hyper, reference, dtype=torch.float64, steps=STEPS, compile=False, scale=1.0):
    """Run ``chain(transform, lr)`` and ``p <- p - lr * reference(i, p, g)`` side by side."""
    params = bag_of_tensors(dtype)
    ours, theirs = _clone(params), [p.detach().clone() for p in params]
    optimizer = gradwise.Optimizer(ours, chain(transform, scale_by_learning_rate()), compile=compile, lr=LR, **hyper)
    for step in range(steps):
        grads = [g * scale for g in _random_grads(params, step)]
        for p, g in zip(ours, grads):
            p.grad = g
        optimizer.step()
        for i, (p, g) in enumerate(zip(theirs, grads)):
            p -= LR * reference(i, p.double(), g.double()).to(dtype)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            torch.testing.assert_close(a.detach(), b, **TOL[dtype], msg=lambda m: f"step {step} tensor {i}: {m}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_agc_alone(dtype):
    # gradients about as large as the clip threshold: on each step some units clip and others do not
    _compare(clip_by_agc(), dict(agc_clipping_value=0.5, agc_eps=1e-3),
             lambda i, p, g: ref.agc(p, g, 0.5, 1e-3), dtype, scale=0.5)


@pytest.mark.parametrize("conv_only", [False, True])
def test_gradient_centralization_alone(conv_only):
    _compare(centralize_gradient(), dict(gc_conv_only=conv_only), lambda i, p, g: ref.centralize(g, conv_only))


def test_gradient_normalization_alone():
    _compare(normalize_gradient(), {}, lambda i, p, g: ref.normalize(g), scale=0.01)


def test_norm_loss_alone():
    _compare(add_norm_loss(), dict(normloss_factor=0.05, eps=1e-8),
             lambda i, p, g: g + ref.norm_loss_term(p, 0.05, 1e-8))


def _second_moment_mean(moments, grads, step, b2=0.999):
    """Update each v with its gradient and return the mean of v / (1 - b2^t) over every element."""
    for v, g in zip(moments, grads):
        v.mul_(b2).add_(g * g * (1 - b2))
    total = sum(float((v / (1 - b2**step)).sum()) for v in moments)
    return total / sum(v.numel() for v in moments)


def test_stable_weight_decay_alone():
    """n is the square root of the mean second moment over every parameter, a reduction of the step."""
    from gradwise.transforms.regularizers import trace_second_moment

    params = bag_of_tensors(torch.float64)
    ours, theirs = _clone(params), [p.detach().clone() for p in params]
    optimizer = gradwise.Optimizer(ours, chain(trace_second_moment(), add_stable_weight_decay(),
                                               scale_by_learning_rate()), compile=False, lr=LR, weight_decay=0.1)
    moments = [torch.zeros_like(p) for p in theirs]
    for step in range(1, STEPS + 1):
        grads = _random_grads(params, step)
        for p, g in zip(ours, grads):
            p.grad = g
        optimizer.step()
        n = _second_moment_mean(moments, grads, step) ** 0.5
        for p, g in zip(theirs, grads):
            p -= LR * (g + p * (0.1 / n))
        for i, (a, b) in enumerate(zip(ours, theirs)):
            torch.testing.assert_close(a.detach(), b, **TOL[torch.float64],
                                       msg=lambda m: f"step {step} tensor {i}: {m}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("beta0, softplus", [(1.0, True), (0.9, False)])
def test_positive_negative_momentum_alone(beta0, softplus, dtype):
    pnm = {}

    def reference(i, p, g):
        if i not in pnm:
            pnm[i] = ref.PNMAdam(g, (0.9, 0.99), 1e-8, beta0, 50.0 if softplus else None)
        return pnm[i].direction(g, g)

    _compare(scale_by_pnm_adam(), dict(betas=(0.9, 0.99), eps=1e-8, pnm_momentum_factor=beta0, softplus=softplus,
                                       beta_softplus=50.0), reference, dtype)


def test_pnm_with_ranger21s_second_centralization_and_normalization():
    pnm = {}

    def reference(i, p, g):
        if i not in pnm:
            pnm[i] = ref.PNMAdam(g, (0.9, 0.999), 1e-8, 1.0, 50.0)
        return pnm[i].direction(g, ref.normalize(ref.centralize(g)))

    _compare(scale_by_pnm_adam(recentralize=True, renormalize=True), {}, reference, scale=0.05)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("reshape", [False, True])
def test_pnm_with_adabeliefs_second_moment(reshape, dtype):
    pnm = {}

    def reference(i, p, g):
        if i not in pnm:
            pnm[i] = ref.PNMAdam(g, (0.9, 0.99), 1e-8, 0.9, 50.0, belief=True)
        return pnm[i].direction(g, ref.normalize(ref.centralize(g)) if reshape else g)

    _compare(scale_by_pnm_adam(recentralize=reshape, renormalize=reshape, belief=True),
             dict(betas=(0.9, 0.99), pnm_momentum_factor=0.9), reference, dtype, scale=0.05)


def test_warmup_and_warmdown_inside_a_chain():
    schedule = schedules.ranger21_schedule(100, warmup_steps=20, warmdown_steps=28, min_factor=0.1)
    step = {"t": {}}

    def reference(i, p, g):
        t = step["t"][i] = step["t"].get(i, -1) + 1
        return g * schedule(t)

    _compare(scale_by_schedule(schedule), {}, reference)


@pytest.mark.slow
@pytest.mark.parametrize("transform, hyper", [
    (clip_by_agc(), dict(agc_clipping_value=0.5)), (centralize_gradient(), {}), (normalize_gradient(), {}),
    (add_norm_loss(), dict(normloss_factor=0.05)),
    (scale_by_pnm_adam(recentralize=True, renormalize=True), {}),
], ids=lambda x: type(x).__name__ if not isinstance(x, dict) else "")
def test_compiled_equals_eager(transform, hyper):
    params = bag_of_tensors(torch.float32)
    runs = []
    for compile in (True, False):
        ps = _clone(params)
        opt = gradwise.Optimizer(ps, chain(transform, scale_by_learning_rate()), compile=compile, lr=LR, **hyper)
        for step in range(6):
            for p, g in zip(ps, _random_grads(params, step)):
                p.grad = g.t().contiguous().t() if not p.is_contiguous() else g
            opt.step()
        runs.append([p.detach() for p in ps])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_non_elementwise_components_say_so():
    for t in (clip_by_agc(), centralize_gradient(), normalize_gradient(), add_norm_loss(),
              scale_by_pnm_adam(recentralize=True, renormalize=True)):
        assert t.elementwise is False, t
    assert scale_by_pnm_adam().elementwise and add_stable_weight_decay().elementwise
    # renormalizing alone is a factor per tensor, found by prepare() on the whole input
    renormalized = scale_by_pnm_adam(renormalize=True)
    assert renormalized.elementwise and renormalized.prepares and not scale_by_pnm_adam().prepares


def test_paper_formulas_agree_with_the_ranger21_package():
    r21 = pytest.importorskip("ranger21.ranger21")
    gen = torch.Generator().manual_seed(0)
    for shape in [(7,), (5, 3), (2, 3, 4), (2, 3, 4, 5), (2, 2, 2, 2, 3)]:
        p = torch.randn(shape, generator=gen, dtype=torch.float64)
        g = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3
        torch.testing.assert_close(ref.centralize(g), r21.centralize_gradient(g.clone()), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ref.normalize(g), r21.normalize_gradient(g.clone()), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(unit_norm(p), r21.Ranger21.unit_norm(None, p), rtol=1e-12, atol=1e-12)
        holder = torch.nn.Parameter(p.clone())
        holder.grad = g.clone()
        package = r21.Ranger21.__new__(r21.Ranger21)
        package.agc_clip_val, package.agc_eps = 0.5, 1e-3
        r21.Ranger21.agc(package, holder)
        torch.testing.assert_close(ref.agc(p, g, 0.5, 1e-3), holder.grad, rtol=1e-12, atol=1e-12)


def test_shrink_like_ranger21_decays_then_applies_norm_loss_at_the_decayed_point():
    from gradwise.transforms.regularizers import trace_second_moment

    schedule = schedules.warmup(10) + schedules.constant(200)
    wd, factor, eps = 0.5, 0.05, 1e-8
    params = bag_of_tensors(torch.float64)
    ours, theirs = _clone(params), [p.detach().clone() for p in params]
    optimizer = gradwise.Optimizer(ours, chain(trace_second_moment(), scale_by_learning_rate(),
                                               shrink_like_ranger21(schedule)), compile=False,
                                   lr=LR, weight_decay=wd, normloss_factor=factor, eps=eps)
    moments = [torch.zeros_like(p) for p in theirs]
    count = sum(p.numel() for p in theirs)
    for step in range(STEPS):
        grads = _random_grads(params, step)
        for p, g in zip(ours, grads):
            p.grad = g
        optimizer.step()
        lr_t = LR * schedule(step)
        normalizer = ((1 + _second_moment_mean(moments, grads, step + 1) * count) / count) ** 0.5
        for p, g in zip(theirs, grads):
            p *= 1 - lr_t * wd / normalizer
            p -= lr_t * ref.norm_loss_term(p, factor, eps)
            p -= LR * g
        for i, (a, b) in enumerate(zip(ours, theirs)):
            torch.testing.assert_close(a.detach(), b, **TOL[torch.float64],
                                       msg=lambda m: f"step {step} tensor {i}: {m}")
