"""SOAP equals a float64 reference written from the paper step by step, batched or one block at a time."""
from __future__ import annotations

import pytest
import torch

import gradwise
from tests.references.soap import SOAPReference
from tests.test_parity import assert_trajectories_close, run_bag, run_mlp

SQUARE_BLOCKS = [
    # (options, parameter shapes): every block square, so that the first step's factors have full rank
    (dict(precondition_frequency=10, eps=1e-4), [(), (7,), (8, 8), (5, 5), (5, 5)]),
    (dict(precondition_frequency=7, betas=(0.9, 0.99), shampoo_beta=0.9, weight_decay=0.0, max_precond_dim=4,
          eps=1e-4),
     [(3,), (8, 8), (12, 8), (4, 16), (4, 2, 2)]),
    (dict(precondition_frequency=5, max_precond_dim=3, eps=1e-3), [(6, 6), (9, 3), (3, 3)]),
]


@pytest.mark.parametrize("options,shapes", SQUARE_BLOCKS, ids=[str(c[0]) for c in SQUARE_BLOCKS])
def test_matches_float64_reference(options, shapes):
    """35 steps: three to seven eigenbasis refreshes, batched blocks of several parameters.

    Only square blocks: a rectangular block's larger factor is singular at step 1, and SOAP's update
    then depends on which basis ``eigh`` picks for its null space, which no two implementations share
    (any last-bit difference in the factor changes it); Shampoo's inverse root does not depend on it.
    And eps >= 1e-4: at step 1 the rotated gradient is diagonal (the bases are its singular vectors),
    so its off-diagonal entries are round-off (1e-16) divided by sqrt(v) + eps, i.e. by about eps."""
    gen = torch.Generator().manual_seed(1)
    params = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]
    ours = run_bag(lambda p: gradwise.SOAP(p, lr=0.01, **options), _clone(params), torch.float64, 35)
    theirs = run_bag(lambda p: SOAPReference(p, lr=0.01, **options), _clone(params), torch.float64, 35)
    assert_trajectories_close(ours, theirs, torch.float64)


def test_batched_equals_one_block_at_a_time():
    options = dict(lr=0.01, precondition_frequency=5, max_precond_dim=8)
    batched = run_mlp(lambda p: gradwise.SOAP(p, **options), torch.float64, 30)
    looped = run_mlp(lambda p: gradwise.SOAP(p, batch_blocks=False, **options), torch.float64, 30)
    assert_trajectories_close(batched, looped, torch.float64, rtol=1e-10, atol=1e-12)


def test_bad_arguments_name_the_value():
    p = [torch.zeros(3, 3, requires_grad=True)]
    for kwargs, text in [(dict(shampoo_beta=1.0), "shampoo_beta=1.0"),
                         (dict(precondition_frequency=0), "precondition_frequency=0"),
                         (dict(max_precond_dim=-1), "max_precond_dim=-1"), (dict(eps=-1.0), "eps=-1.0")]:
        with pytest.raises(ValueError, match=text):
            gradwise.SOAP(p, **kwargs)


def _clone(params):
    return [p.detach().clone().requires_grad_() for p in params]


def test_a_failed_basis_refresh_is_counted_and_keeps_the_basis():
    """A factor so large (finite, 3e38) that L Q overflows: the QR refresh gives NaN, that basis
    keeps its previous value (permuted with v by the eigenvalue sort), warns and is counted."""
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(4, 4, generator=gen).requires_grad_()
    optimizer = gradwise.SOAP([p], lr=0.01, precondition_frequency=2)
    p.grad = torch.randn(4, 4, generator=gen)
    optimizer.step()
    optimizer.state[p]["soap.factor_left"].fill_(3e38)
    p.grad = torch.randn(4, 4, generator=gen)
    with pytest.warns(RuntimeWarning, match="keep their previous eigenbasis"):
        optimizer.step()
    assert optimizer.eigh_failures == 1
    basis = optimizer.state[p]["soap.basis_left"]
    assert basis.isfinite().all() and p.isfinite().all()
    torch.testing.assert_close(basis[0].mT @ basis[0], torch.eye(4))
