"""Schedule-Free AdamW and SGD: parity with the ``schedulefree`` package for 120 steps (through
warmup, with r and weight_lr_power), train()/eval() and checkpoints in either mode."""
from __future__ import annotations

import copy

import pytest
import torch

import gradwise
from gradwise.transforms import add_decayed_weights, scale_by_learning_rate, scale_by_rms, scale_by_schedule_free
from tests.models import mlp, regression_batch
from tests.registry import _schedulefree

STEPS = 120
F64 = dict(rtol=1e-10, atol=1e-10)
RECIPES = {
    "adamw": (gradwise.ScheduleFreeAdamW, "AdamWScheduleFree",
              dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05, warmup_steps=30, r=0.5,
                   weight_lr_power=2.0)),
    "sgd": (gradwise.ScheduleFreeSGD, "SGDScheduleFree",
            dict(lr=0.05, momentum=0.9, weight_decay=0.01, warmup_steps=30, r=1.0, weight_lr_power=1.0)),
}


def _train(model, optimizer, steps, start=0):
    for step in range(start, start + steps):
        x, y = regression_batch(torch.float64, step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


def _assert_close(a, b, **tol):
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, **(tol or F64))


@pytest.mark.parametrize("name", RECIPES)
def test_matches_schedulefree_in_train_and_eval_mode(name):
    recipe, reference, kwargs = RECIPES[name]
    ours_model, theirs_model = mlp(torch.float64), mlp(torch.float64)
    ours = recipe(ours_model.parameters(), compile=False, **kwargs)
    theirs = _schedulefree(reference)(list(theirs_model.parameters()), **kwargs)
    for step in range(STEPS):
        _train(ours_model, ours, 1, start=step)
        _train(theirs_model, theirs, 1, start=step)
        _assert_close(_weights(ours_model), _weights(theirs_model))  # y, every step
        if step % 40 == 39:  # x, now and then; then back to y
            ours.eval(), theirs.eval()
            _assert_close(_weights(ours_model), _weights(theirs_model))
            ours.train(), theirs.train()


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", RECIPES)
def test_checkpoint_in_either_mode_resumes_exactly(name, mode):
    recipe, _, kwargs = RECIPES[name]
    n = 40
    model = mlp(torch.float64)
    optimizer = recipe(model.parameters(), compile=False, **kwargs)
    _train(model, optimizer, n)
    optimizer.train(mode == "train")
    saved = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    evaluated = _weights(model)
    optimizer.train()
    _train(model, optimizer, n, start=n)

    fresh_model = mlp(torch.float64, seed=1)
    fresh = recipe(fresh_model.parameters(), compile=False, **kwargs)
    fresh_model.load_state_dict(saved["model"])
    fresh.load_state_dict(saved["optimizer"])
    assert fresh.mode == mode
    fresh.train(mode == "train")  # already there: moves nothing, the model keeps the saved weights
    assert all(torch.equal(a, b) for a, b in zip(_weights(fresh_model), evaluated))
    fresh.train()
    _train(fresh_model, fresh, n, start=n)
    assert all(torch.equal(a, b) for a, b in zip(_weights(fresh_model), _weights(model)))


def test_eval_is_idempotent_and_step_in_eval_mode_changes_nothing():
    model = mlp(torch.float64)
    optimizer = gradwise.ScheduleFreeAdamW(model.parameters(), lr=0.01, compile=False)
    optimizer.eval()  # before any step there is no z: nothing moves
    assert optimizer.mode == "eval"
    optimizer.train()
    _train(model, optimizer, 5)
    y = _weights(model)
    optimizer.eval()
    x = _weights(model)
    assert not all(torch.equal(a, b) for a, b in zip(x, y))
    optimizer.eval()
    assert all(torch.equal(a, b) for a, b in zip(_weights(model), x))
    state = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(RuntimeError, match="eval mode"):
        _train(model, optimizer, 1)
    assert all(torch.equal(a, b) for a, b in zip(_weights(model), x))
    torch.testing.assert_close(optimizer.state_dict()["state"], state["state"], rtol=0, atol=0)
    optimizer.train()
    optimizer.train()
    _assert_close(_weights(model), y, rtol=1e-12, atol=1e-12)


def test_schedule_free_wrapper_turns_a_chain_into_schedule_free_adamw():
    kwargs = dict(lr=0.01, betas=(0.9, 0.999), weight_decay=0.05, warmup_steps=10)
    ours_model, ref_model = mlp(torch.float64), mlp(torch.float64)
    wrapped = gradwise.schedule_free(gradwise.chain(scale_by_rms(), add_decayed_weights(), scale_by_learning_rate()))
    ours = gradwise.Optimizer(ours_model.parameters(), wrapped, compile=False, schedule_free_momentum=0.9, **kwargs)
    ref = gradwise.ScheduleFreeAdamW(ref_model.parameters(), compile=False, **kwargs)
    _train(ours_model, ours, 30)
    _train(ref_model, ref, 30)
    ours.eval(), ref.eval()
    _assert_close(_weights(ours_model), _weights(ref_model))


