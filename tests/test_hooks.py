"""One hook protocol: every composite (chain, route, project_low_rank, scale_by_apollo) forwards every
optional hook (seed, advance, set_mode, split_group) and every reduction (a guard's skip decision) to
the transforms it wraps that declare it, and a transform declares a hook by defining it."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise import (
    Optimizer,
    Transform,
    chain,
    lookahead,
    project_low_rank,
    route,
    scale_by_apollo,
    scale_by_learning_rate,
    scale_by_schedule_free,
    skip_nonfinite,
    trace,
)
from gradwise.core.transform import uses
from gradwise.transforms.adam import scale_by_adam_moments

HYPER = dict(lr=0.1, momentum=0.9, lookahead_k=2, rank=2, update_proj_gap=2)


def optimizer_for(ps, transform, **options):
    return Optimizer(ps, transform, **options, **{k: v for k, v in HYPER.items() if k in transform.hyper})


def by_dim(name, p):
    return "inner" if p.dim() == 2 else "other"


def params():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in [(4, 3), (3,), (3, 5)]]


def step(optimizer, ps, n=3, poison=None):
    for i in range(n):
        gen = torch.Generator().manual_seed(i)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        if poison is not None:
            ps[poison].grad[0] = float("nan")
        optimizer.step()


def schedule_free_sgd():
    return chain(scale_by_schedule_free("momentum"))


def lookahead_sgd():
    return chain(trace(), scale_by_learning_rate(), lookahead(evaluate_slow=True))


EVALUATED = {"schedule_free": schedule_free_sgd, "lookahead": lookahead_sgd}
WRAPS = {"as_is": lambda inner: inner,
         "after_galore": lambda inner: chain(project_low_rank(scale_by_adam_moments()), *inner.transforms),
         "after_apollo": lambda inner: chain(scale_by_apollo(scale_by_adam_moments()), *inner.transforms)}


@pytest.mark.parametrize("wrap", [*WRAPS, "as_is_under_skip_nonfinite"])
@pytest.mark.parametrize("evaluated", EVALUATED)
def test_eval_and_train_move_the_routed_parameters_as_without_route(evaluated, wrap):
    guarded = wrap.endswith("_under_skip_nonfinite")  # chain(skip_nonfinite(), route(...)): keys of the resolved chain
    transform = WRAPS[wrap.removesuffix("_under_skip_nonfinite")](EVALUATED[evaluated]())
    routed, alone = params(), params()
    matrices = [alone[0], alone[2]]
    ours = optimizer_for(routed, route(by_dim, inner=transform, other=chain(scale_by_learning_rate())),
                         skip_nonfinite=guarded)
    reference = optimizer_for(matrices, transform)
    step(ours, routed), step(reference, alone)
    for mode in ("eval", "train", "eval"):
        getattr(ours, mode)(), getattr(reference, mode)()
        assert torch.equal(routed[0], alone[0]) and torch.equal(routed[2], alone[2]), mode
    assert not torch.equal(alone[0], params()[0])


@pytest.mark.parametrize("evaluated", EVALUATED)
@pytest.mark.parametrize("projection", [project_low_rank, scale_by_apollo])
def test_a_projection_refuses_an_inner_chain_that_keeps_the_weights(projection, evaluated):
    # in the projected space there are no weights to copy (z, slow) nor a point to move in eval()
    with pytest.raises(ValueError, match=rf"{projection.__name__}\(\): inner=chain\(.*\) keeps a copy of the weights"):
        projection(EVALUATED[evaluated]())


@pytest.mark.parametrize("wrap", ["route", "galore", "apollo"])
def test_skip_nonfinite_inside_a_wrapper_skips_the_whole_step(wrap):
    guarded = chain(skip_nonfinite(), trace())
    transform = {"route": lambda: route(by_dim, inner=chain(guarded, scale_by_learning_rate()),
                                        other=chain(scale_by_learning_rate())),
                 "galore": lambda: chain(project_low_rank(guarded), scale_by_learning_rate()),
                 "apollo": lambda: chain(scale_by_apollo(guarded), scale_by_learning_rate())}[wrap]()
    ps = params()
    optimizer = optimizer_for(ps, transform)
    step(optimizer, ps, n=1)
    before = [p.detach().clone() for p in ps]
    step(optimizer, ps, n=1, poison=0)
    assert optimizer.skipped_steps == 1
    assert all(torch.equal(p, b) for p, b in zip(ps, before))
    with pytest.raises(ValueError, match="has a guard"):
        gradwise.fused_backward(optimizer_for(params(), transform))


class tally(Transform):
    """Test-only: a user's transform that defines (and does not declare) seed and advance, and a guard
    (a reduction with op "skip") that skips the step when any gradient it sees holds a 7."""

    name = "tally"
    state = ("count",)
    reductions = {"sevens": "skip"}

    def init(self, param, group):
        return {"count": torch.zeros((), dtype=torch.float64)}

    def seed(self, state, index):
        state["count"].fill_(100 * (index + 1))

    def advance(self, state, hyper, scalars):
        state["count"].add_(1)

    def update(self, updates, state, ctx):
        return updates

    def reduce(self, updates, state, ctx):
        return {"sevens": torch.stack([(u == 7).any() for u in updates]).any()}


class double_in_eval(Transform):
    """Test-only: a user's transform whose ``set_mode`` doubles each parameter in eval mode (exactly)."""

    name = "double"

    def update(self, updates, state, ctx):
        return updates

    def set_mode(self, mode, param, state, group):
        param.mul_(2.0 if mode == "eval" else 0.5)


