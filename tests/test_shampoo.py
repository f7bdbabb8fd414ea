"""Shampoo: each grafting type with the preconditioner off equals its torch.optim optimizer (the
Distributed Shampoo test pattern); full Shampoo equals a float64 reference written from the papers."""
from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch

import gradwise
from tests.models import bag_of_tensors
from tests.references.shampoo import ShampooReference
from tests.test_parity import assert_trajectories_close, run_bag, run_mlp

OFF = dict(start_preconditioning_step=math.inf)
GRAFTS = [
    ("adam-adamw", dict(grafting="adam", betas=(0.9, 0.999), grafting_beta2=0.99, grafting_epsilon=1e-6,
                        weight_decay=0.1), torch.optim.AdamW, dict(betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adam-l2", dict(grafting="adam", betas=(0.8, 0.999), grafting_beta2=0.99, weight_decay=0.1,
                     use_decoupled_weight_decay=False), torch.optim.Adam, dict(betas=(0.8, 0.99), weight_decay=0.1)),
    ("adagrad", dict(grafting="adagrad", betas=(0.0, 0.999), grafting_epsilon=1e-10, weight_decay=0.1,
                     use_decoupled_weight_decay=False), torch.optim.Adagrad, dict(eps=1e-10, weight_decay=0.1)),
    ("rmsprop", dict(grafting="rmsprop", betas=(0.0, 0.999), grafting_beta2=0.9, weight_decay=0.0),
     torch.optim.RMSprop, dict(alpha=0.9, eps=1e-8)),
    ("sgd", dict(grafting="sgd", betas=(0.0, 0.999), weight_decay=0.1, use_decoupled_weight_decay=False),
     torch.optim.SGD, dict(weight_decay=0.1)),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name,ours,reference,theirs", GRAFTS, ids=[g[0] for g in GRAFTS])
def test_grafting_alone_equals_torch(name, ours, reference, theirs, dtype):
    params = bag_of_tensors(dtype)
    a = run_bag(lambda p: gradwise.Shampoo(p, lr=0.01, **OFF, **ours), _clone(params), dtype, 30)
    b = run_bag(lambda p: reference(p, lr=0.01, **theirs), _clone(params), dtype, 30, reference=True)
    assert_trajectories_close(a, b, dtype)


FULL = [
    dict(precondition_frequency=10, max_preconditioner_dim=4, weight_decay=0.01),
    dict(precondition_frequency=7, start_preconditioning_step=12, betas=(0.5, 1.0), epsilon=1e-6,
         grafting="adagrad", use_decoupled_weight_decay=False, weight_decay=0.01),
    dict(precondition_frequency=10, max_preconditioner_dim=3, grafting="rmsprop", grafting_beta2=0.9),
    dict(precondition_frequency=5, grafting="sgd", betas=(0.0, 0.99), epsilon=1e-4),
]
# (epsilon 1e-12 on a factor of low rank, the 60 x 60 right factor of the 4-D tensor, leaves eigenvalues
# near 1e-12 that any two eigensolvers get only to about 1e-16 ||R||, so the last case uses 1e-4)


@pytest.mark.parametrize("options", FULL, ids=str)
def test_full_shampoo_matches_float64_reference(options):
    """35 steps: three to six inverse-root recomputations, blocks cut unevenly."""
    params = bag_of_tensors(torch.float64) + [torch.randn(9, 5, dtype=torch.float64).requires_grad_()]
    ours = run_bag(lambda p: gradwise.Shampoo(p, lr=0.01, **options), _clone(params), torch.float64, 35)
    theirs = run_bag(lambda p: ShampooReference(p, lr=0.01, **options), _clone(params), torch.float64, 35)
    assert_trajectories_close(ours, theirs, torch.float64)


@pytest.mark.parametrize("batch_elements", [1 << 24, 3 * 64], ids=["one-batch", "chunked"])
def test_batched_equals_one_block_at_a_time_and_trains(batch_elements, monkeypatch):
    """Blocks batched (in one stack, or in stacks of 3 blocks of 8 x 8 that cut parameters apart) equal
    blocks one at a time."""
    monkeypatch.setattr("gradwise.transforms.blocking.BATCH_ELEMENTS", batch_elements)
    for dtype in (torch.float32, torch.float64):
        options = dict(lr=0.01, precondition_frequency=5, max_preconditioner_dim=8)
        batched = run_mlp(lambda p: gradwise.Shampoo(p, **options), dtype, 30)
        looped = run_mlp(lambda p: gradwise.Shampoo(p, batch_blocks=False, **options), dtype, 30)
        tight = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-6)
        assert_trajectories_close(batched, looped, dtype, **tight)


