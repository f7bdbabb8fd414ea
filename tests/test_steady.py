"""The steady step (``core/steady.py``): the last step's buckets run again, bit for bit as the general step, and
the general step runs whenever anything that decided them changed (its checks and errors included)."""
from __future__ import annotations

import io

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

from gradwise import Optimizer, chain
from gradwise.core import executor
from gradwise.core.namespaces import strip_namespace
from gradwise.core.transform import advance_plan
from gradwise.transforms import add_decayed_weights, cautious, scale_by_nadam, scale_by_schedule_free
from tests.guard_checks import log_guard_checks
from tests.registry import CASES

#: recipes whose step is one phase of plain state on these models: every step after the first is a steady one
STEADY = {"sgd", "sgd-momentum-dampening", "sgd-nesterov", "adam", "adamw", "lion", "schedule-free-adamw"}
STEPS = 24


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))


def _groups(model):
    """Two groups, the first with its own lr, as a loop with a schedule and layer-wise rates has them."""
    first, *rest = list(model.parameters())
    return [{"params": [first], "lr": 0.02}, {"params": rest}]


def _backward(model, step):
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 4, generator=gen)
    model.zero_grad()
    nn.functional.mse_loss(model(x), torch.sin(x.sum(dim=1, keepdim=True))).backward()


def _counting_general_steps(opt) -> list[int]:
    """The steps that ran the general one (its input checks), appended to as they run."""
    calls, general = [], opt._check_inputs

    def counted():
        calls.append(len(calls))
        general()
    opt._check_inputs = counted
    return calls


def _pair(case, compile=False):
    """Two equal models and optimizers of ``case``: the first takes steady steps, the second never does."""
    models = [_mlp(), _mlp()]
    opts = [case.ours(_groups(m), compile=compile) for m in models]
    opts[1].steady_steps = False
    return models, opts


def _train(models, opts, steps, first=0, between=None):
    schedulers = [lr_scheduler.StepLR(o, step_size=4, gamma=0.5) for o in opts]
    for step in range(first, first + steps):
        for model, opt, scheduler in zip(models, opts, schedulers):
            _backward(model, step)
            if between is not None:
                between(step, model, opt)
            opt.step()
            scheduler.step()


def _assert_same(models, opts):
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(a, b), f"{name} differs"
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        mine, theirs = opts[0].state[a], opts[1].state[b]
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert torch.equal(mine[key], theirs[key]), key


@pytest.mark.parametrize("case", [c for c in CASES if c.trains], ids=lambda c: c.name)
def test_steady_steps_equal_the_general_step_bit_for_bit(case):
    models, opts = _pair(case)
    general = _counting_general_steps(opts[0])
    _train(models, opts, STEPS)
    _assert_same(models, opts)
    if case.name in STEADY:
        assert len(general) == 1, f"{len(general)} of {STEPS} steps ran the general step"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adamw", "lion", "schedule-free-adamw"])
def test_compiled_steady_steps_equal_the_general_step(name):
    (case,) = [c for c in CASES if c.name == name]
    models, opts = _pair(case, compile=True)
    general = _counting_general_steps(opts[0])
    _train(models, opts, 20)
    _assert_same(models, opts)
    assert len(general) == 1


@pytest.mark.slow
def test_a_compiled_steady_step_checks_every_calls_guards_before_its_first_graph_runs(monkeypatch):
    monkeypatch.setattr(executor, "GROUP", 2)  # the second group's four parameters of 2 elements or more: two calls
    (case,) = [c for c in CASES if c.name == "adamw"]
    models, opts = _pair(case, compile=True)
    general = _counting_general_steps(opts[0])
    _train(models, opts, 2)
    events = log_guard_checks(monkeypatch)
    _train(models, opts, 1, first=2)
    assert len(general) == 1
    # the first group's one parameter (a call of its own), then the second group's two calls; the twin without steady
    # steps checks and runs one call at a time
    assert events == ["check", "run", "check", "check", "run", "run"] + ["check", "run"] * 3
    # a guard that fails in a steady step (dynamo guards the thread count): that call compiles anew, as it would alone
    compiles, threads = opts[0].compile_stats["compiles"], torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        events.clear()
        _train(models, opts, 1, first=3)
    finally:
        torch.set_num_threads(threads)
    assert events[:2] == ["fail", "fail"] and opts[0].compile_stats["compiles"] > compiles
    assert len(general) == 1
    _train(models, opts, 2, first=4)
    _assert_same(models, opts)


def _transpose_a_gradient(step, model, opt):
    if step in (5, 6):  # strided unlike its parameter and state: not one dense run, so it steps eagerly
        w = model[2].weight
        w.grad = w.grad.t().contiguous().t()


@pytest.mark.slow
def test_a_gradient_the_graphs_do_not_take_runs_eagerly_as_in_the_general_step():
    (case,) = [c for c in CASES if c.name == "adamw"]
    models, opts = _pair(case, compile=True)
    general = _counting_general_steps(opts[0])
    _train(models, opts, 10, between=_transpose_a_gradient)
    _assert_same(models, opts)
    # the first, the first transposed (the second runs its buckets again: the same parameter eagerly) and the one after
    assert len(general) == 3


