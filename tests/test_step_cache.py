"""What a step keeps between steps to stay cheap on small models, and what it must still see.

``check_step`` checks a group's hyperparameters again only when they changed since its last check
(``state_check.check_hyperparameters``); every change must still be refused before any write: a list
changed in place, a value of another type that compares equal (0 == False), a tensor changed in place,
a group replaced. The eager link math runs as foreach kernels over lists (``core/lists.py``), which must
give the bits of one op per tensor in the same order (AdamW's: torch.optim's). The packed constants live in
buffers kept between steps (``core/constants.py``), one per group and bucket, rewritten each step and made anew
when their dtype changes; each group's chain is resolved once a step, so a group's change reaches the next step.
"""
from __future__ import annotations

import math

import pytest
import torch

import gradwise
from gradwise.core.eager import EAGER_CHUNK


def _stepped(**kwargs):
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(3, 2, generator=gen).requires_grad_() for _ in range(2)]
    opt = gradwise.AdamW([{"params": [params[0]]}, {"params": [params[1]], **kwargs}], lr=0.1, compile=False)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    return opt, params


def _refused_changes_nothing(opt, params, error, pattern):
    before = [p.detach().clone() for p in params], [{k: v.clone() for k, v in opt.state[p].items()} for p in params]
    with pytest.raises(error, match=pattern):
        opt.step()
    assert all(torch.equal(p.detach(), b) for p, b in zip(params, before[0]))
    for p, saved in zip(params, before[1]):
        assert all(torch.equal(opt.state[p][k], v) for k, v in saved.items())


def test_a_list_changed_in_place_is_checked_again():
    opt, params = _stepped(betas=[0.9, 0.999])
    opt.step()  # checked, and remembered
    opt.param_groups[1]["betas"][1] = 1.0
    _refused_changes_nothing(opt, params, ValueError, r"betas\[1\]=1\.0")
    opt.param_groups[1]["betas"][1] = 0.999
    opt.step()
    assert int(opt.state[params[1]]["step"]) == 3


def test_an_equal_value_of_another_type_is_checked_again():
    opt, params = _stepped(maximize=False)
    opt.param_groups[1]["maximize"] = 0  # 0 == False, but not a flag
    _refused_changes_nothing(opt, params, TypeError, r"maximize=0: expected True or False")


def test_a_tensor_changed_in_place_is_checked_every_step():
    opt, params = _stepped(lr=torch.tensor(0.1))
    opt.step()
    opt.param_groups[1]["lr"].fill_(math.nan)
    _refused_changes_nothing(opt, params, ValueError, r"lr=tensor\(nan\)")


def test_a_replaced_group_is_checked_again():
    opt, params = _stepped()
    opt.param_groups[1] = {**opt.param_groups[1], "eps": 0.0}
    _refused_changes_nothing(opt, params, ValueError, r"eps=0\.0: expected a finite number > 0")


def test_a_refused_value_is_refused_at_every_step_until_fixed():
    opt, params = _stepped()
    opt.param_groups[0]["weight_decay"] = -1.0
    for _ in range(2):  # a refusal remembers nothing
        _refused_changes_nothing(opt, params, ValueError, r"weight_decay=-1\.0")
    opt.param_groups[0]["weight_decay"] = 0.0
    opt.step()


def test_a_loaded_checkpoint_is_checked_at_the_next_step():
    opt, params = _stepped()
    saved = opt.state_dict()
    opt.load_state_dict(saved)  # new group dicts: nothing remembered of the old ones
    opt.param_groups[1]["lr"] = -1.0
    _refused_changes_nothing(opt, params, ValueError, r"lr=-1\.0")


def test_state_of_a_wrong_shape_is_refused_with_the_expected_shapes_kept():
    opt, params = _stepped()
    opt.step()  # the groups' expected state shapes are kept from here on
    opt.state[params[1]]["adam.exp_avg"] = torch.zeros(2, 3)
    _refused_changes_nothing(opt, params, ValueError,
                             r"state .adam.exp_avg. of shape \(2, 3\); expected shape \(3, 2\)")


def test_a_parameter_of_a_new_shape_gets_its_own_expected_state():
    opt, params = _stepped()
    opt.step()
    with torch.no_grad():
        params[1].data = torch.zeros(4, 2)
    params[1].grad = torch.ones(4, 2)
    _refused_changes_nothing(opt, params, ValueError,
                             r"state .adam.exp_avg. of shape \(3, 2\); expected shape \(4, 2\)")


