"""gradwise under FSDP2 (``torch.distributed.fsdp.fully_shard``), for real: two CPU ranks over gloo.

One spawn runs every check, so torch is imported and the process group built once:

* every elementwise recipe (the registry's entries declaring ``fsdp2``) steps a sharded MLP (uneven
  shards, an empty shard, biases) exactly as the same recipe steps an unsharded copy fed the same
  gradients (eager, and compiled for AdamW);
* ``optimizer.state_dict()`` holds the param-shaped state as DTensors sharded like their parameters,
  and a per-rank ``torch.save``/``torch.load(weights_only=True)`` round trip into a fresh sharded
  optimizer resumes bit-identically (for NAdamW also a ``torch.distributed.checkpoint`` round trip);
* ``skip_nonfinite`` skips the step on every rank when only one rank's shard of the gradient is NaN;
* every recipe that needs whole tensors (the registry's entries without ``fsdp2``; Ranger21 also with
  MADGRAD and AdaBelief) raises ``NotImplementedError`` and changes nothing.

Failures inside a rank are re-raised here with that rank's traceback; a hung rank is bounded by the
process group's timeout and by a deadline on the join, after which the ranks are killed.
"""
from __future__ import annotations

import copy
import io
import os

import pytest
import torch

from gradwise import Ranger21
from tests.distributed_harness import labelled, needs_gloo, spawn
from tests.registry import ENTRY, ONE_PER_RECIPE

pytestmark = [pytest.mark.slow, needs_gloo]

WORLD_SIZE = 2
STEPS = 10
RESUME_STEPS = 3
RTOL, ATOL = 1e-5, 1e-6

#: the recipes also run compiled (a compile in each rank is what this test's time allows)
COMPILED = ("AdamW",)
#: (label, recipe name, keyword arguments, compile): one registry case of each recipe declared to step
#: FSDP2 shards (tests/registry.py; learning rates large enough that 10 steps move every parameter well
#: beyond the tolerance), eagerly, and compiled for those in COMPILED
CASES = [(c.name + ("[compiled]" if compiled else ""), c.recipe.__name__, {**c.entry.required, **c.kwargs}, compiled)
         for c in ONE_PER_RECIPE if c.entry.fsdp2 for compiled in (False, True)
         if not compiled or c.recipe.__name__ in COMPILED]
#: (label, recipe name, keyword arguments) of the recipes that need whole tensors, which refuse shards
REFUSING = [(c.name, c.recipe.__name__, {**c.entry.required, **c.kwargs}) for c in ONE_PER_RECIPE if not c.entry.fsdp2]
REFUSING += [("ranger21-" + option, "Ranger21", {**ENTRY[Ranger21].required, option: True})
             for option in ("use_madgrad", "use_adabelief")]
#: cases also resumed through torch.distributed.checkpoint (NAdamW: it keeps 0-d state besides "step")
DCP_CASES = ("nadamw",)


# --------------------------------------------------------------------------- inside each rank
def _mlp() -> torch.nn.Sequential:
    """Dims 7, 3 and 1 do not split evenly over 2 ranks; rank 1 holds nothing of the last layer."""
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 7),
        torch.nn.Tanh(),
        torch.nn.Linear(7, 3),
        torch.nn.Tanh(),
        torch.nn.Linear(3, 1),
    )


def _shard(model: torch.nn.Sequential, mesh) -> torch.nn.Sequential:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def _sharded_backward(model, step: int, rank: int) -> None:
    x, y = _batch(step, rank)
    torch.nn.functional.mse_loss(model(x), y).backward()


def _reference_backward(model, step: int) -> None:
    """The gradient FSDP2 gives the sharded model: the mean over ranks of each rank's gradient."""
    params = list(model.parameters())
    per_rank = []
    for rank in range(WORLD_SIZE):
        x, y = _batch(step, rank)
        per_rank.append(torch.autograd.grad(torch.nn.functional.mse_loss(model(x), y), params))
    for p, *grads in zip(params, *per_rank):
        p.grad = torch.stack(grads).sum(0) / WORLD_SIZE


