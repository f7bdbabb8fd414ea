"""SPAM against pytorch-optimizer 4.1.0 in the configurations the registry's one leaves out, its warmup against
the package's cosine, what each of its parts changes, and bad input (the registry's generic tests cover resume,
compile, state formats, FSDP2)."""
from __future__ import annotations

import math

import pytest
import torch

import gradwise
from gradwise import Optimizer, chain
from gradwise.transforms import clip_by_global_norm, scale_by_learning_rate, scale_by_nadam, spam
from gradwise.transforms.spam import warmup_scale
from tests.models import bag_of_tensors, sin_loss
from tests.registry import _pytorch_optimizer
from tests.test_parity import _clone, assert_trajectories_close, run_bag

STEPS = 30
#: resets at steps 8, 16, 24, clipping from 2 steps after each, a 3-step warmup: the registry's configuration
CLIPPED = dict(lr=0.01, weight_decay=0.1, update_proj_gap=8, warmup_epoch=3, grad_accu_steps=2, threshold=2.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("kwargs", [
    dict(lr=0.01, betas=(0.8, 0.99)),  # the defaults: clipping from step 20, no reset within 30 steps
    dict(lr=0.01, update_proj_gap=10, warmup_epoch=15, grad_accu_steps=3, threshold=0),  # warmup beyond the gap
    dict(lr=0.01, update_proj_gap=6, warmup_epoch=2, grad_accu_steps=4, threshold=1.5, eps=1e-3),
], ids=["defaults", "long-warmup", "short-gap"])
def test_matches_pytorch_optimizer(kwargs, dtype):
    params = bag_of_tensors(dtype)
    ours = run_bag(lambda p: gradwise.SPAM(p, compile=False, **kwargs), _clone(params), dtype, STEPS)
    theirs = run_bag(lambda p: _pytorch_optimizer("SPAM")(p, **kwargs), _clone(params), dtype, STEPS, reference=True)
    assert_trajectories_close(ours, theirs, dtype)


@pytest.mark.parametrize("gap, warmup", [(8, 3), (10, 15), (1, 4), (5, 0)])
def test_warmup_follows_the_packages_cosine(gap, warmup):
    """pytorch-optimizer's factor, 1 - CosineDecay(0.99, warmup).get_death_rate(steps since the reset), read off
    its optimizer's ``current_step`` counter, which a reset sets to 0."""
    from pytorch_optimizer.optimizer.spam import SPAM, CosineDecay

    p = torch.zeros(2, requires_grad=True)
    reference = SPAM([p], warmup_epoch=warmup, update_proj_gap=gap)
    decay = CosineDecay(0.99, warmup)
    for step in range(1, 40):
        if reference.state["current_step"] == 0:
            decay = CosineDecay(0.99, warmup)
        theirs = 1.0 - decay.get_death_rate(reference.state["current_step"])
        assert warmup_scale(step, gap, warmup) == pytest.approx(theirs, rel=1e-14, abs=1e-15), step
        p.grad = torch.ones(2)
        reference.step()


def _trajectory(**kwargs):
    params = bag_of_tensors(torch.float64)
    return run_bag(lambda p: gradwise.SPAM(p, compile=False, **{**CLIPPED, **kwargs}), _clone(params),
                   torch.float64, STEPS)[-1]


def test_each_part_changes_the_trajectory():
    """The registry's configuration clips, resets and warms up: without each, the trajectory is another."""
    full = _trajectory()
    for change in (dict(threshold=0), dict(update_proj_gap=1000), dict(warmup_epoch=0)):
        other = _trajectory(**change)
        assert max((a - b).abs().max() for a, b in zip(full, other) if a.numel()) > 1e-4, change


def test_a_reset_zeroes_the_moments_before_the_step():
    p = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    optimizer = gradwise.SPAM([p], lr=0.1, betas=(0.5, 0.9), update_proj_gap=3, threshold=0, compile=False)
    for step in range(1, 4):
        p.grad = torch.full((4,), float(step), dtype=torch.float64)
        optimizer.step()
    state = optimizer.state[p]
    torch.testing.assert_close(state["spam.adam.exp_avg"], 0.5 * p.grad, rtol=1e-15, atol=0)
    torch.testing.assert_close(state["spam.adam.exp_avg_sq"], 0.1 * p.grad * p.grad, rtol=1e-15, atol=0)


def test_spikes_are_clipped_to_the_threshold_of_the_second_moment():
    """After a steady gradient 1 (v = 1 - b2^t), a spike of 100 with theta = 4 enters as sqrt(4 v)."""
    p = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    optimizer = gradwise.SPAM([p], lr=0.1, betas=(0.0, 0.5), threshold=4.0, grad_accu_steps=2, compile=False)
    for grad in ([1.0, 1.0], [1.0, 1.0], [100.0, -1.0]):
        p.grad = torch.tensor(grad, dtype=torch.float64)
        optimizer.step()
    v_before = 0.75  # 1 - 0.5^2
    clipped = (4 * v_before) ** 0.5
    torch.testing.assert_close(optimizer.state[p]["spam.adam.exp_avg"], torch.tensor([clipped, -1.0],
                               dtype=torch.float64), rtol=1e-15, atol=0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(density=0.0), r"invalid density=0\.0: expected a number in \(0, 1\] \(the masked fraction of each matrix"),
    (dict(update_proj_gap=0), r"invalid update_proj_gap=0: expected an integer >= 1"),
    (dict(warmup_epoch=2.5), r"invalid warmup_epoch=2\.5: expected an integer >= 0"),
    (dict(threshold=-1), r"invalid threshold=-1: expected a finite number >= 0"),
    (dict(grad_accu_steps=-1), r"invalid grad_accu_steps=-1: expected an integer >= 0"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gradwise.SPAM([torch.zeros(3, requires_grad=True)], **kwargs)


def _masked_reference(params, kw, steps):
    """SPAM (AdamW) with sparse masks, in float64: per matrix i, period j = t // T, the mask of ``spam``'s docstring;
    moments of the masked gradient, reset at t = 0 mod T; the step only where the mask is 1."""
    from gradwise.core.hashing import hash32, unsigned

    b1, b2 = kw.get("betas", (0.9, 0.999))
    gap, theta, accumulate = kw["update_proj_gap"], kw["threshold"], kw["grad_accu_steps"]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t in range(1, steps + 1):
        leaves = [p.detach().requires_grad_() for p in params]
        grads = torch.autograd.grad(sin_loss(leaves, t - 1), leaves)
        params = [p.detach() for p in leaves]
        for i, (p, g) in enumerate(zip(params, grads)):
            seed = hash32(torch.tensor(i + 1), torch.tensor(t // gap))
            mask = (unsigned(hash32(torch.arange(p.numel()).view(p.shape), seed)) < kw["density"] * 2.0**32).double() \
                if p.dim() == 2 else torch.ones_like(p)
            if t % gap == 0:
                m[i].zero_(), v[i].zero_()
            g = g * mask
            if t % gap >= accumulate:
                g = torch.where(g * g > theta * v[i], g.sign() * (theta * v[i]).sqrt(), g)
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            u = m[i] / (v[i].sqrt() + kw.get("eps", 1e-6)) * math.sqrt(1 - b2**t) / (1 - b1**t)
            p -= warmup_scale(t, gap, kw["warmup_epoch"]) * kw["lr"] * u * mask
            p *= 1 - kw["lr"] * kw.get("weight_decay", 0.0)
    return params


def test_sparse_masks_match_a_reference():
    kwargs = {**CLIPPED, "density": 0.4}
    ours = bag_of_tensors(torch.float64)
    theirs = _masked_reference([p.detach().clone() for p in ours], kwargs, STEPS)
    start = [p.detach().clone() for p in ours]
    optimizer = gradwise.SPAM(ours, compile=False, **{**kwargs, "weight_decay": 0.0})
    for step in range(3):  # without decay, a masked-out entry of a matrix stays where it was
        optimizer.zero_grad()
        sin_loss(ours, step).backward()
        optimizer.step()
    fixed = (ours[2].detach() == start[2]).double().mean()
    assert 0.3 < fixed < 0.9, fixed
    ours = bag_of_tensors(torch.float64)
    optimizer = gradwise.SPAM(ours, compile=False, **kwargs)
    for step in range(STEPS):
        optimizer.zero_grad()
        sin_loss(ours, step).backward()
        optimizer.step()
    for i, (a, b) in enumerate(zip(ours, theirs)):
        torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-10, msg=lambda m, i=i: f"{i}: {m}")


def test_sparse_masks_resume_exactly_across_a_reset():
    kwargs = {**CLIPPED, "density": 0.4}

    def steps(params, optimizer, start, stop):
        for step in range(start, stop):
            optimizer.zero_grad()
            sin_loss(params, step).backward()
            optimizer.step()
        return optimizer

    straight = bag_of_tensors(torch.float64)
    steps(straight, gradwise.SPAM(straight, compile=False, **kwargs), 0, 12)
    first = bag_of_tensors(torch.float64)
    saved = steps(first, gradwise.SPAM(first, compile=False, **kwargs), 0, 6).state_dict()
    resumed = [p.detach().clone().requires_grad_() for p in first]
    optimizer = gradwise.SPAM(resumed, compile=False, **kwargs)
    optimizer.load_state_dict(saved)
    steps(resumed, optimizer, 6, 12)
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))


def test_bad_inner_is_named():
    with pytest.raises(TypeError, match=r"spam\(\): inner=1\.0 must be a Transform"):
        spam(1.0)
    with pytest.raises(ValueError, match=r"spam\(\): inner=clip_by_global_norm\(\) reads statistics"):
        spam(clip_by_global_norm())


def test_an_inner_buffer_not_shaped_like_the_parameter_is_refused_before_anything_changes():
    p = torch.ones(3, requires_grad=True)
    optimizer = Optimizer([p], chain(spam(scale_by_nadam()), scale_by_learning_rate()), lr=0.1, compile=False)
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match=r"spam\(\): inner=scale_by_nadam\(\) keeps 'mu_product' of shape \(\)"):
        optimizer.step()
    assert torch.equal(p.detach(), torch.ones(3)) and not optimizer.state[p]