def _adamw_by_tensor(params, grads, states, lr, betas, eps, wd, step, amsgrad, maximize):
    """The eager AdamW step as one op per tensor, in torch.optim.AdamW's order (its for-loop path, which
    ``transforms/adam.py`` follows): the reference the foreach kernels must match bit for bit. A bfloat16
    parameter gets its update computed in float32 and rounded once into it (the chain's links in turn)."""
    b1, b2 = betas
    dtype = torch.float64 if params[0].dtype == torch.float64 else torch.float32
    value = {k: torch.tensor(v, dtype=dtype) for k, v in dict(
        c1=1 - b1, b2=b2, c2=1 - b2, eps=eps, decay=1 - lr * wd, step_size=-lr / (1 - b1**step),
        bias2_sqrt=math.sqrt(1 - b2**step), inv_bias1=1 / (1 - b1**step), wd=wd, lr=lr).items()}
    for p, g, st in zip(params, grads, states):
        u = (-g if maximize else g).to(torch.float32 if p.dtype == torch.bfloat16 else p.dtype)
        m, v = st["adam.exp_avg"], st["adam.exp_avg_sq"]
        if p.dtype != torch.bfloat16:
            p.mul_(value["decay"])
        m.lerp_(u, value["c1"])
        v.mul_(value["b2"]).addcmul_(u, u, value=value["c2"].item())
        if amsgrad:
            st["adam.max_exp_avg_sq"].copy_(torch.maximum(st["adam.max_exp_avg_sq"], v))
            v = st["adam.max_exp_avg_sq"]
        d = (v.sqrt() / value["bias2_sqrt"]).add_(value["eps"])
        if p.dtype == torch.bfloat16:
            p.add_((p * value["wd"] + m / d * value["inv_bias1"]) * -value["lr"])
        else:
            p.addcdiv_(m, d, value=value["step_size"].item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("amsgrad,maximize", [(False, False), (True, True)])
def test_eager_adamw_gives_the_bits_of_one_op_per_tensor(dtype, amsgrad, maximize):
    gen = torch.Generator().manual_seed(1)
    shapes = [(), (3,), (17, 5), (EAGER_CHUNK + 4_464,), (4, 3, 3, 3)]  # 0-d, small, one sliced into pieces
    params = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    params.append(torch.randn(6, 4, generator=gen).to(dtype).t())  # not contiguous
    mine = [p.clone().requires_grad_() for p in params]
    hyper = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    opt = gradwise.AdamW(mine, **hyper, amsgrad=amsgrad, maximize=maximize, compile=False)
    states = None
    for step in range(1, 4):
        grads = [torch.randn(p.shape, generator=gen).to(dtype) for p in params]
        for p, g in zip(mine, grads):
            p.grad = g.clone()
        opt.step()
        if states is None:  # the first step's state, as a fresh one before it
            states = [{k: torch.zeros_like(v) for k, v in opt.state[p].items() if k != "step"} for p in mine]
        _adamw_by_tensor(params, grads, states, hyper["lr"], hyper["betas"], hyper["eps"], hyper["weight_decay"],
                         step, amsgrad, maximize)
    for p, q, st in zip(mine, params, states):
        assert torch.equal(p.detach(), q)
        assert all(torch.equal(opt.state[p][k], v) for k, v in st.items())


def _pair(params, **hyper):
    """gradwise.AdamW (eager) and torch.optim.AdamW's for-loop path on copies of ``params``."""
    mine = [p.detach().clone().requires_grad_() for p in params]
    theirs = [p.detach().clone().requires_grad_() for p in params]
    return (mine, gradwise.AdamW(mine, compile=False, **hyper)), (theirs, torch.optim.AdamW(theirs, foreach=False,
                                                                                            **hyper))


def _step_both(pairs, grads):
    for params, opt in pairs:
        for p, g in zip(params, grads):
            p.grad = None if g is None else g.clone().to(p.dtype)
        opt.step()


def _same(pairs):
    (mine, _), (theirs, _) = pairs
    assert all(torch.equal(p.detach(), q.detach()) for p, q in zip(mine, theirs))


def test_constants_kept_between_steps_follow_a_schedule():
    # the packed constants are rewritten in place each step (core/constants.py): a scheduler's lr and betas
    # reach every step, with torch's bits
    gen = torch.Generator().manual_seed(2)
    pairs = _pair([torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen)], lr=0.01, weight_decay=0.1)
    for step in range(20):
        for _, opt in pairs:
            opt.param_groups[0].update(lr=0.01 / (step + 1), betas=(0.9 - step * 0.01, 0.999))
        _step_both(pairs, [torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen)])
        _same(pairs)


def test_buckets_of_one_group_at_different_steps_keep_their_own_constants():
    # a parameter without a gradient at first is a step behind: its bucket's constants are not the others'
    gen = torch.Generator().manual_seed(3)
    pairs = _pair([torch.randn(4, generator=gen), torch.randn(6, generator=gen)], lr=0.1)
    _step_both(pairs, [torch.randn(4, generator=gen), None])
    for _ in range(20):
        _step_both(pairs, [torch.randn(4, generator=gen), torch.randn(6, generator=gen)])
        _same(pairs)


def test_a_parameter_made_float64_gets_float64_constants():
    # same group, same bucket slot, another dtype: a new buffer (float32 constants would round lr and betas)
    gen = torch.Generator().manual_seed(4)
    pairs = _pair([torch.randn(8, generator=gen)], lr=0.01, betas=(0.9, 0.99))
    for _ in range(3):
        _step_both(pairs, [torch.randn(8, generator=gen)])
    for params, opt in pairs:
        params[0].data = params[0].data.double()
        opt.state.clear()
    for _ in range(20):
        _step_both(pairs, [torch.randn(8, dtype=torch.float64, generator=gen)])
        _same(pairs)


def test_a_group_that_turns_amsgrad_on_runs_its_new_chain():
    # each group's chain is resolved once a step (Optimizer.chain_of), not once for good
    gen = torch.Generator().manual_seed(5)
    pairs = _pair([torch.randn(6, generator=gen)], lr=0.01)
    _step_both(pairs, [torch.randn(6, generator=gen)])
    for params, opt in pairs:
        opt.param_groups[0]["amsgrad"] = True
        opt.state[params[0]]["max_exp_avg_sq"] = torch.zeros(6)
    mine, theirs = (opt.state[params[0]] for params, opt in pairs)
    mine["adam.max_exp_avg_sq"] = mine.pop("max_exp_avg_sq")
    for _ in range(20):
        _step_both(pairs, [torch.randn(6, generator=gen)])
        _same(pairs)
    assert torch.equal(mine["adam.max_exp_avg_sq"], theirs["max_exp_avg_sq"])
