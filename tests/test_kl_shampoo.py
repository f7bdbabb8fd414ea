"""KL-Shampoo and KL-SOAP equal a float64 reference written from the paper step by step, batched or one
block at a time; bad arguments are named; a failed basis refresh keeps the basis; ``estimate`` is exact."""
from __future__ import annotations

import pytest
import torch

import gradwise
from bench.step import state_bytes
from tests.references.kl_shampoo import KLShampooReference, KLSOAPReference
from tests.test_parity import assert_trajectories_close, run_bag, run_mlp

RECIPES = [(gradwise.KLShampoo, KLShampooReference), (gradwise.KLSOAP, KLSOAPReference)]
CONFIGS = [
    # (options, parameter shapes, gradient scale): no padding; (8, 8) and (12, 8) at max_precond_dim=4 are cut
    # into 4 and 6 blocks, batched with the (4, 4) and (4, 2, 2) ones; gradients of 1e-3 make the eigenvalues
    # fall to the clamp's floor (1/100 at sides of 4, max_clamp_value=12); (3, 6) and (6, 9) are rectangular
    (dict(precondition_frequency=5, eps=1e-4), [(), (7,), (6, 6), (5, 5), (5, 5)], 1.0),
    (dict(precondition_frequency=7, betas=(0.9, 0.99), shampoo_beta=0.9, weight_decay=0.0, max_precond_dim=4,
          eps=1e-4, init_factor=0.02, max_clamp_value=12),
     [(3,), (8, 8), (12, 8), (4, 4), (4, 2, 2)], 1e-3),
    (dict(precondition_frequency=4, eps=1e-4), [(3, 6), (6, 9), (4,)], 1.0),
]


@pytest.mark.parametrize("recipe, reference", RECIPES, ids=["KLShampoo", "KLSOAP"])
@pytest.mark.parametrize("options, shapes, scale", CONFIGS, ids=["whole", "blocked-clamped", "rectangular"])
def test_matches_float64_reference(recipe, reference, options, shapes, scale):
    """25 steps: three to six basis refreshes (the moments carried into KL-SOAP's new bases); eps >= 1e-4 for
    the reason tests/test_soap.py gives. The reference takes our bases of step 1 (copied after it): a
    rectangular block's larger factor is singular there, and which basis ``eigh`` picks for its null
    space, which no two implementations share, changes the eigenvalues that later steps estimate."""
    gen = torch.Generator().manual_seed(2)
    params = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]
    first_bases = []

    def before_step(optimizer, step):
        ours = isinstance(optimizer, gradwise.Optimizer)
        for p in optimizer.param_groups[0]["params"] if ours else optimizer.params:
            p.grad.mul_(scale)
        if ours and step == 1:
            first_bases.extend(_bases(optimizer))

    ours = run_bag(lambda p: recipe(p, lr=0.05, **options), _clone(params), torch.float64, 25, before_step=before_step)
    theirs = run_bag(lambda p: reference(p, lr=0.05, first_bases=first_bases, **options), _clone(params),
                     torch.float64, 25, before_step=before_step)
    assert_trajectories_close(ours, theirs, torch.float64)


@pytest.mark.parametrize("recipe", [gradwise.KLShampoo, gradwise.KLSOAP], ids=["KLShampoo", "KLSOAP"])
def test_batched_equals_one_block_at_a_time(recipe):
    options = dict(lr=0.01, precondition_frequency=5, max_precond_dim=8)
    batched = run_mlp(lambda p: recipe(p, **options), torch.float64, 20)
    looped = run_mlp(lambda p: recipe(p, batch_blocks=False, **options), torch.float64, 20)
    assert_trajectories_close(batched, looped, torch.float64, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("recipe", [gradwise.KLShampoo, gradwise.KLSOAP], ids=["KLShampoo", "KLSOAP"])
def test_bad_arguments_name_the_value(recipe):
    p = [torch.zeros(3, 3, requires_grad=True)]
    for kwargs, text in [(dict(shampoo_beta=1.0), "shampoo_beta=1.0"), (dict(betas=(0.9, 1.0)), "1.0"),
                         (dict(precondition_frequency=0), "precondition_frequency=0"),
                         (dict(max_precond_dim=-1), "max_precond_dim=-1"), (dict(eps=-1.0), "eps=-1.0"),
                         (dict(init_factor=0.0), "init_factor=0.0"), (dict(max_clamp_value=0), "max_clamp_value=0")]:
        with pytest.raises(ValueError, match=text):
            recipe(p, **kwargs)


@pytest.mark.parametrize("recipe, prefix", [(gradwise.KLShampoo, "kl_shampoo"), (gradwise.KLSOAP, "kl_soap")])
def test_a_failed_basis_refresh_is_counted_and_keeps_the_basis(recipe, prefix):
    """A factor so large (finite, 3e38) that S Q overflows: the QR refresh gives NaN, that basis keeps its
    value, warns and is counted; the parameter stays finite."""
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(4, 4, generator=gen).requires_grad_()
    optimizer = recipe([p], lr=0.01, precondition_frequency=2)
    p.grad = torch.randn(4, 4, generator=gen)
    optimizer.step()
    before = optimizer.state[p][f"{prefix}.basis_left"].clone()
    optimizer.state[p][f"{prefix}.factor_left"].fill_(3e38)
    p.grad = torch.randn(4, 4, generator=gen)
    with pytest.warns(RuntimeWarning, match="keep their previous eigenbasis"):
        optimizer.step()
    assert optimizer.eigh_failures == 1
    torch.testing.assert_close(optimizer.state[p][f"{prefix}.basis_left"], before)
    assert p.isfinite().all()


@pytest.mark.parametrize("recipe", ["KLShampoo", "KLSOAP"])
@pytest.mark.parametrize("state", [None, "int8"])
def test_estimate_equals_the_bytes_a_step_allocates(recipe, state):
    """A blocked (and padded) matrix, an embedding and a vector: factors, bases, eigenvalues, moments."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Embedding(90, 48), torch.nn.Linear(48, 20))
    predicted = gradwise.estimate(net, recipe, state=state, max_precond_dim=32)
    optimizer = getattr(gradwise, recipe)(net.parameters(), state=state, max_precond_dim=32, compile=False)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    assert predicted.total == state_bytes(optimizer)


def _bases(optimizer):
    """For each parameter, the (Q_L, Q_R) of each of its blocks (none for a vector), copied."""
    name = optimizer.core.name
    out = []
    for p in optimizer.param_groups[0]["params"]:
        left, right = (optimizer.state[p][f"{name}.basis_{side}"].clone() for side in ("left", "right"))
        out.append(list(zip(left, right)) if p.dim() >= 2 else [])
    return out


def _clone(params):
    return [p.detach().clone().requires_grad_() for p in params]
