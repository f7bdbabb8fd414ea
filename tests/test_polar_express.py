"""Polar Express (Amsel et al., 2025, arXiv:2505.16932): Newton-Schulz with a coefficient schedule. The
schedule is the paper's optimal one, it orthogonalizes better than Jordan's quintic at equal iterations,
and Muon with it equals the paper's Algorithm 1 written out in float64, step by step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import gradwise
from gradwise.transforms.newton_schulz import MUON_COEFFICIENTS
from gradwise.transforms.polar_express import (
    POLAR_EXPRESS_COEFFICIENTS,
    POLAR_EXPRESS_OPTIMAL,
    iteration_coefficients,
)
from tests.references.muon import MuonReference
from tests.test_muon import clone, matrices
from tests.test_parity import assert_trajectories_close, run_bag

STEPS = 20


def quintic(coefficients, x):
    a, b, c = coefficients
    return a * x + b * x ** 3 + c * x ** 5


def test_schedule_is_the_papers_optimal_composition():
    """Each released quintic is the minimax one on the interval the previous ones leave (l_1 = 1e-3,
    u_1 = 1): it equioscillates (its interior maximum equals p(u), its interior minimum equals p(l), or
    p(u) / 10 where the paper's cushioning lifts it), and it is centred on 1 (p(l) + p(u) = 2, so the next
    interval is [p(l), 2 - p(l)]). Three equations fix the three coefficients, so a wrong digit fails."""
    low, high = 1e-3, 1.0
    for t, p in enumerate(POLAR_EXPRESS_OPTIMAL[:-1]):
        a, b, c = p
        critical = sorted(r.real for r in np.roots([5 * c, 0, 3 * b, 0, a]) if abs(r.imag) < 1e-12 and r.real > 0)
        top, bottom = quintic(p, critical[0]), quintic(p, critical[1])
        assert low < critical[0] < critical[1] < high, t
        assert quintic(p, low) + quintic(p, high) == pytest.approx(2, abs=1e-9), t
        assert top == pytest.approx(quintic(p, high), abs=1e-8), t
        assert bottom == pytest.approx(max(quintic(p, low), quintic(p, high) / 10), abs=1e-8), t
        low, high = quintic(p, low), 2 - quintic(p, low)
    assert POLAR_EXPRESS_OPTIMAL[-1] == (15 / 8, -10 / 8, 3 / 8)  # the limit: the degree-5 Pade iteration
    x = np.linspace(0.5, 1.5, 11)
    for safe, raw in zip(POLAR_EXPRESS_COEFFICIENTS[:-1], POLAR_EXPRESS_OPTIMAL[:-1]):
        np.testing.assert_allclose(quintic(safe, x), quintic(raw, x / 1.01), rtol=1e-14)  # the safety factor
    assert POLAR_EXPRESS_COEFFICIENTS[-1] == POLAR_EXPRESS_OPTIMAL[-1]


def worst_error(coefficients, steps, factor=1.0):
    """max |p_T(...p_1(x / factor)) - 1| over singular values x in [1e-3, 1], in float64."""
    x = np.logspace(-3, 0, 20001) / factor
    for p in iteration_coefficients(coefficients, steps):
        x = quintic(p, x)
    return np.abs(x - 1).max()


@pytest.mark.parametrize("steps", range(1, 11))
def test_worst_case_error_is_below_jordans_at_every_iteration_count(steps):
    ours, jordans = worst_error("polar_express", steps, factor=1.01), worst_error(MUON_COEFFICIENTS, steps)
    assert ours < jordans
    if steps >= 8:
        assert ours < 1e-12 < 0.3 < jordans  # it converges; Jordan's plateaus near 0.3


def orthogonalized(g, coefficients, steps, dtype):
    ns = gradwise.orthogonalize_by_newton_schulz()
    ctx = gradwise.Context([g], [g], {"eps": torch.tensor(1e-7, dtype=g.dtype)},
                           {"ns_coefficients": coefficients, "ns_steps": steps, "ns_dtype": dtype})
    return ns.update([g], {}, ctx)[0]


@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["float64", "bfloat16"])
@pytest.mark.parametrize("spectrum", ["gaussian", "log-spaced"])
@pytest.mark.parametrize("steps", [5, 7])
def test_orthogonalizes_better_than_the_classic_quintic(dtype, spectrum, steps):
    """||NS(G) - U V^T||, spectral and Frobenius, below Jordan's at Muon's 5 iterations and at 7."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(96, 48, dtype=torch.float64, generator=gen)
    u, s, vh = torch.linalg.svd(g, full_matrices=False)
    if spectrum == "log-spaced":
        g = (u * torch.logspace(0, -3, 48, dtype=torch.float64)) @ vh
    polar = u @ vh
    errors = {}
    for coefficients in ("polar_express", MUON_COEFFICIENTS):
        error = orthogonalized(g, coefficients, steps, dtype) - polar
        errors[coefficients] = (torch.linalg.matrix_norm(error, 2), torch.linalg.matrix_norm(error))
    assert errors["polar_express"][0] < errors[MUON_COEFFICIENTS][0]
    assert errors["polar_express"][1] < errors[MUON_COEFFICIENTS][1]