WRAPPERS = {"chain": lambda t: chain(t, scale_by_learning_rate()),
            "route": lambda t: route(by_dim, inner=chain(t, scale_by_learning_rate()),
                                     other=chain(scale_by_learning_rate())),
            "galore": lambda t: chain(project_low_rank(t), scale_by_learning_rate()),
            "apollo": lambda t: chain(scale_by_apollo(t), scale_by_learning_rate())}


def count_of(optimizer, p):
    return next(float(v) for k, v in optimizer.state[p].items() if k.endswith("tally.count"))


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_a_users_hooks_reach_it_through_every_wrapper(wrapper):
    ps = params()
    optimizer = optimizer_for(ps, WRAPPERS[wrapper](tally()))
    step(optimizer, ps, n=2)
    counts = [count_of(optimizer, ps[i]) for i in (0, 2)]  # seeded by the parameter's index, advanced twice
    assert counts[0] != counts[1] and all(c in (102.0, 202.0, 302.0) for c in counts)
    ps[2].grad.fill_(7.0)
    before = ps[2].detach().clone()
    optimizer.step()
    assert optimizer.skipped_steps == 1 and torch.equal(ps[2], before)


@pytest.mark.parametrize("wrapper", ["chain", "route"])
def test_a_users_set_mode_reaches_it_through_chain_and_route(wrapper):
    ps = params()
    optimizer = optimizer_for(ps, WRAPPERS[wrapper](double_in_eval()))
    step(optimizer, ps, n=1)
    before = [p.detach().clone() for p in ps]
    optimizer.eval()
    assert torch.equal(ps[0], 2 * before[0]) and torch.equal(ps[2], 2 * before[2])
    optimizer.train()
    assert torch.equal(ps[0], before[0]) and torch.equal(ps[2], before[2])


def test_defining_a_hook_declares_it_and_composites_declare_what_they_wrap():
    assert tally.hooks == {"seed", "advance"} and double_in_eval.hooks == {"set_mode"}
    assert trace.hooks == frozenset()
    evaluated, plain = lookahead(evaluate_slow=True), lookahead()
    assert type(evaluated) is lookahead and "set_mode" in evaluated.hooks and "set_mode" not in plain.hooks
    wrapped = route(by_dim, inner=chain(project_low_rank(tally())), other=chain(double_in_eval()))
    assert all(uses(wrapped, hook) for hook in ("seed", "advance", "set_mode", "split_group"))
    assert wrapped.reductions == {"sevens": "skip"}
    assert not uses(chain(trace(), plain), "set_mode")
    with pytest.raises(ValueError, match=r"invalid hook='set_modes': expected one of \['advance', 'seed'"):
        uses(wrapped, "set_modes")