@pytest.mark.parametrize("recipe, prefix, derived", [(gradwise.Shampoo, "shampoo", "root"),
                                                      (gradwise.SOAP, "soap", "basis")])
def test_an_overflowing_gradient_skips_the_factor_update_and_the_preconditioner_recovers(recipe, prefix, derived):
    """A gradient entry of 1e30 would make its block's factors inf (its square overflows float32) and
    every later refresh of Shampoo's roots or SOAP's bases fail: the update is skipped instead (warned
    at the next refresh, counted), the factors stay finite and the refreshes go on from them."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(4, 4, generator=gen).requires_grad_(), torch.randn(4, 4, generator=gen).requires_grad_()]
    optimizer = recipe(params, lr=0.01, precondition_frequency=2)
    for step in range(6):
        for p in params:
            p.grad = torch.randn(4, 4, generator=gen)
        if step == 2:
            params[0].grad[0, 0] = 1e30
        if step == 3:  # step 4 refreshes the roots or bases
            before = optimizer.state[params[0]][f"{prefix}.{derived}_left"].clone()
            with pytest.warns(RuntimeWarning, match="2 preconditioner factor update"):
                optimizer.step()
            assert not torch.equal(optimizer.state[params[0]][f"{prefix}.{derived}_left"], before)
        else:
            optimizer.step()
    assert optimizer.skipped_factor_updates == 2 and optimizer.eigh_failures == 0  # left and right, once
    state = optimizer.state[params[0]]
    assert all(state[f"{prefix}.{k}_{side}"].isfinite().all()
               for k in ("factor", derived) for side in ("left", "right"))
    assert all(p.isfinite().all() for p in params)


def _failing(recipe, prefix):
    """An optimizer of ``recipe`` that has skipped a factor update (a gradient row of 1e19: its
    squares sum past float32 in G G^T) and counted a failed refresh (its left factor set to 3e38)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(4, 4, generator=gen).requires_grad_()
    optimizer = recipe([p], lr=0.01, precondition_frequency=2)
    with pytest.warns(RuntimeWarning):
        for step in range(4):
            p.grad = torch.randn(4, 4, generator=gen)
            if step == 1:
                p.grad[0] = 1e19
            if step == 2:
                optimizer.state[p][f"{prefix}.factor_left"].fill_(3e38)
            optimizer.step()
    assert optimizer.eigh_failures >= 1 and optimizer.skipped_factor_updates >= 1
    return optimizer


def _counts(optimizer):
    return optimizer.eigh_failures, optimizer.skipped_factor_updates


