"""GaLore: galore-torch's GaLoreAdamW step by step, the projection wrapper around other chains, resume,
bad input, and the state it keeps."""
from __future__ import annotations

import warnings

import pytest
import torch

import gradwise
from gradwise.transforms import scale_by_learning_rate, trace
from gradwise.transforms.low_rank import PROJ_TYPES, project_low_rank
from tests.low_rank_helpers import (
    GAP,
    assert_resumes_bit_identically,
    groups,
    max_difference,
    model,
    state_bytes,
    train,
)

RANK = 3
#: Float32 tolerance. Both implementations round differently (matmul layouts, 1 - beta in float32 or
#: double), and the SVD turns a difference of d in the gradient into a basis difference of about
#: d ||G|| / (s_r - s_{r+1}) (the gap between the kept and the first dropped singular value). Worse, at
#: a refresh the projected gradient of the matrix it came from is diagonal for proj_type="full"
#: (A^T G B^T = diag(s)), so its off-diagonal entries are rounding noise (~1e-7) which Adam's
#: m / (sqrt(v) + eps) with eps = 1e-6 maps to O(0.01) against O(3) on the diagonal: a relative
#: difference of 1e-3 in that step's update, i.e. lr * scale * 3 * 1e-3 ~ 1e-5 absolute here.
#: Measured over these 25 steps: at most 1.4e-6 (std, reverse_std, left, right) and 8.8e-6 (full).
TOLERANCE = dict(rtol=1e-5, atol=2e-5)


def _galore_torch(params, **kwargs):
    from galore_torch import GaLoreAdamW

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bitsandbytes' notice that it runs without its CPU kernels
        return GaLoreAdamW(params, no_deprecation_warning=True, **kwargs)


def _projection(proj_type: str) -> dict:
    return dict(rank=RANK, update_proj_gap=GAP, scale=0.25, proj_type=proj_type)


@pytest.mark.parametrize("proj_type", PROJ_TYPES)
def test_matches_galore_torch_step_by_step(proj_type):
    pytest.importorskip("galore_torch")
    hyper = dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    net = model()
    ours = train(net, gradwise.GaLoreAdamW(groups(net, **_projection(proj_type)), compile=False, **hyper))
    net = model()
    theirs = train(net, _galore_torch(groups(net, **_projection(proj_type)), **hyper))
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for i, (x, y) in enumerate(zip(a, b)):
            torch.testing.assert_close(x, y, **TOLERANCE, msg=lambda m: f"step {step + 1}, tensor {i}: {m}")
    net = model()
    plain = train(net, gradwise.GaLoreAdamW(groups(net), compile=False, **hyper))
    assert max_difference(ours, plain) > 100 * TOLERANCE["atol"], "the projection changed nothing: vacuous test"


def test_state_lives_in_the_projected_space():
    net = model()
    optimizer = gradwise.GaLoreAdamW(groups(net, **_projection("std")), lr=0.01, compile=False)
    train(net, optimizer, 1)
    tall, wide = optimizer.state[net[0].weight], optimizer.state[net[2].weight]
    assert tall["galore.adam.exp_avg"].shape == (16, RANK)  # 16 x 8: the right side is projected away
    assert tall["galore.basis_right"].shape == (RANK, 8) and tall["galore.basis_left"].numel() == 0
    assert wide["galore.adam.exp_avg_sq"].shape == (RANK, 16)  # 12 x 16: the left side
    basis = wide["galore.basis_left"]
    torch.testing.assert_close(basis.T @ basis, torch.eye(RANK), rtol=0, atol=1e-5)
    assert optimizer.state[net[4].weight]["galore.adam.exp_avg"].shape == (1, 12)  # its group has no rank


def test_basis_is_refreshed_every_update_proj_gap_steps():
    net = model()
    optimizer = gradwise.GaLoreAdamW(groups(net, **_projection("std")), lr=0.01, compile=False)
    bases = []
    for step in range(2 * GAP + 1):
        train(net, optimizer, 1, first=step)
        bases.append(optimizer.state[net[0].weight]["galore.basis_right"].clone())
    changed = [step + 1 for step in range(1, len(bases)) if not torch.equal(bases[step], bases[step - 1])]
    assert changed == [1 + GAP, 1 + 2 * GAP]


