"""Muon: step by step equal to torch.optim.Muon on matrices, to a float64 reference written from the
paper, and to torch.optim.AdamW on the parameters it routes to AdamW."""
from __future__ import annotations

import pytest
import torch

import gradwise
from tests.references.muon import MuonReference, quintic_newton_schulz
from tests.test_parity import assert_trajectories_close, run_bag

STEPS = 40
SHAPES = [(16, 8), (8, 16), (16, 8), (5, 3), (12, 12), (12, 12)]  # repeats are batched together


def matrices(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(s, generator=gen, dtype=dtype) for s in SHAPES]
    tensors.append(torch.randn(6, 4, generator=gen, dtype=dtype).t())  # non-contiguous
    return [t.requires_grad_() for t in tensors]


def clone(params):
    return [p.detach().clone().requires_grad_() for p in params]


OPTIONS = [
    dict(lr=0.02),
    dict(lr=0.05, nesterov=False, weight_decay=0.0, momentum=0.9),
    dict(lr=0.01, adjust_lr_fn="match_rms_adamw", ns_steps=3, eps=1e-6),
]


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_matrices_match_torch_muon(options):
    params = matrices(torch.float32)
    ours = run_bag(lambda p: gradwise.Muon(p, **options), clone(params), torch.float32, STEPS)
    theirs = run_bag(lambda p: torch.optim.Muon(p, **options), clone(params), torch.float32, STEPS)
    assert_trajectories_close(ours, theirs, torch.float32)


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_float64_matches_reference_from_the_paper(options):
    params = matrices(torch.float64)
    ours = run_bag(lambda p: gradwise.Muon(p, ns_dtype=None, **options), clone(params), torch.float64, STEPS)
    theirs = run_bag(lambda p: MuonReference(p, **options), clone(params), torch.float64, STEPS)
    assert_trajectories_close(ours, theirs, torch.float64)


def test_newton_schulz_orthogonalizes():
    """With classic cubic coefficients and enough steps, NS converges to U V^T of the SVD."""
    g = torch.randn(6, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    ortho = quintic_newton_schulz(g, (1.5, -0.5, 0.0), 60, 1e-7)
    torch.testing.assert_close(ortho, u @ vh, rtol=0, atol=1e-9)
    ours = gradwise.orthogonalize_by_newton_schulz()
    ctx = gradwise.Context([g], [g], {"eps": torch.tensor(1e-7, dtype=torch.float64)},
                           {"ns_coefficients": (1.5, -0.5, 0.0), "ns_steps": 60, "ns_dtype": None})
    torch.testing.assert_close(ours.update([g.T.contiguous()], {}, ctx)[0], (u @ vh).T, rtol=0, atol=1e-9)


def test_non_matrices_follow_adamw():
    """1-D, 0-d and 4-D parameters go to AdamW with the adamw_* hyperparameters, instead of raising."""
    gen = torch.Generator().manual_seed(0)
    others = [torch.randn(s, generator=gen).requires_grad_() for s in [(7,), (), (2, 3, 4, 5)]]
    ours = run_bag(lambda p: gradwise.Muon(p, lr=0.02, adamw_lr=3e-3, adamw_betas=(0.8, 0.99), adamw_eps=1e-7,
                                           adamw_weight_decay=0.1), clone(others), torch.float32, STEPS)
    theirs = run_bag(lambda p: torch.optim.AdamW(p, lr=3e-3, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.1),
                     clone(others), torch.float32, STEPS)
    assert_trajectories_close(ours, theirs, torch.float32)
    with pytest.raises(ValueError, match="2D"):
        torch.optim.Muon(others, lr=0.02)


def test_mixed_model_matches_muon_plus_adamw():
    """A model whose embedding and head go to AdamW by name and its hidden matrices to Muon: one gradwise
    optimizer equals the Muon reference plus torch.optim.AdamW over the same split, in float64.

    (In float32 against torch.optim.Muon a training loop drifts: its bfloat16 Newton-Schulz turns the
    last-bit difference of where weight decay is rounded into bfloat16 rounding flips.)"""
    def model():
        torch.manual_seed(0)
        return torch.nn.ModuleDict(dict(embed=torch.nn.Embedding(10, 8), hidden=torch.nn.Linear(8, 8),
                                        hidden2=torch.nn.Linear(8, 8), head=torch.nn.Linear(8, 10))).double()

    def loss(m, step):
        tokens = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(step))
        h = torch.tanh(m["hidden2"](torch.tanh(m["hidden"](m["embed"](tokens)))))
        return torch.nn.functional.cross_entropy(m["head"](h), tokens.roll(1))

    ours_model, theirs_model = model(), model()
    ours = gradwise.Muon(ours_model.named_parameters(), lr=0.02, adamw_lr=1e-3, ns_dtype=None)
    assert [g["route"] for g in ours.param_groups] == ["matrix", "other"]
    assert ours.param_groups[0]["param_names"] == ["hidden.weight", "hidden2.weight"]
    assert [g["lr"] for g in ours.param_groups] == [0.02, 1e-3]
    hidden = [theirs_model["hidden"].weight, theirs_model["hidden2"].weight]
    rest = [p for p in theirs_model.parameters() if all(p is not q for q in hidden)]
    theirs = [MuonReference(hidden, lr=0.02), torch.optim.AdamW(rest, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)]
    for step in range(30):
        ours.zero_grad()
        loss(ours_model, step).backward()
        ours.step()
        theirs_model.zero_grad()
        loss(theirs_model, step).backward()
        for opt in theirs:
            opt.step()
    for a, b in zip(ours_model.parameters(), theirs_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_bad_arguments_name_the_value():
    p = [torch.zeros(3, 3, requires_grad=True)]
    with pytest.raises(ValueError, match="ns_steps=0"):
        gradwise.Muon(p, ns_steps=0)
    with pytest.raises(ValueError, match="adjust_lr_fn='rms'"):
        gradwise.Muon(p, adjust_lr_fn="rms")
    with pytest.raises(ValueError, match="ns_coefficients"):
        gradwise.Muon(p, ns_coefficients=(1.0, 2.0))
    with pytest.raises(ValueError, match="momentum=1.5"):
        gradwise.Muon(p, momentum=1.5)