@pytest.mark.parametrize("recipe, prefix", [(gradwise.Shampoo, "shampoo"), (gradwise.SOAP, "soap")])
def test_failure_counters_are_saved_in_state_dict(recipe, prefix):
    """eigh_failures and skipped_factor_updates are part of state_dict(): a fresh optimizer that loads
    it has the same counts (as do a deepcopy and a pickled copy); a checkpoint from before they were
    saved (no 'counters') loads with zeros."""
    optimizer = _failing(recipe, prefix)
    saved = optimizer.state_dict()
    fresh = recipe([torch.zeros(4, 4, requires_grad=True)], lr=0.01, precondition_frequency=2)
    fresh.load_state_dict(saved)
    assert _counts(fresh) == _counts(optimizer)
    for twin in (copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        assert _counts(twin) == _counts(optimizer)
    # as such a checkpoint saved them: under a top-level key, with no counters
    groups = [{k: v for k, v in group.items() if k != "gradwise"} for group in saved["param_groups"]]
    older = {k: v for k, v in saved["param_groups"][0]["gradwise"].items() if k != "counters"}
    fresh.load_state_dict({**saved, "param_groups": groups, "gradwise": older})
    assert _counts(fresh) == (0, 0)


@pytest.mark.parametrize("counters, error, text", [
    ({"shampoo.eigh_failures": -1}, ValueError, "['counters']['shampoo.eigh_failures']=-1: expected an integer >= 0"),
    ({"shampoo.eigh_failures": 1.5}, ValueError, "=1.5: expected an integer >= 0"),
    ({"soap.eigh_failures": 1}, ValueError, "has 'soap.eigh_failures', which Shampoo's chain does not count"),
    ([1, 2], TypeError, "['counters']=[1, 2]: expected a dict"),
])
def test_bad_saved_counters_are_refused_and_change_nothing(counters, error, text):
    optimizer = _failing(gradwise.Shampoo, "shampoo")
    saved = optimizer.state_dict()
    before, state = (*_counts(optimizer), optimizer.skipped_steps), copy.deepcopy(optimizer.state_dict())
    bad_counters = {**saved["param_groups"][0]["gradwise"], "skipped_steps": 7, "counters": counters}
    bad = {**saved, "param_groups": [{**group, "gradwise": bad_counters} for group in saved["param_groups"]]}
    with pytest.raises(error) as info:
        optimizer.load_state_dict(bad)
    assert text in str(info.value)
    assert (*_counts(optimizer), optimizer.skipped_steps) == before
    assert optimizer.state_dict()["param_groups"] == state["param_groups"]


def test_failed_eigendecomposition_keeps_previous_roots():
    """A factor so large (finite, 3e38) that its bias-corrected copy overflows: that block keeps its
    roots, warns and is counted; nothing becomes NaN."""
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(4, 4, generator=gen).requires_grad_()
    optimizer = gradwise.Shampoo([p], lr=0.01, precondition_frequency=2)
    for step in range(2):
        p.grad = torch.randn(4, 4, generator=gen)
        optimizer.step()
    roots = optimizer.state[p]["shampoo.root_left"].clone()
    optimizer.state[p]["shampoo.factor_left"].fill_(3e38)
    for step in range(2):
        p.grad = torch.randn(4, 4, generator=gen)
        if step == 1:
            with pytest.warns(RuntimeWarning, match="keep their previous inverse root"):
                optimizer.step()
        else:
            optimizer.step()
    assert optimizer.eigh_failures == 1
    assert torch.equal(optimizer.state[p]["shampoo.root_left"], roots) and p.isfinite().all()


def test_bad_arguments_name_the_value():
    p = [torch.zeros(3, 3, requires_grad=True)]
    for kwargs, text in [(dict(grafting="adamw"), "grafting='adamw'"),
                         (dict(precondition_frequency=0), "precondition_frequency=0"),
                         (dict(max_preconditioner_dim=2.5), "max_preconditioner_dim=2.5"),
                         (dict(betas=(0.9, 1.5)), r"betas=\(0.9, 1.5\)"), (dict(epsilon=0.0), "epsilon=0.0"),
                         (dict(start_preconditioning_step=0), "start_preconditioning_step=0"),
                         (dict(preconditioner_dtype=torch.float16), "preconditioner_dtype")]:
        with pytest.raises(ValueError, match=text):
            gradwise.Shampoo(p, **kwargs)


def _clone(params):
    return [p.detach().clone().requires_grad_() for p in params]


def test_finite_blocks_finds_nan_and_both_infinities_per_block():
    from gradwise.transforms.matrix_root import finite_blocks

    blocks = torch.randn(5, 3, 4, dtype=torch.float64)
    blocks[1, 2, 3], blocks[2, 0, 0], blocks[3, 1, 2] = float("nan"), float("inf"), -float("inf")
    assert finite_blocks(blocks).tolist() == [True, False, False, False, True]
    assert finite_blocks(blocks).tolist() == blocks.isfinite().all(dim=(-2, -1)).tolist()