@pytest.mark.slow
def test_spam_around_lion_keeps_its_own_second_moment_compiled_as_eager():
    """Around a core without a second moment, the clip reads spam's own (``spike_exp_avg_sq``), compiled too."""
    from gradwise.transforms import add_decayed_weights, scale_by_lion

    def make(p, compile):
        transform = chain(spam(scale_by_lion()), add_decayed_weights(), scale_by_learning_rate())
        return Optimizer(p, transform, lr=0.01, weight_decay=0.1, compile=compile, update_proj_gap=5, warmup_epoch=2,
                         threshold=1.5, grad_accu_steps=2, spike_beta=0.9)

    params = [p for p in bag_of_tensors(torch.float32) if p.dim() <= 2]
    holder = []
    eager = run_bag(lambda p: make(p, False), _clone(params), torch.float32, 12)
    compiled = run_bag(lambda p: holder.append(make(p, True)) or holder[-1], _clone(params), torch.float32, 12)
    assert holder[0].compile_stats["compiles"] >= 1
    assert "spam.spike_exp_avg_sq" in holder[0].state[holder[0].param_groups[0]["params"][1]]
    assert_trajectories_close(compiled, eager, torch.float32)


def test_the_inner_chain_resolves_amsgrad_per_group():
    from gradwise.transforms import add_decayed_weights, scale_by_adam

    a, b = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
    transform = chain(spam(scale_by_adam()), add_decayed_weights(), scale_by_learning_rate())
    optimizer = Optimizer([{"params": [a], "amsgrad": True}, {"params": [b]}], transform, lr=0.1, compile=False)
    a.grad, b.grad = torch.ones(3), torch.ones(3)
    optimizer.step()
    assert "spam.max_exp_avg_sq" in optimizer.state[a] and "spam.max_exp_avg_sq" not in optimizer.state[b]
    assert torch.equal(a.detach(), b.detach()) and (a.detach() < 1).all()


@pytest.mark.slow
def test_sparse_masks_compiled_equal_eager():
    """density < 1 is not elementwise (the mask hashes each entry's index): the chain compiles per shape, each
    matrix its own mask seed, across a reset and its new masks (20 steps, resets at 8 and 16)."""
    gen = torch.Generator().manual_seed(4)
    params = [torch.randn(6, 5, generator=gen).requires_grad_(), torch.randn(6, 5, generator=gen).requires_grad_(),
              torch.randn(5, generator=gen).requires_grad_()]
    holder = []
    kwargs = {**CLIPPED, "density": 0.4, "weight_decay": 0.0}  # without decay, a masked-out entry stays
    compiled = run_bag(lambda p: holder.append(gradwise.SPAM(p, compile=True, **kwargs)) or holder[-1],
                       _clone(params), torch.float32, 20)
    eager = run_bag(lambda p: gradwise.SPAM(p, compile=False, **kwargs), _clone(params), torch.float32, 20)
    assert holder[0].compile_stats["compiles"] >= 1, "the compiled path did not compile"
    assert (compiled[2][0] == params[0]).any() and (compiled[2][0] != params[0]).any()
    assert_trajectories_close(compiled, eager, torch.float32, rtol=1e-6, atol=1e-7)
