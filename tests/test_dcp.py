"""Checkpoints through ``torch.distributed.checkpoint`` (DCP), resharded: saved at one world size, resumed
at another, bit-identically.

Each case steps an FSDP2 model (``fully_shard``; uneven shards, and at 4 ranks an empty one) SAVE_AT times,
saves model and optimizer as a training loop does (``get_state_dict``, ``dcp.save``) and is resumed into a
fresh model and optimizer (``get_state_dict`` of the fresh pair, which makes DCP run its zero-gradient,
lr=0 step on the fresh optimizer; ``dcp.load``; ``set_state_dict``). After RESUME_STEPS more steps every
parameter, gathered, must equal an uninterrupted unsharded run bit for bit, and the optimizer's mode and
``skipped_steps`` must be the saved ones. Gradients are given, not made by a backward: a function of the
gathered parameters and the step, so they are the same at every world size (FSDP2's reduce-scatter sums
the ranks' gradients in an order that depends on it, which no optimizer could undo).

The module spawns once per world size; in order:

1. here, with no process group: each case saved from a plain model, and resumed into one (1 -> 1);
   then, on a 1-rank gloo group, each case saved from an FSDP2 model on a 1-rank mesh;
2. 2 ranks: each case saved at 2 ranks, and resumed from 1 rank (1 -> 2) and from 2 (2 -> 2);
3. here: resumed from 2 ranks into a 1-rank FSDP2 model and into a plain model (2 -> 1);
4. 4 ranks: resumed from 2 ranks (2 -> 4).

Every process records each resume it verified, and a test per case checks that all were recorded.
Before those, on one process and no storage, every recipe of the registry goes through DCP's state-dict
API: the zero-gradient, lr=0 step DCP runs on a fresh optimizer moves no parameter, and
``set_optimizer_state_dict`` gives back everything ``get_optimizer_state_dict`` took, mode included.
"""
from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pytest
import torch

from tests.distributed_harness import labelled, needs_gloo, spawn
from tests.registry import ONE_PER_RECIPE

#: DCP's warning that a plain model's checkpoint is saved and loaded without a process group
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

SAVE_AT = 4
RESUME_STEPS = 3



@dataclass(frozen=True)
class Case:
    """A recipe and what its run does besides stepping: ``eval_at_save`` saves it in eval mode (it is
    resumed in eval mode, then ``train()`` and steps); ``nan_at`` is a step whose gradient holds a NaN in
    rank 0's shard only (with ``skip_nonfinite``: skipped on every rank, and counted); ``into_plain``: a
    sharded checkpoint also loads into a plain model (not encoded state, whose parts are laid out by rows
    on shards and flat on a plain model, and are not converted between the two)."""

    name: str
    recipe: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    eval_at_save: bool = False
    nan_at: int | None = None
    into_plain: bool = True


CASES = [
    Case("adamw", "AdamW", dict(lr=0.01, weight_decay=0.1)),
    Case("schedule-free-adamw-eval", "ScheduleFreeAdamW", dict(lr=0.05, warmup_steps=2), eval_at_save=True),
    Case("nadamw", "NAdamW", dict(lr=0.01, weight_decay=0.1)),
    Case("adamw-skip-nonfinite", "AdamW", dict(lr=0.01, skip_nonfinite=True), nan_at=1),
    Case("adamw-int8", "AdamW", dict(lr=0.01, state="int8"), into_plain=False),
    Case("muon", "Muon", dict(lr=0.02)),
    Case("muon-int8", "Muon", dict(lr=0.02, state="int8"), into_plain=False),
    Case("shampoo", "Shampoo", dict(lr=0.01, precondition_frequency=2)),
]
#: every resume, by (saved at, resumed at) and the model it was resumed into, with the ranks that record it
RESUMES = {"1->1 plain": 1, "1->2": 2, "2->2": 2, "2->1": 1, "2->1 plain": 1, "2->4": 4}


# --------------------------------------------------------------------------- one process's part
def _mlp(seed: int) -> torch.nn.Sequential:
    """The middle weight (65 x 64) is large enough for encoded state; 65 and 3 rows shard unevenly, and the
    last layer leaves rank 3 of 4 nothing."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 65), torch.nn.Tanh(),
                               torch.nn.Linear(65, 3))


def _model(seed: int, mesh) -> torch.nn.Sequential:
    """A fresh model, sharded with ``fully_shard`` over ``mesh`` (None: a plain model)."""
    model = _mlp(seed)
    if mesh is not None:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def _optimizer(case: Case, model):
    import gradwise

    return getattr(gradwise, case.recipe)(model.parameters(), compile=False, **case.kwargs)


def _full(p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return p.detach().full_tensor() if isinstance(p, DTensor) else p.detach().clone()


def _step(model, optimizer, step: int, nan_at: int | None = None) -> None:
    """One step, on gradients 0.1 p + noise(step) of the gathered parameters, given to each rank as its
    shard; at step ``nan_at``, the first parameter's first element is NaN (in rank 0's shard only)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = list(model.parameters())
    noise = torch.Generator().manual_seed(step)
    for index, p in enumerate(params):
        full = _full(p)
        grad = 0.1 * full + torch.randn(full.shape, generator=noise)
        if step == nan_at and index == 0:
            grad[0, 0] = float("nan")
        p.grad = distribute_tensor(grad, p.device_mesh, p.placements, src_data_rank=None) \
            if isinstance(p, DTensor) else grad
    optimizer.step()
    optimizer.zero_grad()


