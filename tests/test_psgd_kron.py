"""PSGDKron equals pytorch-optimizer 4.1.0's Kron step by step, each of Kron's random vectors drawn from the
seed ours draws from (Kron draws from torch's global generator: it is seeded before each of its steps, one
Kron per tensor, so every tensor draws the same V as ours, whatever the order)."""
from __future__ import annotations

import math

import pytest
import torch
from pytorch_optimizer import Kron
from pytorch_optimizer.optimizer.psgd import precondition_update_prob_schedule as kron_schedule

import gradwise
from bench.step import state_bytes
from gradwise.transforms.kron_schedule import fitting_steps, noise_seed, precondition_update_prob_schedule

#: a scalar, a vector, matrices (two of one shape, batched; sides of length 1), and a 3-d tensor, which both
#: see as the matrix (3, 8): Kron is given it in that shape
SHAPES = [(), (7,), (6, 5), (6, 5), (4, 9), (1, 5), (3, 1), (3, 2, 4)]
CONFIGS = [
    dict(lr=0.01, balance_prob=0.0),
    dict(lr=0.01, momentum=0.8, weight_decay=0.1, balance_prob=1.0, precondition_lr=0.3),
    dict(lr=0.01, weight_decay=0.1, weight_decouple=False, momentum_into_precondition_update=False,
         balance_prob=0.0, precondition_init_scale=0.5),
    dict(lr=0.01, memory_save_mode="one_diag", pre_conditioner_update_probability=0.4, balance_prob=1.0,
         maximize=True),
    dict(lr=0.01, memory_save_mode="smart_one_diag", max_size_triangular=5, balance_prob=1.0,
         pre_conditioner_update_probability=kron_schedule(min_prob=0.2, decay=0.3, flat_start=3)),
    dict(lr=0.01, memory_save_mode="all_diag", balance_prob=0.0),
]


def _matrix(shape):
    return (shape[0], math.prod(shape[1:])) if len(shape) > 2 else shape


def _run_both(options, dtype, steps=20, shapes=SHAPES):
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    ours = [p.clone().requires_grad_() for p in start]
    empty = torch.zeros(0, 3, dtype=dtype, requires_grad=True)  # Kron cannot take one; ours leaves it be
    theirs = [p.reshape(_matrix(p.shape)).clone().requires_grad_() for p in start]
    optimizer = gradwise.PSGDKron([*ours, empty], compile=False, **options)
    # Kron takes these two in its param groups only (its keywords ignore them)
    grouped = {k: options[k] for k in ("precondition_lr", "precondition_init_scale") if k in options}
    references = [Kron([{"params": [p], **grouped}], **{k: v for k, v in options.items() if k not in grouped})
                  for p in theirs]
    for step in range(1, steps + 1):
        grads = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
        for p, g in zip(ours, grads):
            p.grad = g.clone()
        empty.grad = torch.zeros_like(empty)
        optimizer.step()
        for p, g, reference in zip(theirs, grads, references):
            p.grad = g.reshape(p.shape).clone()
            torch.default_generator.manual_seed(noise_seed(step))  # where Kron's randn_like draws from
            reference.step()
        yield step, ours, [p.reshape(q.shape) for p, q in zip(theirs, ours)]


@pytest.mark.parametrize("options", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items())[:60])
def test_matches_pytorch_optimizer_kron_in_float32(options):
    """20 steps: every kind of side (triangular, diagonal, absent), fits skipped by probability and by
    schedule, balancing at every fit, L2 and decoupled decay (of matrices only), ascent."""
    for step, ours, theirs in _run_both(options, torch.float32):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step}, tensor {i}: {m}")


def test_matches_pytorch_optimizer_kron_in_float64():
    """With ``precondition_dtype=torch.float64`` on both; Kron's triangular solves stay float32 (it casts),
    ours run in float64: the two agree to about float32's precision."""
    options = dict(lr=0.01, weight_decay=0.1, balance_prob=1.0, precondition_dtype=torch.float64)
    for step, ours, theirs in _run_both(options, torch.float64):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=lambda m: f"step {step}, tensor {i}: {m}")


def test_fitting_steps_follow_pytorch_optimizers_counter():
    """The default schedule (every step for 500, then decaying) over 650 steps: the steps Kron fits at are
    the ones ``fitting_steps`` names, and its schedule's probabilities are ours."""
    p = torch.zeros((), requires_grad=True)
    kron = Kron([p])
    fits = []
    for _ in range(650):
        p.grad = torch.ones_like(p)
        kron.step()
        fits.append(kron.param_groups[0]["update_counter"] == 0)
    assert bytearray(fits) == fitting_steps(None, 650)
    assert 500 < sum(fits) < 650
    for n in range(0, 5000, 7):
        assert torch.equal(precondition_update_prob_schedule()(n), kron_schedule()(n))


def test_the_state_and_estimate_of_a_wide_layer():
    """A side above ``max_size_triangular`` is diagonal: a (9000, 5) weight keeps a 9000-row and a 5 x 5
    triangle, its bias one 9000-vector; ``gradwise.estimate`` predicts the bytes a step allocates."""
    net = torch.nn.Linear(5, 9000)
    predicted = gradwise.estimate(net, "PSGDKron")
    optimizer = gradwise.PSGDKron(net.parameters(), compile=False)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    state = optimizer.state[net.weight]
    assert state["psgd_kron.q_left"].shape == (1, 1, 9000) and state["psgd_kron.q_right"].shape == (1, 5, 5)
    assert torch.equal(state["psgd_kron.q_right"][0], state["psgd_kron.q_right"][0].triu())
    assert optimizer.state[net.bias]["psgd_kron.q_left"].shape == (1, 1, 9000)
    floats = 45000 + 9000 + 25 + 9000 + 9000  # the weight's momentum and factors; the bias's momentum and factor
    assert predicted.total == state_bytes(optimizer) == 4 * floats + 2 * 4  # and two float32 step counters


@pytest.mark.parametrize("kwargs, text", [
    (dict(memory_save_mode="some_diag"), "memory_save_mode='some_diag'"),
    (dict(pre_conditioner_update_probability=1.5), "pre_conditioner_update_probability=1.5"),
    (dict(pre_conditioner_update_probability="often"), "a function of the step"),
    (dict(max_size_triangular=0), "max_size_triangular=0"),
    (dict(momentum=1.0), "momentum=1.0"),
    (dict(precondition_dtype=torch.bfloat16), "precondition_dtype=torch.bfloat16"),
    (dict(balance_prob=-0.1), "balance_prob=-0.1"),
    (dict(precondition_lr=0.0), "precondition_lr=0.0"),
])
def test_bad_arguments_name_the_value(kwargs, text):
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace("[", r"\[")):
        gradwise.PSGDKron([torch.zeros(3, 3, requires_grad=True)], **kwargs)


def test_weight_decouple_must_be_a_flag():
    with pytest.raises(TypeError, match="weight_decouple='yes'"):
        gradwise.PSGDKron([torch.zeros(3, 3, requires_grad=True)], weight_decouple="yes")