@pytest.mark.parametrize("kwargs, message", [
    (dict(betas=(0.0, 0.999)), "betas"),
    (dict(warmup_steps=-1), "warmup_steps=-1"),
    (dict(warmup_steps=2.5), "warmup_steps=2.5"),
    (dict(r=-1.0), "r=-1.0"),
    (dict(weight_lr_power=float("nan")), "weight_lr_power=nan"),
])
def test_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gradwise.ScheduleFreeAdamW([torch.nn.Parameter(torch.zeros(2))], **kwargs)


@pytest.mark.parametrize("momentum", [0.0, 1.0])
def test_sgd_momentum_must_be_in_open_unit_interval(momentum):
    with pytest.raises(ValueError, match=f"momentum={momentum}"):
        gradwise.ScheduleFreeSGD([torch.nn.Parameter(torch.zeros(2))], momentum=momentum)


def test_train_and_eval_only_record_the_mode_for_other_chains():
    p = torch.nn.Parameter(torch.ones(3))
    optimizer = gradwise.AdamW([p], lr=0.1, compile=False)
    assert optimizer.eval() is optimizer and optimizer.mode == "eval"
    p.grad = torch.ones(3)
    optimizer.step()  # nothing to move between points: stepping in eval mode is allowed
    assert not torch.equal(p.detach(), torch.ones(3))
    with pytest.raises(TypeError, match="mode='yes'"):
        optimizer.train("yes")


def test_bad_mode_in_a_state_dict_is_refused():
    optimizer = gradwise.ScheduleFreeSGD([torch.nn.Parameter(torch.ones(3))], compile=False)
    state = optimizer.state_dict()
    state["param_groups"][0]["gradwise"]["mode"] = "inference"
    with pytest.raises(ValueError, match="mode.*'inference'"):
        optimizer.load_state_dict(state)


def test_bfloat16_parameters_move_between_points_through_float32_z():
    model = torch.nn.Linear(8, 4).to(torch.bfloat16)
    optimizer = gradwise.ScheduleFreeAdamW(model.parameters(), lr=0.01, compile=False)
    for step in range(5):
        optimizer.zero_grad()
        model(torch.randn(2, 8, dtype=torch.bfloat16)).float().square().mean().backward()
        optimizer.step()
    assert all(optimizer.state[p]["schedule_free.z"].dtype == torch.float32 for p in model.parameters())
    y = _weights(model)
    optimizer.eval()
    optimizer.train()
    for a, b in zip(_weights(model), y):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("power", [2.0, 1.0, 1.5, 0.7, 0.5])
def test_a_bucket_advances_bit_for_bit_as_each_parameter_would(power):
    """advance_many (one op per list over a bucket) against advance on each state, on states that differ
    (parameters that missed steps), through warmup: every lr_max, weight sum and ckp1 has the same bits."""
    link = scale_by_schedule_free("betas")
    generator = torch.Generator().manual_seed(0)
    states = [link.init(torch.zeros(3, dtype=torch.float64), {}) for _ in range(500)]
    for st in states[::2]:  # (a vector pow on the CPU rounds about one element in 60 otherwise: SLEEF's)
        st["lr_max"].copy_(torch.rand((), generator=generator, dtype=torch.float64))
        st["weight_sum"].copy_(torch.rand((), generator=generator, dtype=torch.float64))
    each = copy.deepcopy(states)
    hyper = dict(lr=0.01, betas=(0.9, 0.99), warmup_steps=3, r=0.5, weight_lr_power=power)
    for step in range(1, 7):
        scalars = link.scalars(hyper, step)
        link.advance_many(states, hyper, scalars)
        for st in each:
            link.advance(st, hyper, scalars)
    for a, b in zip(states, each):
        assert all(torch.equal(a[k], b[k]) for k in ("lr_max", "weight_sum", "ckp1")), (a, b)



def test_a_skipped_step_puts_back_every_parameters_0d_state():
    """A guard skips a step after advance wrote the 0-d state of buckets of two step counts: the state
    (0-d state and step counts included) is as before, bit for bit, and the run goes on as one that never
    saw that step."""
    def grad(seed: int) -> torch.Tensor:
        return torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))

    def run(skip: bool) -> list[torch.Tensor]:
        ps = [torch.nn.Parameter(grad(100 + i)) for i in range(5)]
        optimizer = gradwise.ScheduleFreeAdamW(ps, lr=0.01, warmup_steps=2, r=0.5, skip_nonfinite=True,
                                               compile=False)
        for step in range(4):
            for i, p in enumerate(ps):  # the last two miss the first step: two step counts
                p.grad = None if step == 0 and i >= 3 else grad(10 * step + i)
            optimizer.step()
            if step == 2 and skip:
                before = copy.deepcopy(optimizer.state_dict()["state"])
                ps[4].grad[0, 0] = float("nan")
                optimizer.step()
                assert optimizer.skipped_steps == 1
                after = optimizer.state_dict()["state"]
                assert all(torch.equal(after[k][key], v) for k, st in before.items() for key, v in st.items())
        return [p.detach().clone() for p in ps]

    assert all(torch.equal(a, b) for a, b in zip(run(skip=True), run(skip=False)))