def _up_to_the_save(case: Case, mesh):
    """A fresh model (sharded over ``mesh``, or plain) and the case's optimizer, stepped ``SAVE_AT`` times and
    put in the mode the case is saved in."""
    model = _model(0, mesh)
    optimizer = _optimizer(case, model)
    for step in range(SAVE_AT):
        _step(model, optimizer, step, case.nan_at)
    if case.eval_at_save:
        optimizer.eval()
    return model, optimizer


@lru_cache(maxsize=None)
def _uninterrupted(name: str) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """The unsharded run of case ``name`` that is never saved: its parameters at the save (in the mode
    saved) and at the end, and the steps it skipped."""
    case = next(c for c in CASES if c.name == name)
    model, optimizer = _up_to_the_save(case, None)
    at_save = [_full(p) for p in model.parameters()]
    optimizer.train()
    for step in range(SAVE_AT, SAVE_AT + RESUME_STEPS):
        _step(model, optimizer, step, case.nan_at)
    return at_save, [_full(p) for p in model.parameters()], optimizer.skipped_steps


def _assert_equal(case: Case, what: str, model, expected: list[torch.Tensor]) -> None:
    for (name, p), want in zip(model.named_parameters(), expected):
        have = _full(p)
        assert torch.equal(have, want), (f"{case.name}: {what}: {name} differs from the uninterrupted unsharded run"
                                         f" (max abs diff {(have - want).abs().max().item():.3g})")


def _save(case: Case, mesh, directory: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer = _up_to_the_save(case, mesh)
    _assert_equal(case, "parameters when saved", model, _uninterrupted(case.name)[0])
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=os.path.join(directory, case.name))


def _resume(case: Case, mesh, directory: str, resume: str, rank: int, verified: str) -> None:
    """Load ``case`` from ``directory`` into a fresh model on ``mesh``, step on, compare, and record it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    at_save, final, skipped = _uninterrupted(case.name)
    model = _model(1, mesh)
    optimizer = _optimizer(case, model)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    loaded = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(loaded, checkpoint_id=os.path.join(directory, case.name))
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
    mode = "eval" if case.eval_at_save else "train"
    saved_skips = int(case.nan_at is not None and case.nan_at < SAVE_AT)
    assert (optimizer.mode, optimizer.skipped_steps) == (mode, saved_skips), (
        f"{case.name} {resume}: resumed in mode {optimizer.mode!r} with skipped_steps={optimizer.skipped_steps};"
        f" saved in {mode!r} with {saved_skips}")
    _assert_equal(case, f"{resume}: parameters as loaded", model, at_save)
    optimizer.train()
    for step in range(SAVE_AT, SAVE_AT + RESUME_STEPS):
        _step(model, optimizer, step, case.nan_at)
    _assert_equal(case, f"{resume}: parameters after {RESUME_STEPS} steps resumed", model, final)
    assert optimizer.skipped_steps == skipped, f"{case.name} {resume}: skipped_steps={optimizer.skipped_steps}"
    with open(os.path.join(verified, f"{case.name} {resume} rank {rank}"), "w"):
        pass


def _labelled(case: Case, what: str, rank: int, run) -> None:
    try:
        run()
    except Exception as error:
        labelled(error, rank, f"{case.name}, {what}")
        raise


def _two_ranks(rank: int, world_size: int, root: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    for case in CASES:
        _labelled(case, "save at 2", rank, lambda: _save(case, mesh, os.path.join(root, "2")))
        for saved_at in ("1", "2"):
            _labelled(case, f"{saved_at}->2", rank, lambda: _resume(
                case, mesh, os.path.join(root, saved_at), f"{saved_at}->2", rank, os.path.join(root, "verified")))


def _four_ranks(rank: int, world_size: int, root: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    for case in CASES:
        _labelled(case, "2->4", rank, lambda: _resume(
            case, mesh, os.path.join(root, "2"), "2->4", rank, os.path.join(root, "verified")))


@contextlib.contextmanager
def _one_rank():
    """A 1-rank gloo process group in this process, and a 1-rank mesh over it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- the tests
def _trained(case, steps: int = 3):
    model = _mlp(0)
    optimizer = case.entry.build(model.parameters(), compile=False, **case.kwargs)
    for step in range(steps):
        _step(model, optimizer, step)
    return model, optimizer