def _full(p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return p.full_tensor() if isinstance(p, DTensor) else p.detach()


def _assert_close(label: str, what: str, sharded, reference, exact: bool = False) -> None:
    for (name, p), q in zip(sharded.named_parameters(), reference.parameters()):
        actual, expected = _full(p), _full(q)
        if exact:
            assert torch.equal(actual, expected), (
                f"{label}: {what}: {name} differs (max abs diff {(actual - expected).abs().max().item():.3g})"
            )
        else:
            torch.testing.assert_close(
                actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m, name=name: f"{label}: {what}: {name}: {m}"
            )


def _assert_grads_close(label: str, sharded, reference) -> None:
    for (name, p), q in zip(sharded.named_parameters(), reference.parameters()):
        torch.testing.assert_close(
            _full(p.grad), q.grad, rtol=RTOL, atol=ATOL,
            msg=lambda m, name=name: f"{label}: gradients already differ before the step: {name}: {m}",
        )


def _check_state_dict(label: str, model, optimizer) -> None:
    """A rank saves the keys it keeps (``keys_here``): param-shaped state of the links that run on shards
    as DTensors sharded like their parameter, the state of whole-tensor links as whole tensors on the
    parameter's owner only."""
    from torch.distributed.tensor import DTensor

    saved = optimizer.state_dict()
    params = list(model.parameters())
    assert set(saved["state"]) == set(range(len(params))), f"{label}: state_dict lacks some parameters' state"
    for index, p in enumerate(params):
        group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
        here = optimizer.keys_here(p, group)
        owner = optimizer.owner(p)
        for key, value in saved["state"][index].items():
            assert key == "step" or key.split("@")[0] in here, f"{label}: rank saves state[{index}][{key!r}]"
            if isinstance(value, DTensor):
                assert value.placements == p.placements and value.device_mesh == p.device_mesh, (
                    f"{label}: state[{index}][{key!r}] placed {value.placements}, its parameter {p.placements}")
                assert value.to_local().shape == p.to_local().shape, f"{label}: state[{index}][{key!r}] local shape"
            elif value.shape == p.shape and value.dim() > 0:
                assert owner == p.device_mesh.get_local_rank(), (
                    f"{label}: state[{index}][{key!r}] is a whole tensor on a rank that does not own {index}")


def _fresh_copy(model, mesh):
    """A new sharded model holding ``model``'s parameters (built from a different init)."""
    torch.manual_seed(1)
    fresh = _shard(_mlp(), mesh)
    with torch.no_grad():
        for p, q in zip(fresh.parameters(), model.parameters()):
            p.to_local().copy_(q.to_local())
    return fresh


def _resume_from_torch_save(model, optimizer, factory, kwargs, compiled, mesh):
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)  # each rank saves its own shards
    buffer.seek(0)
    resumed = _fresh_copy(model, mesh)
    resumed_optimizer = factory(resumed.parameters(), compile=compiled, **kwargs)
    resumed_optimizer.load_state_dict(torch.load(buffer, weights_only=True))
    return resumed, resumed_optimizer


