"""APOLLO and APOLLO-Mini: apollo-torch step by step (same seeds, same draws), the limiter, resume,
bad input, the state they keep, and FSDP2's refusal."""
from __future__ import annotations

import warnings

import pytest
import torch

import gradwise
from gradwise.transforms.apollo import PROJ_TYPES, next_seed
from tests.low_rank_helpers import (
    GAP,
    assert_resumes_bit_identically,
    groups,
    max_difference,
    model,
    state_bytes,
    train,
)

TOLERANCE = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-6)}
APOLLO = dict(rank=4, update_proj_gap=GAP, scale=1.0, proj_type="std", scale_type="channel")
MINI = dict(rank=1, update_proj_gap=GAP, scale=128.0, proj_type="std", scale_type="tensor")


def _apollo_torch(params, **kwargs):
    from apollo_torch import APOLLOAdamW

    for group in params:
        if "rank" in group:
            group.setdefault("proj", "random")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bitsandbytes' notice that it runs without its CPU kernels
        return APOLLOAdamW(params, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("projection, options", [
    (APOLLO, {}), (APOLLO, dict(scale_front=True)), (APOLLO, dict(disable_nl=True)), (MINI, {}),
], ids=["apollo", "apollo-scale_front", "apollo-no-limiter", "apollo-mini"])
def test_matches_apollo_torch_step_by_step(projection, options, dtype):
    """The random projections are drawn as apollo-torch draws them (seed = parameter index + 1, the
    next seed from 15 int64 draws), so float64 agrees to 1e-10: there is no SVD to amplify rounding."""
    pytest.importorskip("apollo_torch")
    hyper = dict(lr=0.01, weight_decay=0.1, **options)
    ours, theirs = _both(dtype, hyper, projection)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for i, (x, y) in enumerate(zip(a, b)):
            torch.testing.assert_close(x, y, **TOLERANCE[dtype], msg=lambda m: f"step {step + 1}, tensor {i}: {m}")
    net = model(dtype)
    plain = train(net, gradwise.APOLLO(groups(net), compile=False, **hyper))
    assert max_difference(ours, plain) > 1e-3, "APOLLO changed nothing against AdamW: vacuous test"


def _both(dtype, hyper, projection):
    net = model(dtype)
    ours = train(net, gradwise.APOLLO(groups(net, **projection), compile=False, **hyper))
    net = model(dtype)
    return ours, train(net, _apollo_torch(groups(net, **projection), **hyper))


@pytest.mark.parametrize("projection", [APOLLO, MINI], ids=["apollo", "apollo-mini"])
def test_svd_projection_matches_apollo_torch(projection):
    """``proj="svd"`` (GaLore's basis, then APOLLO's scaling), float32 within the tolerance GaLore's
    parity needs (tests/test_galore.py says why an SVD of rounded inputs needs more than 1e-6)."""
    pytest.importorskip("apollo_torch")
    ours, theirs = _both(torch.float32, dict(lr=0.01, weight_decay=0.1), {**projection, "proj": "svd"})
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for i, (x, y) in enumerate(zip(a, b)):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=2e-5, msg=lambda m: f"step {step + 1}, tensor {i}: {m}")
    random, _ = _both(torch.float32, dict(lr=0.01, weight_decay=0.1), projection)
    assert max_difference(ours, random) > 1e-3, "proj='svd' ran the random projection"


def test_norm_growth_limiter_acts():
    net = model()
    limited = gradwise.APOLLO(groups(net, **APOLLO), lr=0.01, compile=False)
    with_limiter = train(net, limited)
    net = model()
    without = train(net, gradwise.APOLLO(groups(net, **APOLLO), lr=0.01, disable_nl=True, compile=False))
    assert max_difference(with_limiter, without) > 1e-4
    assert all(float(limited.state[p]["apollo.limiter_norm"]) > 0 for p in limited.param_groups[1]["params"])


def test_apollo_mini_defaults_project_every_matrix_to_rank_one():
    net = model()
    optimizer = gradwise.APOLLOMini(net.parameters(), lr=0.01, compile=False)
    train(net, optimizer, 1)
    assert optimizer.state[net[0].weight]["apollo.adam.exp_avg"].shape == (16, 1)  # tall: right side projected
    assert optimizer.state[net[2].weight]["apollo.adam.exp_avg"].shape == (1, 16)  # wide: left side
    assert optimizer.state[net[4].weight]["apollo.adam.exp_avg"].shape == (1, 12)
    assert optimizer.state[net[0].bias]["apollo.adam.exp_avg"].shape == (16,)