def _move_memory(step, model, opt):
    """The same values in new memory, the objects kept: a compiled steady step's prepared calls read the old."""
    if step == 5:
        w = model[2].weight
        w.data = w.data.clone()
    if step == 7:
        m = opt.state[model[0].weight]["adam.exp_avg"]
        m.set_(m.clone())


@pytest.mark.slow
def test_a_parameter_or_moment_moved_to_new_memory_runs_the_general_step():
    (case,) = [c for c in CASES if c.name == "adamw"]
    models, opts = _pair(case, compile=True)
    general = _counting_general_steps(opts[0])
    _train(models, opts, 10, between=_move_memory)
    _assert_same(models, opts)
    assert len(general) == 3  # the first, and the first after each move


def _replace_a_moment(step, model, opt):
    if step == 5:
        p = next(model.parameters())
        opt.state[p]["adam.exp_avg"] = opt.state[p]["adam.exp_avg"].clone() * 0.5


def _drop_a_gradient(step, model, opt):
    if step in (6, 7):
        model[2].bias.grad = None


def _write_a_counter(step, model, opt):
    if step == 8:
        opt.state[model[4].weight]["step"].fill_(3)


def _change_a_static_option(step, model, opt):
    if step == 9:
        opt.param_groups[1]["maximize"] = True


def _change_a_hyperparameter(step, model, opt):
    if step in (3, 10):
        opt.param_groups[0]["weight_decay"] = 0.1 * step


@pytest.mark.parametrize("change", [_replace_a_moment, _drop_a_gradient, _write_a_counter, _change_a_static_option])
def test_any_change_runs_the_general_step_with_the_same_result(change):
    (case,) = [c for c in CASES if c.name == "adamw"]
    models, opts = _pair(case)
    general = _counting_general_steps(opts[0])
    _train(models, opts, 16, between=change)
    _assert_same(models, opts)
    assert 2 <= len(general) < 16


@pytest.mark.parametrize("counters", ["past float32's 2**24", "of two dtypes"])
def test_the_steady_steps_counters_count_as_the_general_steps(counters):
    """A steady step counts its bucket's counters up stacked and copies them back (``steady.count_up``): bit for bit
    the general step's ``add_`` a counter, past 2**24, where a float32 count stops moving; a bucket whose counters
    differ in dtype counts each up on its own."""
    (case,) = [c for c in CASES if c.name == "adamw"]
    models, opts = _pair(case)
    general = _counting_general_steps(opts[0])

    def set_counters(step, model, opt):
        if step == 2:
            for i, p in enumerate(model.parameters()):
                if counters == "of two dtypes":
                    opt.state[p]["step"] = opt.state[p]["step"].double() if i % 2 else opt.state[p]["step"]
                else:
                    opt.state[p]["step"].fill_(2**24 - 3)

    _train(models, opts, 10, between=set_counters)
    _assert_same(models, opts)
    assert len(general) == 2  # the first step, and the first after the change
    steps = [opts[0].state[p]["step"] for p in models[0].parameters()]
    if counters == "of two dtypes":
        assert {c.dtype for c in steps} == {torch.float32, torch.float64} and {float(c) for c in steps} == {10.0}
        assert opts[0]._steady.buckets[-1].counters is None  # (the second group: both dtypes)
    else:
        assert {float(c) for c in steps} == {2.0**24} and opts[0]._steady.buckets[0].counters is not None


def test_a_new_hyperparameter_value_is_checked_and_taken_by_the_steady_step():
    (case,) = [c for c in CASES if c.name == "adamw"]
    models, opts = _pair(case)
    general = _counting_general_steps(opts[0])
    _train(models, opts, 16, between=_change_a_hyperparameter)
    _assert_same(models, opts)
    assert len(general) == 1


def test_a_parameter_of_another_shape_is_refused_by_the_general_step_naming_it():
    (case,) = [c for c in CASES if c.name == "adamw"]
    model = _mlp()
    opt = case.ours(model.named_parameters(), compile=False)
    _train([model], [opt], 3)
    model[4].bias.data = torch.zeros(2)
    model[4].bias.grad = torch.ones(2)
    with pytest.raises(ValueError, match="4.bias"):
        opt.step()