def _resume_from_dcp(model, optimizer, factory, kwargs, compiled, mesh, directory):
    """Through torch.distributed.checkpoint, as a training loop would save a sharded optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=directory)
    resumed = _fresh_copy(model, mesh)
    resumed_optimizer = factory(resumed.parameters(), compile=compiled, **kwargs)
    target = {"optimizer": get_optimizer_state_dict(resumed, resumed_optimizer)}
    dcp.load(target, checkpoint_id=directory)
    set_optimizer_state_dict(resumed, resumed_optimizer, target["optimizer"])
    return resumed, resumed_optimizer


def _run_case(label: str, recipe: str, kwargs: dict, compiled: bool, rank: int, mesh, dcp_dir: str | None) -> None:
    import gradwise

    factory = getattr(gradwise, recipe)
    torch.manual_seed(0)
    reference = _mlp()
    model = _shard(copy.deepcopy(reference), mesh)
    initial = [_full(p).clone() for p in model.parameters()]
    _assert_close(label, "initial parameters", model, reference, exact=True)
    rows = [p.to_local().shape[0] for p in model.parameters()]
    expected_rows = [-(-n // WORLD_SIZE) if rank == 0 else n // WORLD_SIZE for n in (16, 16, 7, 7, 3, 3, 1, 1)]
    assert rows == expected_rows, f"rank {rank} holds rows {rows}, not the uneven shards {expected_rows}"

    optimizer = factory(model.parameters(), compile=compiled, **kwargs)
    reference_optimizer = factory(reference.parameters(), compile=False, **kwargs)  # the eager reference
    for step in range(STEPS):
        _sharded_backward(model, step, rank)
        _reference_backward(reference, step)
        if step == 0:
            _assert_grads_close(label, model, reference)
        optimizer.step()
        reference_optimizer.step()
        optimizer.zero_grad()
        reference_optimizer.zero_grad()
    _assert_close(label, f"parameters after {STEPS} steps", model, reference)
    for (name, p), before in zip(model.named_parameters(), initial):
        assert (_full(p) - before).abs().max() > 100 * ATOL, f"{label}: {name} barely moved; the test is vacuous"
    if compiled:
        assert optimizer.compile_stats["compiles"] >= 1, f"{label}: compile=True but nothing was compiled"

    # save, load into a fresh sharded model and optimizer, and go on stepping alongside the original
    _check_state_dict(label, model, optimizer)
    resumed = {"torch.save": _resume_from_torch_save(model, optimizer, factory, kwargs, compiled, mesh)}
    if dcp_dir is not None:
        resumed["DCP"] = _resume_from_dcp(model, optimizer, factory, kwargs, compiled, mesh, dcp_dir)
    for how, (resumed_model, resumed_optimizer) in resumed.items():
        _check_state_dict(f"{label}, loaded via {how}", resumed_model, resumed_optimizer)
    for step in range(STEPS, STEPS + RESUME_STEPS):
        for m, opt in [(model, optimizer), *resumed.values()]:
            _sharded_backward(m, step, rank)
            opt.step()
            opt.zero_grad()
        _reference_backward(reference, step)
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    for how, (resumed_model, _) in resumed.items():
        _assert_close(label, f"run resumed via {how} vs uninterrupted run", resumed_model, model, exact=True)
    _assert_close(label, f"parameters after {STEPS + RESUME_STEPS} steps", model, reference)


def _run_skip_nonfinite(rank: int, mesh) -> None:
    """A NaN in rank 0's shard only: every rank must skip, or the ranks' parameters and step counts part."""
    import gradwise

    label = "AdamW(skip_nonfinite)"
    torch.manual_seed(0)
    reference = _mlp()
    model = _shard(copy.deepcopy(reference), mesh)
    optimizer = gradwise.AdamW(model.parameters(), lr=0.01, skip_nonfinite=True, compile=False)
    reference_optimizer = gradwise.AdamW(reference.parameters(), lr=0.01, skip_nonfinite=True, compile=False)
    for step in range(3):
        _sharded_backward(model, step, rank)
        _reference_backward(reference, step)
        if step == 1:
            first = next(model.parameters())
            if rank == 0:
                first.grad.to_local()[0, 0] = float("nan")
            next(reference.parameters()).grad[0, 0] = float("nan")
        optimizer.step()
        reference_optimizer.step()
        optimizer.zero_grad()
        reference_optimizer.zero_grad()
    assert reference_optimizer.skipped_steps == 1
    assert optimizer.skipped_steps == 1, f"{label}: rank {rank} skipped {optimizer.skipped_steps} steps, not 1"
    _assert_close(label, "parameters after a step skipped on one rank's NaN", model, reference)
    steps = [float(optimizer.state[p]["step"]) for p in model.parameters()]
    assert steps == [2.0] * len(steps), f"{label}: rank {rank} step counts {steps}"


def _run_refusals(rank: int, mesh) -> None:
    """Recipes that read whole tensors (norms, factored moments, matrices, Ranger21's standard deviations
    and its mean over every parameter) raise on shards, naming what they need, before anything changes."""
    import gradwise

    torch.manual_seed(0)
    model = _shard(_mlp(), mesh)
    for label, recipe, kwargs in REFUSING:
        optimizer = getattr(gradwise, recipe)(model.parameters(), compile=False, **kwargs)
        _sharded_backward(model, 0, rank)
        before = [p.to_local().clone() for p in model.parameters()]
        try:
            optimizer.step()
        except NotImplementedError as error:
            assert "FSDP2" in str(error) and "whole tensors" in str(error), f"{label}: {error}"
        else:
            raise AssertionError(f"{label} stepped on DTensor shards")
        assert all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters())), label
        assert not optimizer.state or all(float(st.get("step", 0)) == 0 for st in optimizer.state.values()), label
        optimizer.zero_grad()


def _worker(rank: int, world_size: int, directory: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    for case in CASES:
        try:
            dcp_dir = os.path.join(directory, case[0]) if case[0] in DCP_CASES else None
            _run_case(*case, rank=rank, mesh=mesh, dcp_dir=dcp_dir)
        except Exception as error:
            labelled(error, rank, case[0])
            raise
    _run_skip_nonfinite(rank, mesh)
    _run_refusals(rank, mesh)


# --------------------------------------------------------------------------- the test
def test_elementwise_recipes_match_unsharded_under_fsdp2(tmp_path):
    spawn(_worker, WORLD_SIZE, str(tmp_path))