def test_seeds_are_parameter_indices_and_advance_at_each_redraw():
    net = model()
    optimizer = gradwise.APOLLO(groups(net, **APOLLO), lr=0.01, compile=False)
    train(net, optimizer, GAP)
    seeds = {i: int(optimizer.state[p]["apollo.seed"]) for i, p in enumerate(optimizer.param_groups[1]["params"])}
    assert seeds == {0: 5, 1: 6}  # four parameters in the first group, then these two (index + 1)
    train(net, optimizer, GAP, first=GAP)  # a redraw at step GAP + 1
    assert int(optimizer.state[net[0].weight]["apollo.seed"]) == next_seed(5)


def test_state_dict_resumes_bit_identically():
    saved = assert_resumes_bit_identically(
        lambda net: gradwise.APOLLO(groups(net, **APOLLO), lr=0.01, weight_decay=0.1, compile=False))
    assert any(int(s.get("apollo.seed", 0)) > 6 for s in saved["state"].values()), "no redraw before the checkpoint"
    assert_resumes_bit_identically(lambda net: gradwise.APOLLOMini(net.parameters(), lr=0.01, compile=False))
    assert_resumes_bit_identically(
        lambda net: gradwise.APOLLO(groups(net, **APOLLO, proj="svd"), lr=0.01, compile=False))


@pytest.mark.parametrize("key, value, allowed", [
    ("rank", 0, "None (no projection) or an integer >= 1"),
    ("rank", -1, "None (no projection) or an integer >= 1"),
    ("update_proj_gap", 0, "an integer >= 1"),
    ("proj_type", "full", str(list(PROJ_TYPES))),
    ("scale_type", "row", "['channel', 'tensor']"),
    ("proj", "qr", "['random', 'svd']"),
])
def test_bad_projection_settings_raise(key, value, allowed):
    net = model()
    with pytest.raises(ValueError, match=rf"invalid {key}={value!r}: expected .*") as info:
        gradwise.APOLLO(groups(net, **{**APOLLO, key: value}), lr=0.01)
    assert allowed in str(info.value)
    with pytest.raises(ValueError, match=rf"invalid {key}={value!r}"):
        gradwise.APOLLOMini(net.parameters(), lr=0.01, **{key: value})


def test_rank_larger_than_the_projected_side_raises_and_changes_nothing():
    net = model()
    optimizer = gradwise.APOLLO(groups(net, **{**APOLLO, "rank": 9}), lr=0.01, compile=False)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(ValueError, match=r"invalid rank=9 for a parameter of shape \(16, 8\): expected an integer"
                                         r" in \[1, 8\]"):
        train(net, optimizer, 1)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert len(optimizer.state) == 0


def test_estimate_reports_the_small_state_it_allocates():
    net = model()
    optimizer = gradwise.APOLLOMini(net.parameters(), lr=0.01, compile=False)
    estimate = gradwise.estimate(net, optimizer)
    train(net, optimizer, 1)
    assert estimate.total == state_bytes(optimizer)
    # per matrix: two moments as long as its longer side (16, 16, 12), a 0-d int64 seed and a 0-d norm;
    # per bias: two moments of its length (16, 12, 1), the seed and the norm; and every step counter
    elements = 2 * (16 + 16 + 12) + 2 * (16 + 12 + 1)
    assert estimate.total == 4 * elements + 6 * (8 + 4 + 4)
    assert estimate.by("format")["int64"] == 6 * 8 and "torch." not in estimate.table()


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [gradwise.APOLLO, gradwise.GaLoreAdamW])
def test_a_one_rank_fsdp2_mesh_steps_as_unsharded(recipe, tmp_path):
    """On a one-rank mesh every DTensor holds its whole tensor: the step runs as on plain tensors, bit for
    bit (sharded meshes: tests/test_fsdp2.py)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs torch.distributed with gloo")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        sharded, plain = model(), model()
        fully_shard(sharded, mesh=init_device_mesh("cpu", (1,)))
        train(sharded, recipe(groups(sharded, rank=2, update_proj_gap=2), lr=0.01, compile=False), 4)
        train(plain, recipe(groups(plain, rank=2, update_proj_gap=2), lr=0.01, compile=False), 4)
        for p, q in zip(sharded.parameters(), plain.parameters()):
            assert torch.equal(p.full_tensor(), q.detach())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("recipe", [gradwise.APOLLO, gradwise.GaLoreAdamW])
def test_bfloat16_parameters_step_with_float32_state(recipe):
    net = model().to(torch.bfloat16)
    optimizer = recipe(groups(net, rank=2, update_proj_gap=2), lr=0.01, compile=False)
    before = net[0].weight.detach().clone()
    train(net, optimizer, 3)
    assert not torch.equal(before, net[0].weight) and net[0].weight.dtype == torch.bfloat16
    for key, value in optimizer.state[net[0].weight].items():
        assert value.dtype in (torch.float32, torch.int64), (key, value.dtype)
        assert value.isfinite().all(), key