def _momentum_run(transform, **projection) -> torch.Tensor:
    p = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    optimizer = gradwise.Optimizer([p], transform, lr=0.1, momentum=0.9, compile=False, **projection)
    for step in range(12):
        noise = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(step + 1))
        p.grad = torch.sin(p.detach() * (step + 1)) + noise
        optimizer.step()
    return p.detach()


def test_wraps_any_chain_full_rank_momentum_equals_momentum():
    """With the full rank and one basis (no refresh), projecting is a rotation and back: a linear
    inner chain such as heavy-ball momentum gives its unprojected trajectory."""
    projected = _momentum_run(gradwise.chain(project_low_rank(trace()), scale_by_learning_rate()),
                              rank=4, update_proj_gap=1000, proj_type="right")
    plain = _momentum_run(gradwise.chain(trace(), scale_by_learning_rate()))
    torch.testing.assert_close(projected, plain, rtol=1e-10, atol=1e-10)
    half = _momentum_run(gradwise.chain(project_low_rank(trace()), scale_by_learning_rate()),
                         rank=2, update_proj_gap=1000, proj_type="right")
    assert (half - plain).abs().max() > 1e-3, "a rank-2 projection must lose something"


def test_state_dict_resumes_bit_identically():
    saved = assert_resumes_bit_identically(
        lambda net: gradwise.GaLoreAdamW(groups(net, **_projection("full")), lr=0.01, weight_decay=0.1, compile=False))
    assert any("galore.basis_left" in s for s in saved["state"].values())


@pytest.mark.parametrize("key, value, allowed", [
    ("rank", 0, "None (no projection) or an integer >= 1"),
    ("rank", -2, "None (no projection) or an integer >= 1"),
    ("rank", 2.5, "None (no projection) or an integer >= 1"),
    ("update_proj_gap", 0, "an integer >= 1"),
    ("update_proj_gap", -5, "an integer >= 1"),
    ("proj_type", "middle", str(list(PROJ_TYPES))),
    ("scale", 0.0, "a finite number > 0"),
])
def test_bad_projection_settings_raise(key, value, allowed):
    net = model()
    with pytest.raises(ValueError, match=rf"invalid {key}={value!r}: expected .*") as info:
        gradwise.GaLoreAdamW(groups(net, **{**_projection("std"), key: value}), lr=0.01)
    assert allowed in str(info.value)
    with pytest.raises(ValueError, match=rf"invalid {key}={value!r}"):
        gradwise.GaLoreAdamW(net.parameters(), lr=0.01, **{key: value})


def test_rank_larger_than_the_matrix_raises_and_changes_nothing():
    net = model()
    optimizer = gradwise.GaLoreAdamW(groups(net, **{**_projection("std"), "rank": 9}), lr=0.01, compile=False)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(ValueError, match=r"invalid rank=9 for a parameter of shape \(16, 8\): expected an integer"
                                         r" in \[1, 8\]"):
        train(net, optimizer, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert len(optimizer.state) == 0, "a refused step left state behind"


def test_estimate_reports_the_small_state_it_allocates():
    net = model()
    projected = gradwise.GaLoreAdamW(groups(net, **_projection("std")), lr=0.01, compile=False)
    estimate = gradwise.estimate(net, projected)
    train(net, projected, 1)
    assert estimate.total == state_bytes(projected)
    net = model()
    full = gradwise.AdamW(net.parameters(), lr=0.01, compile=False)
    train(net, full, 1)
    # 16x8 keeps two 16x3 moments and a 3x8 basis, 12x16 two 3x16 moments and a 12x3 basis: 252
    # elements where AdamW keeps 2 * (128 + 192) = 640; the rest (biases, the head) is the same
    assert state_bytes(full) - estimate.total == 4 * (640 - 252)
    assert estimate.bytes_per_param < gradwise.estimate(net, gradwise.AdamW).bytes_per_param


def test_wrapper_takes_a_transform_whose_hyperparameters_do_not_clash():
    with pytest.raises(TypeError, match=r"inner=.* must be a Transform"):
        project_low_rank(lambda u: u)
    with pytest.raises(ValueError, match=r"inner declares \['proj_type', 'rank', 'scale', 'update_proj_gap'\]"):
        project_low_rank(project_low_rank(trace()))