@pytest.mark.parametrize("options", [dict(lr=0.02), dict(lr=0.01, ns_steps=10, nesterov=False,
                                                         adjust_lr_fn="match_rms_adamw", eps=1e-3)], ids=str)
def test_float64_muon_matches_the_papers_algorithm_step_by_step(options):
    """ns_steps 5 takes the first five, 10 repeats the last after eight; eps 1e-3 shows the normalization
    adds eps (the paper's), where Jordan's takes max(||X||, eps)."""
    params = matrices(torch.float64)
    ours = run_bag(lambda p: gradwise.Muon(p, ns_coefficients="polar_express", ns_dtype=None, **options),
                   clone(params), torch.float64, STEPS)
    theirs = run_bag(lambda p: MuonReference(p, ns_coefficients="polar_express", **options), clone(params),
                     torch.float64, STEPS)
    assert_trajectories_close(ours, theirs, torch.float64)


def test_a_schedule_of_ones_own_runs_one_triple_per_iteration_and_repeats_the_last():
    schedule = [(3.4445, -4.7750, 2.0315), (2.0, -1.5, 0.5), [1.875, -1.25, 0.375]]
    params = matrices(torch.float64)
    ours = run_bag(lambda p: gradwise.Muon(p, lr=0.02, ns_coefficients=schedule, ns_steps=5, ns_dtype=None),
                   clone(params), torch.float64, STEPS)
    theirs = run_bag(lambda p: MuonReference(p, lr=0.02, ns_coefficients=schedule, ns_steps=5), clone(params),
                     torch.float64, STEPS)
    assert_trajectories_close(ours, theirs, torch.float64)
    one = gradwise.Muon(clone(params), ns_coefficients=schedule)
    assert one.param_groups[0]["ns_coefficients"] == tuple(map(tuple, schedule))  # a list is kept as a tuple


@pytest.mark.slow
def test_compiled_equals_eager():
    """Within a rounding a step: the eager step ends in torch's add with alpha, p - lr u in one fused rounding (as
    torch.optim.Muon's ``add_(update, alpha=-lr)``), which inductor's CPU code computes as a product, then a
    difference; the orthogonalization itself is the same ops either way."""
    gen = torch.Generator().manual_seed(1)
    params = [torch.randn(s, generator=gen).requires_grad_() for s in [(12, 8), (8, 12)]]
    optimizers = []

    def make(p, compile):
        optimizers.append(gradwise.Muon(p, lr=0.02, ns_coefficients="polar_express", compile=compile))
        return optimizers[-1]

    trajectories = [run_bag(lambda p: make(p, c), clone(params), torch.float32, 4) for c in (True, False)]
    assert optimizers[0].compile_stats["compiles"] >= 1, "the compiled path did not compile"
    assert_trajectories_close(*trajectories, torch.float32, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("value, message", [
    ((1.0, 2.0), r"ns_coefficients=\(1.0, 2.0\): expected a triple"),
    ((), r"ns_coefficients=\(\): expected .* a non-empty sequence"),
    ([(3.4, -4.7, 2.0), (1.0, 2.0)], r"ns_coefficients\[1\]=\(1.0, 2.0\): expected a triple"),
    ([(3.4, -4.7, 2.0), (1.0, float("nan"), 2.0)], r"ns_coefficients\[1\]\[1\]=nan"),
    ((3.4, float("inf"), 2.0), r"ns_coefficients\[1\]=inf .* expected a finite number"),
    ("polar", r"ns_coefficients='polar': expected .* one of \['polar_express'\]"),
])
def test_bad_schedules_are_refused_naming_the_value(value, message):
    p = [torch.zeros(3, 3, requires_grad=True)]
    with pytest.raises(ValueError, match=message):
        gradwise.Muon(p, ns_coefficients=value)
    optimizer = gradwise.Muon(p, ns_coefficients="polar_express")
    p[0].grad = torch.ones(3, 3)
    optimizer.param_groups[0]["ns_coefficients"] = value
    with pytest.raises(ValueError, match=message):
        optimizer.step()
    assert torch.equal(p[0], torch.zeros(3, 3)) and not optimizer.state  # the refused step changed nothing