def _snapshot(model, opt):
    return [p.detach().clone() for p in model.parameters()], \
        [{k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()]


def _assert_unchanged(model, opt, before):
    params, states = before
    for a, b, want in zip(model.parameters(), params, states):
        assert torch.equal(a, b)
        assert all(torch.equal(opt.state[a][k], v) for k, v in want.items())


@pytest.mark.parametrize(("spoil", "error", "match"), [
    (lambda model, opt: setattr(model[2].weight.grad, "data", torch.ones(3, 3)), ValueError, "2.weight.*shape"),
    (lambda model, opt: (setattr(model[4].bias, "data", torch.zeros(2)), setattr(model[4].bias.grad, "data",
                                                                                torch.ones(1))), ValueError, "4.bias"),
    (lambda model, opt: opt.param_groups[0].__setitem__("lr", -1.0), ValueError, "lr"),
    (lambda model, opt: opt.param_groups[0].__setitem__("betas", (0.9, 1.5)), ValueError, "betas"),
])
def test_bad_input_after_steady_steps_is_refused_and_changes_nothing(spoil, error, match):
    (case,) = [c for c in CASES if c.name == "adamw"]
    model = _mlp()
    opt = case.ours(model.named_parameters(), compile=False)
    _train([model], [opt], 4)
    _backward(model, 4)
    spoil(model, opt)
    before = _snapshot(model, opt)
    with pytest.raises(error, match=match):
        opt.step()
    _assert_unchanged(model, opt, before)


def test_load_state_dict_and_add_param_group_run_the_general_step():
    (case,) = [c for c in CASES if c.name == "adamw"]
    models, opts = _pair(case)
    _train(models, opts, 4)
    saved = io.BytesIO()
    torch.save(opts[0].state_dict(), saved)
    general = _counting_general_steps(opts[0])
    for opt in opts:
        saved.seek(0)
        opt.load_state_dict(torch.load(saved))
    _train(models, opts, 2, first=4)
    extra = [nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))]
    for opt, p in zip(opts, extra):
        opt.add_param_group({"params": [p], "lr": 0.1})
        p.grad = torch.full((3,), 0.5)
    _train(models, opts, 3, first=6)
    _assert_same(models, opts)
    assert torch.equal(extra[0], extra[1]) and not torch.equal(extra[0], torch.ones(3))
    assert len(general) == 2  # the first step after each


def _add_a_state_key(step, model, opt):
    if step == 5:
        opt.state[model[2].weight]["kept_by_the_user"] = torch.zeros(())


def test_a_state_key_added_between_steps_runs_the_general_step():
    """The steady step keeps each parameter's state for its links' ``advance`` (Schedule-Free's 0-d state): a
    state dict that gained a key is not the one it kept, so the general step runs, to the same result."""
    (case,) = [c for c in CASES if c.name == "schedule-free-adamw"]
    models, opts = _pair(case)
    general = _counting_general_steps(opts[0])
    _train(models, opts, 8, between=_add_a_state_key)
    for model, opt in zip(models, opts):
        opt.state[model[2].weight].pop("kept_by_the_user", None)
    _assert_same(models, opts)
    assert len(general) == 2  # the first step and the one after the new key


def test_a_steady_step_that_fails_after_advancing_puts_the_0d_state_back(monkeypatch):
    """Schedule-Free advances its 0-d state (lr_max, weight sum, c) before the update runs; a steady step that fails
    in the update leaves every parameter, counter and 0-d value as it was."""
    import gradwise.core.steady as steady

    (case,) = [c for c in CASES if c.name == "schedule-free-adamw"]
    model = _mlp()
    opt = case.ours(_groups(model), compile=False)
    general = _counting_general_steps(opt)
    _train([model], [opt], 4)
    _backward(model, 4)
    before = _snapshot(model, opt)

    def failing(*args, **kwargs):
        raise RuntimeError("the update failed")
    monkeypatch.setattr(steady, "run_eager", failing)
    monkeypatch.setattr(steady, "run_chain", failing)
    with pytest.raises(RuntimeError, match="the update failed"):
        opt.step()
    assert len(general) == 1  # the failing step was a steady one
    _assert_unchanged(model, opt, before)
    assert any(v.dim() == 0 and k != "step" for k, v in opt.state[model[0].weight].items())


def test_advance_plan_makes_the_calls_of_advance_many_through_nested_composites():
    """``advance_plan``, by which a steady step advances: the links under a modifier inside a chain, found with their
    namespaces, and advanced as the chain's own ``advance_many`` advances them, bit for bit."""
    transform = chain(cautious(chain(scale_by_nadam(), add_decayed_weights())), scale_by_schedule_free("betas"))
    model = _mlp()
    opt = Optimizer(model.parameters(), transform, lr=0.01, weight_decay=0.1)
    for step in range(3):
        _backward(model, step)
        opt.step()
    group = opt.param_groups[0]
    before = [{k: v.clone() for k, v in opt.state[p].items() if k != "step"} for p in model.parameters()]
    planned, walked = ([{k: v.clone() for k, v in st.items()} for st in before] for _ in range(2))
    resolved = opt.chain_of(group)
    scalars = resolved.scalars(group, 4)
    plan = advance_plan(resolved, planned)
    assert [(type(link).__name__, namespace) for link, namespace, _ in plan] == [
        ("scale_by_nadam", "cautious.nadam"), ("scale_by_schedule_free", "schedule_free")]
    for link, namespace, states in plan:
        link.advance_many(states, group, strip_namespace(namespace, scalars))
    resolved.advance_many(walked, group, scalars)
    for old, mine, theirs in zip(before, planned, walked):
        for key in old:
            assert torch.equal(mine[key], theirs[key]), key
        assert not torch.equal(mine["cautious.nadam.mu_product"], old["cautious.nadam.mu_product"])
        assert not torch.equal(mine["schedule_free.weight_sum"], old["schedule_free.weight_sum"])
