"""NorMuon: step by step equal to pytorch-optimizer's NorMuon (Newton-Schulz in bfloat16 on both sides)
and to a float64 reference written from the paper; its neuron-wise normalization balances the rows."""
from __future__ import annotations

import pytest
import torch

import gradwise
from tests.references.normuon import NorMuonReference
from tests.test_parity import assert_trajectories_close, run_bag

STEPS = 25
#: each matrix of its own shape: gradwise stacks same-shaped matrices into one batched bfloat16 iteration,
#: which rounds apart from pytorch-optimizer's one-matrix one (as from torch.optim.Muon's: tests/test_dropin.py)
MATRICES = [(16, 8), (8, 12), (5, 3), (12, 12), (7, 1)]


def tensors(dtype, vectors=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, generator=gen, dtype=dtype) for s in MATRICES]
    out.append(torch.randn(6, 4, generator=gen, dtype=dtype).t())  # non-contiguous
    if vectors:
        out += [torch.randn(s, generator=gen, dtype=dtype) for s in [(9,), (), (2, 3, 4)]]
    return [t.requires_grad_() for t in out]


def clone(params):
    return [p.detach().clone().requires_grad_() for p in params]


def pytorch_optimizers(params, **kwargs):
    """pytorch-optimizer's NorMuon over the same split as gradwise's: 2-D to NorMuon, the rest to AdamW."""
    from pytorch_optimizer import NorMuon

    groups = [dict(params=[p for p in params if p.dim() == 2], use_muon=True),
              dict(params=[p for p in params if p.dim() != 2], use_muon=False)]
    return NorMuon(groups, foreach=False, **kwargs)


OPTIONS = [
    dict(weight_decay=0.1, adamw_wd=0.05, adamw_lr=1e-3),
    dict(lr=0.01, momentum=0.9, beta2=0.9, nesterov=False, update_scale="match_rms", eps=1e-8, adamw_eps=1e-8,
         adamw_betas=(0.8, 0.99)),
    dict(use_adjusted_lr=True, ns_steps=4, weight_decay=0.05,
         ns_coeffs=[(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037)]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_matches_pytorch_optimizer(options, dtype):
    """Its Newton-Schulz runs in bfloat16 (not configurable), so ours does too; the gradients do not depend
    on the weights here, so the one-bit differences of where weight decay is rounded never reach a
    bfloat16 rounding, and float64 holds to 1e-10 over every step."""
    params = tensors(dtype)
    ours = run_bag(lambda p: gradwise.NorMuon(p, **options), clone(params), dtype, STEPS)
    theirs = run_bag(lambda p: pytorch_optimizers(p, **options), clone(params), dtype, STEPS)
    assert_trajectories_close(ours, theirs, dtype)


@pytest.mark.parametrize("options", [dict(weight_decay=0.1),
                                     dict(update_scale="match_rms", nesterov=False, beta2=0.8, lr=0.01)], ids=str)
def test_float64_matches_reference_from_the_paper(options):
    params = tensors(torch.float64, vectors=False)
    ours = run_bag(lambda p: gradwise.NorMuon(p, ns_dtype=None, **options), clone(params), torch.float64, STEPS)
    theirs = run_bag(lambda p: NorMuonReference(p, **options), clone(params), torch.float64, STEPS)
    assert_trajectories_close(ours, theirs, torch.float64)


def test_every_neuron_gets_the_same_step_size():
    """With beta2 = 0, v is this step's mean square of each row, so every row of the update has the same
    RMS: 0.2 in "match_rms" (the whole update's too); Muon's rows differ."""
    g = torch.randn(12, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    g[0] *= 30  # one neuron's gradient dominates
    steps = {}
    for name, make in [("normuon", lambda p: gradwise.NorMuon(p, lr=1.0, beta2=0.0, momentum=0.0, nesterov=False,
                                                              update_scale="match_rms", ns_dtype=None)),
                       ("muon", lambda p: gradwise.Muon(p, lr=1.0, momentum=0.0, nesterov=False, weight_decay=0.0,
                                                        ns_dtype=None))]:
        p = torch.zeros(12, 20, dtype=torch.float64, requires_grad=True)
        optimizer = make([p])
        p.grad = g.clone()
        optimizer.step()
        steps[name] = p.detach().pow(2).mean(dim=1).sqrt()
    torch.testing.assert_close(steps["normuon"], torch.full((12,), 0.2, dtype=torch.float64), rtol=1e-8, atol=0)
    assert steps["muon"].max() / steps["muon"].min() > 1.4  # 0.16 to 0.23 here


@pytest.mark.parametrize("kwargs, message", [
    (dict(beta2=1.0), r"beta2=1.0: expected a number in \[0, 1\)"),
    (dict(update_scale="rms"), r"update_scale='rms': expected one of \['preserve_norm', 'match_rms'\]"),
    (dict(eps=0.0), r"eps=0.0: expected a finite number > 0"),
    (dict(ns_coeffs=(1.0, 2.0)), r"ns_coefficients=\(1.0, 2.0\): expected a triple"),
    (dict(use_adjusted_lr=1), r"use_adjusted_lr=1: expected True or False"),
])
def test_bad_arguments_name_the_value(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        gradwise.NorMuon([torch.zeros(3, 3, requires_grad=True)], **kwargs)


def test_a_bad_beta2_set_before_a_step_changes_nothing():
    p = torch.zeros(4, 3, requires_grad=True)
    optimizer = gradwise.NorMuon([p])
    p.grad = torch.ones(4, 3)
    optimizer.param_groups[0]["beta2"] = float("nan")
    with pytest.raises(ValueError, match="beta2=nan"):
        optimizer.step()
    assert torch.equal(p, torch.zeros(4, 3)) and not optimizer.state