@pytest.mark.parametrize("case", ONE_PER_RECIPE, ids=lambda c: c.name)
def test_the_step_dcp_runs_on_a_fresh_optimizer_moves_no_parameter(case):
    """``get_optimizer_state_dict`` of an optimizer with no state first steps it with zero gradients and
    lr=0; ``set_state_dict`` does so after it has loaded the model, so that step must leave it as it was."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    model, optimizer = _trained(case, steps=0)
    before = [p.detach().clone() for p in model.parameters()]
    get_optimizer_state_dict(model, optimizer)
    assert optimizer.state, f"{case.name}: DCP ran no step; this test checks nothing"
    moved = [name for (name, p), q in zip(model.named_parameters(), before) if not torch.equal(p, q)]
    assert not moved, f"{case.name}: DCP's zero-gradient, lr=0 step moved {moved}"


@pytest.mark.parametrize("case", ONE_PER_RECIPE, ids=[c.name for c in ONE_PER_RECIPE])
def test_set_optimizer_state_dict_gives_back_what_get_optimizer_state_dict_took(case):
    """Saved in eval mode into an optimizer that DCP has stepped once (zero gradients, lr=0): the state,
    the groups and the mode are the saved ones, and both optimizers, back in train mode, step alike."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    model, optimizer = _trained(case)
    optimizer.eval()
    saved = copy.deepcopy(get_optimizer_state_dict(model, optimizer))  # it holds the optimizer's own tensors
    twin = _mlp(1)
    loaded = case.entry.build(twin.parameters(), compile=False, **case.kwargs)
    get_optimizer_state_dict(twin, loaded)  # as the target of dcp.load: DCP steps the fresh optimizer first
    twin.load_state_dict(model.state_dict())  # the weights of the eval point, as dcp.load writes them
    set_optimizer_state_dict(twin, loaded, saved)
    assert loaded.mode == "eval", f"{case.name}: resumed in mode {loaded.mode!r}, saved in 'eval'"
    assert not any("gradwise" in g for g in loaded.param_groups)
    mine, theirs = optimizer.state_dict(), loaded.state_dict()
    assert mine["param_groups"] == theirs["param_groups"]
    assert all(torch.equal(theirs["state"][i][k], v) for i, st in mine["state"].items() for k, v in st.items())
    for m, opt in ((model, optimizer), (twin, loaded)):
        opt.train()
        _step(m, opt, 3)
    assert all(torch.equal(p, q) for p, q in zip(twin.parameters(), model.parameters())), case.name


@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> set[str]:
    """Run every resume of every running case (module docstring); the resumes each process verified."""
    root = str(tmp_path_factory.mktemp("dcp"))
    done = os.path.join(root, "verified")
    os.makedirs(done)
    plain = os.path.join(root, "plain")
    for case in CASES:
        _labelled(case, "plain save and 1->1", 0, lambda: (
            _save(case, None, plain), _resume(case, None, plain, "1->1 plain", 0, done)))
    with _one_rank() as mesh:
        for case in CASES:
            _labelled(case, "save at 1", 0, lambda: _save(case, mesh, os.path.join(root, "1")))
    spawn(_two_ranks, 2, root)
    with _one_rank() as mesh:
        for case in CASES:
            _labelled(case, "2->1", 0, lambda: _resume(case, mesh, os.path.join(root, "2"), "2->1", 0, done))
    for case in (c for c in CASES if c.into_plain):
        _labelled(case, "2->1 plain", 0, lambda: _resume(case, None, os.path.join(root, "2"), "2->1 plain", 0, done))
    spawn(_four_ranks, 4, root)
    return set(os.listdir(done))


@pytest.mark.slow
@needs_gloo
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_dcp_resumes_bit_identically_at_every_world_size(case, verified):
    missing = [f"{resume} (rank {rank})" for resume, ranks in RESUMES.items() for rank in range(ranks)
               if f"{case.name} {resume} rank {rank}" not in verified and (case.into_plain or resume != "2->1 plain")]
    assert not missing, f"{case.name}: no process verified the resume(s) {missing}"


def test_a_flattened_dcp_state_dict_that_drops_the_mode_loads_with_a_warning():
    """``flatten_optimizer_state_dict=True`` keeps of each group only the keys of the live groups, so a
    Schedule-Free optimizer saved in eval mode comes back without its mode: say so, not resume silently."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    flat = StateDictOptions(flatten_optimizer_state_dict=True)
    case = next(c for c in ONE_PER_RECIPE if c.name == "schedule-free-adamw")
    model, optimizer = _trained(case)
    optimizer.eval()
    saved = copy.deepcopy(get_optimizer_state_dict(model, optimizer, options=flat))
    twin, loaded = _trained(case, steps=0)
    with pytest.warns(UserWarning, match="does not say which mode it was saved in"):
        set_optimizer_state_dict(twin, loaded, saved, options=flat)
