"""Lookahead around any recipe equals the paper's algorithm around the torch optimizer, step by step."""
from __future__ import annotations

import pytest
import torch

import gradwise
from tests.models import bag_of_tensors
from tests.references.lookahead import ReferenceLookahead
from tests.test_parity import _clone, assert_trajectories_close, run_bag, run_mlp

STEPS = 100


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("k, alpha", [(5, 0.5), (3, 0.8), (1, 1.0)])
def test_lookahead_adamw_matches_the_paper(k, alpha, dtype):
    kwargs = dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    params = bag_of_tensors(dtype)
    ours = run_bag(lambda p: gradwise.Lookahead(gradwise.AdamW(p, compile=False, **kwargs), k=k, alpha=alpha),
                   _clone(params), dtype, STEPS)
    theirs = run_bag(lambda p: ReferenceLookahead(torch.optim.AdamW(p, **kwargs), k, alpha), _clone(params), dtype,
                     STEPS, reference=True)
    assert_trajectories_close(ours, theirs, dtype)


def test_lookahead_sgd_trains_an_mlp_like_the_paper():
    kwargs = dict(lr=0.05, momentum=0.9)
    ours = run_mlp(lambda p: gradwise.Lookahead(gradwise.SGD(p, compile=False, **kwargs), k=4, alpha=0.5),
                   torch.float64, STEPS)
    theirs = run_mlp(lambda p: ReferenceLookahead(torch.optim.SGD(p, **kwargs), 4, 0.5), torch.float64, STEPS,
                     reference=True)
    assert_trajectories_close(ours, theirs, torch.float64)


@pytest.mark.slow
def test_lookahead_compiled_equals_eager():
    params = bag_of_tensors(torch.float32)

    def make(compile):
        return lambda p: gradwise.Lookahead(gradwise.AdamW(p, lr=0.01, compile=compile), k=3, alpha=0.5)

    compiled = run_bag(make(True), _clone(params), torch.float32, 12)
    eager = run_bag(make(False), _clone(params), torch.float32, 12)
    assert_trajectories_close(compiled, eager, torch.float32, rtol=1e-6, atol=1e-7)


def test_lookahead_checkpoint_resumes_exactly():
    params = bag_of_tensors(torch.float64)
    a = _clone(params)
    opt = gradwise.Lookahead(gradwise.AdamW(a, lr=0.01, compile=False), k=4, alpha=0.5)
    full = run_bag(lambda p: opt, a, torch.float64, 10)
    b = _clone(params)
    first = gradwise.Lookahead(gradwise.AdamW(b, lr=0.01, compile=False), k=4, alpha=0.5)
    run_bag(lambda p: first, b, torch.float64, 6)
    c = [t.detach().clone().requires_grad_() for t in b]
    second = gradwise.Lookahead(gradwise.AdamW(c, lr=0.01, compile=False), k=4, alpha=0.5)
    second.load_state_dict(first.state_dict())
    for step in range(6, 10):
        gen = torch.Generator().manual_seed(step)
        for p in c:
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.grad = p.grad.t().contiguous().t() if not p.is_contiguous() else p.grad
        second.step()
    assert all(torch.equal(x, y) for x, y in zip(c, full[-1]))


@pytest.mark.parametrize("kwargs, message", [
    (dict(k=0), "lookahead_k=0"), (dict(k=2.5), "lookahead_k=2.5"), (dict(alpha=1.5), "lookahead_alpha=1.5")])
def test_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gradwise.Lookahead(gradwise.AdamW([torch.nn.Parameter(torch.zeros(2))]), **kwargs)


def test_wrapping_a_stepped_optimizer_is_refused():
    p = torch.nn.Parameter(torch.zeros(2))
    inner = gradwise.AdamW([p], compile=False)
    p.grad = torch.ones(2)
    inner.step()
    with pytest.raises(ValueError, match="already stepped"):
        gradwise.Lookahead(inner)
    with pytest.raises(TypeError, match="gradwise Optimizer"):
        gradwise.Lookahead(torch.optim.AdamW([p]))


@pytest.mark.parametrize("recipe, kwargs", [(gradwise.LOMO, dict(lr=0.05, weight_decay=0.01)),
                                            (gradwise.AdaLomo, dict(lr=0.01))], ids=["LOMO", "AdaLomo"])
def test_lookahead_around_an_update_in_backward_matches_the_paper(recipe, kwargs):
    """The inner optimizer's backward hooks move to the Lookahead optimizer, so the slow weights are
    taken inside backward too; the reference wraps the same recipe stepping after backward."""
    ours = run_mlp(lambda p: gradwise.Lookahead(recipe(p, compile=False, **kwargs), k=3, alpha=0.5),
                   torch.float64, 12)
    theirs = run_mlp(lambda p: ReferenceLookahead(recipe(p, compile=False, fused_backward=False, **kwargs), 3, 0.5),
                     torch.float64, 12)
    assert_trajectories_close(ours, theirs, torch.float64)


def test_lookahead_takes_over_hooks_installed_by_hand():
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    inner = gradwise.SGD([p], lr=0.1, compile=False)
    gradwise.fused_backward(inner)
    wrapped = gradwise.Lookahead(inner, k=2, alpha=0.5)
    for _ in range(2):
        (p * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    # two SGD steps of -0.1 g, then half way back: 1 - 0.1 g
    torch.testing.assert_close(p.detach(), torch.tensor([0.9, 0.8, 0.7], dtype=torch.float64))
    assert p.grad is None and int(wrapped.state[p]["step"]) == 2
    wrapped.fused_backward.remove()


def test_lookahead_around_ranger21_without_its_own_is_ranger21_with_it():
    """Ranger21 is a plain chain: Lookahead around it (its own turned off) is the chain with Lookahead last,
    which is Ranger21 with its own; around Ranger21 with its own it is refused, naming its options."""
    p = [torch.nn.Parameter(torch.zeros(2, 2))]
    with pytest.raises(ValueError, match=r"already has Lookahead.*lookahead_mergetime=k"):
        gradwise.Lookahead(gradwise.Ranger21(p, lr=1e-3, num_iterations=10))
    runs = []
    for make in (lambda ps: gradwise.Lookahead(gradwise.Ranger21(ps, lr=1e-2, num_iterations=30, compile=False,
                                                                 lookahead_active=False), k=3, alpha=0.4),
                 lambda ps: gradwise.Ranger21(ps, lr=1e-2, num_iterations=30, compile=False, lookahead_mergetime=3,
                                              lookahead_blending_alpha=0.4)):
        ps = [torch.nn.Parameter(torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4))]
        optimizer = make(ps)
        for step in range(10):
            ps[0].grad = torch.sin(ps[0].detach() * (step + 1))
            optimizer.step()
        runs.append(ps[0].detach())
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"already has Lookahead"):
        gradwise.Lookahead(gradwise.Lookahead(gradwise.AdamW(p)))