@pytest.mark.parametrize("exponent", [2.0, 0.5, -1.0, 1.5, 4.0])
def test_a_bucket_advances_with_each_parameters_own_bits(exponent):
    """``advance_many`` (one op per list, the weight power one op for the exponents torch computes alike per vector
    and per element) against ``advance`` on each parameter's state."""
    gen = torch.Generator().manual_seed(0)
    link = scale_by_schedule_free("betas")

    def states():
        gen.manual_seed(0)
        return [{"lr_max": torch.rand((), dtype=torch.float64, generator=gen) * 10,
                 "weight_sum": torch.rand((), dtype=torch.float64, generator=gen),
                 "ckp1": torch.zeros((), dtype=torch.float64)} for _ in range(50)]
    hyper, scalars = {"weight_lr_power": exponent}, {"scheduled_lr": 3.0, "step_weight": 1.7}
    bucket, each = states(), states()
    link.advance_many(bucket, hyper, scalars)
    for state in each:
        link.advance(state, hyper, scalars)
    for a, b in zip(bucket, each):
        assert all(torch.equal(a[k], b[k]) for k in b)


def test_a_steady_bucket_advances_as_advance_many_through_writes_loads_and_roll_backs():
    """``advancer`` (a steady step's, its 0-d state kept stacked between calls) against ``advance_many`` on a copy,
    eight steps: a user's write to one tensor, a tensor given new memory (``.data``) and a roll back of one step, each
    between two calls, are read again; every lr_max, weight sum and ckp1 has the same bits after every step, and the
    roll back puts the step's values back exactly."""
    link = scale_by_schedule_free("betas")
    generator = torch.Generator().manual_seed(0)
    kept = [link.init(torch.zeros(3, dtype=torch.float64), {}) for _ in range(40)]
    for st in kept[::3]:  # (parameters that missed steps: their 0-d state differs)
        st["lr_max"].copy_(torch.rand((), generator=generator, dtype=torch.float64))
        st["weight_sum"].copy_(torch.rand((), generator=generator, dtype=torch.float64))
    stepped = copy.deepcopy(kept)
    advance = link.advancer(kept)
    assert type(advance).__name__ == "StackedAdvance"
    hyper = dict(lr=0.01, betas=(0.9, 0.99), warmup_steps=3, r=0.5, weight_lr_power=2.0)
    for step in range(1, 9):
        scalars = link.scalars(hyper, step)
        if step == 3:
            for states in (kept, stepped):
                states[5]["weight_sum"].add_(0.25)
        if step == 5:
            for states in (kept, stepped):
                states[7]["lr_max"].data = torch.tensor(0.5, dtype=torch.float64)
        before = copy.deepcopy(kept)
        saved = []
        advance(hyper, scalars, saved)
        if step == 6:  # a failed step's roll back (``buckets.roll_back``)
            for tensors, old in saved:
                torch._foreach_copy_(tensors, list(old.unbind()))
            assert all(torch.equal(a[k], b[k]) for a, b in zip(kept, before) for k in a)
            continue
        link.advance_many(stepped, hyper, scalars)
        for a, b in zip(kept, stepped):
            assert all(torch.equal(a[k], b[k]) for k in ("lr_max", "weight_sum", "ckp1")), (step, a, b)


def test_a_bucket_of_one_or_of_mixed_dtypes_advances_through_advance_many():
    """``advancer`` stacks only a bucket of two parameters or more whose 0-d state is of one dtype and device; else
    it is ``advance_many``'s (``Transform.advancer``), which saves the 0-d state before it writes."""
    link = scale_by_schedule_free("betas")
    mixed, one = ([link.init(torch.zeros(2, dtype=torch.float64), {}) for _ in range(n)] for n in (2, 1))
    mixed[1]["ckp1"] = mixed[1]["ckp1"].float()
    hyper = dict(lr=0.01, betas=(0.9, 0.99), warmup_steps=0, r=0.0, weight_lr_power=2.0)
    for states in (mixed, one):
        advance, saved = link.advancer(states), []
        assert type(advance).__name__ != "StackedAdvance"
        advance(hyper, link.scalars(hyper, 1), saved)
        assert [len(tensors) for tensors, _ in saved] == [len(states)] * 3
        assert all(float(st["lr_max"]) == 0.01 and float(st["ckp1"]) == 1.0 for st in states)
