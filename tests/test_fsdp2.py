"""gradwise under FSDP2 (``torch.distributed.fsdp.fully_shard``), for real: CPU ranks over gloo.

One spawn per world size (2, and 4 for a subset) runs every check, so torch is imported and the
process group built once per world size:

* every recipe of the registry (one case each, with Ranger21's MADGRAD and AdaBelief variants, and
  with ``state="int8"`` where it takes encoded state; Muon also bf16 and int4) steps a
  sharded MLP (uneven shards, an empty shard, biases) as the same recipe steps an unsharded copy fed
  the same gradients (the sharded model's, gathered): bit-identical where the math runs on shards
  (elementwise links) or on one owner (whole-tensor links: ``core/owned.py``); within float32
  rounding where a statistic of every parameter is summed over ranks (``SUMMING``), in another order;
  eagerly, and compiled for ``COMPILED``;
* a rank keeps the state of links that run on shards as DTensors sharded like their parameter, and that
  of whole-tensor links whole, on the parameter's owner only; a per-rank ``torch.save`` /
  ``torch.load(weights_only=True)`` round trip into a fresh sharded optimizer resumes bit-identically
  (for NAdamW also a ``torch.distributed.checkpoint`` round trip);
* bfloat16 parameters with ``param_rounding="stochastic"`` (AdamW on shards, Ranger21 on owners) are
  bit-identical to the unsharded run: the random bits hash each element's logical index;
* ``skip_nonfinite`` skips the step on every rank when only one rank's shard of the gradient is NaN;
* on 4 ranks, a subset also as HSDP (2 replicas of 2 shards);
* a placement gradwise does not step (``Shard(1)``) raises ``NotImplementedError`` naming it, and
  changes nothing;
* ``fused_backward`` (LOMO's default) is refused, naming ``fused_backward=False``, which steps shards;
* the modifiers no recipe holds (``cautious``, ``cautious_weight_decay``) on AdamW's core, as a case like the
  recipes' (``mars_correction`` and ``spam`` are MARS's and SPAM's);
* ``BAdam`` around AdamW on shards (blocks frozen in turn) is bit-identical to the unsharded run and resumes
  bit-identically across a switch; ``MeZO`` refuses DTensor parameters by name;
* Muon's step sends what the owner path says, counted by ``optimizer.comm_stats``.

Failures inside a rank are re-raised here with that rank's traceback (``tests/distributed_harness.py``).
"""
from __future__ import annotations

import copy
import io
import os

import pytest
import torch

from gradwise import Ranger21, StatePolicy
from tests.distributed_harness import labelled, needs_gloo, spawn
from tests.registry import ENTRY, ONE_PER_RECIPE

pytestmark = [pytest.mark.slow, needs_gloo]

STEPS = 6
RESUME_STEPS = 2
RTOL, ATOL = 1e-5, 1e-6


def cautious_adamw(params, **kwargs):
    """``chain(cautious(scale_by_adam()), cautious_weight_decay(), scale_by_learning_rate())``."""
    from gradwise import Optimizer, chain
    from gradwise.transforms import cautious, cautious_weight_decay, scale_by_adam, scale_by_learning_rate

    return Optimizer(params, chain(cautious(scale_by_adam()), cautious_weight_decay(), scale_by_learning_rate()),
                     **kwargs)


#: the recipes also run compiled (a compile in each rank is what this test's time allows): elementwise
#: links compiled on shards, and after an owned phase
COMPILED = ("AdamW", "Adafactor")
#: (label, recipe name or builder, keyword arguments, compile): one registry case of each recipe (learning rates
#: large enough that STEPS steps move every parameter well beyond the tolerance), eagerly, and compiled
#: for those in COMPILED
CASES = [(c.name + ("[compiled]" if compiled else ""), c.recipe.__name__, {**c.entry.required, **c.kwargs}, compiled)
         for c in ONE_PER_RECIPE for compiled in (False, True) if not compiled or c.recipe.__name__ in COMPILED]
#: the modifiers that no recipe holds, on AdamW's core (C-AdamW with Cautious Weight Decay)
CASES += [("cautious-adamw-cwd", cautious_adamw, dict(lr=0.01, weight_decay=0.1), False)]
CASES += [("ranger21-" + option, "Ranger21", {**ENTRY[Ranger21].required, option: True, "lr": 0.03}, False)
          for option in ("use_madgrad", "use_adabelief")]
#: every recipe that takes ``state=`` also with int8 state (on shards, on owners, or both: Muon's momentum is
#: encoded on shards and its matrices orthogonalized on their owners), and Muon in every format
#: (every buffer encoded, the tiny ones too: ``min_numel=0``)
CASES += [(f"{c.name}-{fmt}", c.recipe.__name__,
           {**c.entry.required, **c.kwargs, "state": StatePolicy(fmt, min_numel=0)}, False)
          for c in ONE_PER_RECIPE if c.entry.state for fmt in ("int8", *(("bf16", "int4") if c.name == "muon" else ()))]
#: the cases also run on 4 ranks (every rank owns some matrix; one holds no row of two layers)
ON_FOUR = ("adamw", "muon", "shampoo", "ranger21", "adafactor")
#: the cases also run on 4 ranks as HSDP (a 2 x 2 mesh: replicated over the first dimension)
HSDP = ("adamw", "muon", "adafactor")
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


def _backward(model, reference, step: int, rank: int) -> None:
    """The sharded model's gradient, and the same (gathered) as the reference model's: FSDP2's mean
    over ranks, bit for bit (None for a frozen parameter)."""
    x, y = _batch(step, rank)
    torch.nn.functional.mse_loss(model(x.to(next(model.parameters()).dtype)).float(), y).backward()
    if reference is not None:
        grads = [p.grad for p in model.parameters()]
        whole = iter(_gathered([g for g in grads if g is not None]))
        for q, grad in zip(reference.parameters(), grads):
            q.grad = None if grad is None else next(whole)


def _gathered(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``[t.full_tensor() for t in tensors]`` (detached) in one all-gather over the shard dimension of the
    first's mesh, not one per tensor: FSDP2 gives rank r rows ``r * c`` to ``(r + 1) * c`` of a dimension-0
    length n, ``c = ceil(n / world)``; each rank sends its rows padded to c, and a whole tensor is the ranks'
    rows in order, cut to n. Plain tensors come back as they are."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    if not tensors or not isinstance(tensors[0], DTensor):
        return [t.detach() for t in tensors]
    mesh = tensors[0].device_mesh
    world = mesh.size(mesh.ndim - 1)
    chunks = [-(-t.shape[0] // world) * t.shape[1:].numel() for t in tensors]
    local = torch.cat([torch.nn.functional.pad(t.detach().to_local().flatten(), (0, n - t.to_local().numel()))
                       for t, n in zip(tensors, chunks)])
    gathered = local.new_empty(world * local.numel())
    dist.all_gather_into_tensor(gathered, local, group=mesh.get_group(mesh.ndim - 1))
    gathered, whole, offset = gathered.view(world, -1), [], 0
    for t, n in zip(tensors, chunks):
        whole.append(gathered[:, offset:offset + n].reshape(-1)[:t.numel()].reshape(t.shape).clone())
        offset += n
    return whole


def _assert_close(label: str, what: str, sharded, reference, exact: bool = False) -> None:
    names = [name for name, _ in sharded.named_parameters()]
    for name, actual, expected in zip(names, _gathered(list(sharded.parameters())),
                                      _gathered(list(reference.parameters()))):
        if exact:
            assert torch.equal(actual, expected), (
                f"{label}: {what}: {name} differs (max abs diff {(actual - expected).abs().max().item():.3g})"
            )
        else:
            torch.testing.assert_close(
                actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m, name=name: f"{label}: {what}: {name}: {m}"
            )


def _check_state_dict(label: str, model, optimizer) -> None:
    """A rank saves the keys it keeps (``keys_here``): param-shaped state of the links that run on shards
    as DTensors sharded like their parameter, the state of whole-tensor links as whole tensors on the
    parameter's owner only."""
    from torch.distributed.tensor import DTensor

    saved = optimizer.state_dict()
    in_order = [(g, p) for g in optimizer.param_groups for p in g["params"]]  # the state dict's indices
    assert set(saved["state"]) == set(range(len(in_order))), f"{label}: state_dict lacks some parameters' state"
    for index, (group, p) in enumerate(in_order):
        here = optimizer.keys_here(p, group)
        owner = optimizer.owner(p)
        for key, value in saved["state"][index].items():
            assert key == "step" or key.split("@")[0] in here, f"{label}: rank saves state[{index}][{key!r}]"
            if isinstance(value, DTensor) and "@" in key:  # a part of an encoded buffer: the parameter's rows
                assert value.device_mesh == p.device_mesh, f"{label}: state[{index}][{key!r}] on another mesh"
                assert all(q.is_replicate() for q in value.placements) or (
                    value.placements == p.placements and value.to_local().shape[0] == p.to_local().shape[0]), (
                    f"{label}: state[{index}][{key!r}] placed {value.placements}, local {value.to_local().shape}")
            elif isinstance(value, DTensor):
                assert value.placements == p.placements and value.device_mesh == p.device_mesh, (
                    f"{label}: state[{index}][{key!r}] placed {value.placements}, its parameter {p.placements}")
                assert value.to_local().shape == p.to_local().shape, f"{label}: state[{index}][{key!r}] local shape"
            elif value.shape == p.shape and value.dim() > 0:
                assert owner == p.device_mesh.get_local_rank(p.device_mesh.ndim - 1), (
                    f"{label}: state[{index}][{key!r}] is a whole tensor on a rank that does not own {index}")


def _fresh_copy(model, mesh, dtype):
    """A new sharded model holding ``model``'s parameters (built from a different init)."""
    torch.manual_seed(1)
    fresh = _shard(_mlp().to(dtype), mesh)
    with torch.no_grad():
        for p, q in zip(fresh.parameters(), model.parameters()):
            p.to_local().copy_(q.to_local())
    return fresh


def _resume_from_torch_save(model, optimizer, build, mesh, dtype):
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)  # each rank saves its own shards
    buffer.seek(0)
    resumed = _fresh_copy(model, mesh, dtype)
    resumed_optimizer = build(resumed)
    resumed_optimizer.load_state_dict(torch.load(buffer, weights_only=True))
    return resumed, resumed_optimizer


def _resume_from_dcp(model, optimizer, build, mesh, dtype, directory):
    """Through torch.distributed.checkpoint, as a training loop would save a sharded optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=directory)
    resumed = _fresh_copy(model, mesh, dtype)
    resumed_optimizer = build(resumed)
    target = {"optimizer": get_optimizer_state_dict(resumed, resumed_optimizer)}
    dcp.load(target, checkpoint_id=directory)
    set_optimizer_state_dict(resumed, resumed_optimizer, target["optimizer"])
    return resumed, resumed_optimizer


def _sums_over_ranks(optimizer) -> bool:
    """Whether a statistic of every parameter is summed (over ranks, in another order than unsharded)."""
    return any(op == "sum" for g in optimizer.param_groups
               for op in optimizer.transform.for_group(g).reductions.values())


def _run_case(label: str, recipe, kwargs: dict, compiled: bool, rank: int, mesh, dcp_dir: str | None,
              dtype: torch.dtype = torch.float32) -> None:
    import gradwise

    world, rank = mesh.size(mesh.ndim - 1), mesh.get_local_rank(mesh.ndim - 1)  # over the shard dimension
    torch.manual_seed(0)
    reference = _mlp().to(dtype)
    model = _shard(copy.deepcopy(reference), mesh)
    initial = _gathered(list(model.parameters()))
    _assert_close(label, "initial parameters", model, reference, exact=True)
    rows = [p.to_local().shape[0] for p in model.parameters()]
    expected_rows = [max(0, min(n, (rank + 1) * -(-n // world)) - rank * -(-n // world))
                     for n in (16, 16, 7, 7, 3, 3, 1, 1)]
    assert rows == expected_rows, f"rank {rank} holds rows {rows}, not the uneven shards {expected_rows}"

    def build(m, compile=compiled):
        make = getattr(gradwise, recipe) if isinstance(recipe, str) else recipe
        return make(m.parameters(), compile=compile, **kwargs)

    optimizer, reference_optimizer = build(model), build(reference, compile=False)  # the eager reference
    exact = not compiled and not _sums_over_ranks(optimizer)
    for step in range(STEPS):
        _backward(model, reference, step, rank)
        optimizer.step()
        reference_optimizer.step()
        optimizer.zero_grad()
        reference_optimizer.zero_grad()
    _assert_close(label, f"parameters after {STEPS} steps", model, reference, exact=exact)
    for (name, _), after, before in zip(model.named_parameters(), _gathered(list(model.parameters())), initial):
        assert (after.float() - before.float()).abs().max() > 100 * ATOL, f"{label}: {name} barely moved"
    if compiled:
        assert optimizer.compile_stats["compiles"] >= 1, f"{label}: compile=True but nothing was compiled"

    # save, load into a fresh sharded model and optimizer, and go on stepping alongside the original
    _check_state_dict(label, model, optimizer)
    resumed = {"torch.save": _resume_from_torch_save(model, optimizer, build, mesh, dtype)}
    if dcp_dir is not None:
        resumed["DCP"] = _resume_from_dcp(model, optimizer, build, mesh, dtype, dcp_dir)
    for how, (resumed_model, resumed_optimizer) in resumed.items():
        _check_state_dict(f"{label}, loaded via {how}", resumed_model, resumed_optimizer)
    for step in range(STEPS, STEPS + RESUME_STEPS):
        for i, (m, opt) in enumerate([(model, optimizer), *resumed.values()]):
            _backward(m, reference if i == 0 else None, step, rank)
            opt.step()
            opt.zero_grad()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    for how, (resumed_model, _) in resumed.items():
        _assert_close(label, f"run resumed via {how} vs uninterrupted run", resumed_model, model, exact=True)
    _assert_close(label, f"parameters after {STEPS + RESUME_STEPS} steps", model, reference, exact=exact)


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
        _backward(model, reference, step, rank)
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
    _assert_close(label, "parameters after a step skipped on one rank's NaN", model, reference, exact=True)
    steps = [float(optimizer.state[p]["step"]) for p in model.parameters()]
    assert steps == [2.0] * len(steps), f"{label}: rank {rank} step counts {steps}"


def _run_unsupported_placement(rank: int, mesh) -> None:
    """Rows sharded by column (``Shard(1)``) are refused by name before anything changes."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    import gradwise

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 6)
    fully_shard(model, mesh=mesh, shard_placement_fn=lambda p: Shard(p.dim() - 1))
    optimizer = gradwise.Muon(model.named_parameters(), lr=0.01, compile=False)
    model(torch.randn(3, 8)).sum().backward()
    before = [p.to_local().clone() for p in model.parameters()]
    with pytest.raises(NotImplementedError, match=r"parameter 'weight' is a DTensor placed \(Shard\(dim=1\),\)"):
        optimizer.step()
    assert all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters()))
    assert not optimizer.state


def _run_fused_backward_refusal(mesh) -> None:
    """LOMO's default (updates inside backward) cannot see FSDP2's gradients: refused, naming the way out."""
    import gradwise

    model = _shard(_mlp(), mesh)
    with pytest.raises(NotImplementedError, match=r"FSDP2 reduce-scatters .* fused_backward=False"):
        gradwise.LOMO(model.parameters(), lr=0.01)


def _run_badam(rank: int, mesh) -> None:
    """BAdam around AdamW, blocks of two parameters for 3 steps each (every block active), the
    inactive ones frozen: FSDP2 makes no gradient for them, and the run equals the unsharded one bit for bit,
    also after a ``torch.save`` resume in the middle of a block."""
    import gradwise

    label = "BAdam(AdamW)"
    steps = 4 * 3 - 2  # every block of the four active, the last for one step
    torch.manual_seed(0)
    reference = _mlp()
    model = _shard(copy.deepcopy(reference), mesh)
    initial = _gathered(list(model.parameters()))

    def build(m):
        return gradwise.BAdam(gradwise.AdamW(m.parameters(), lr=0.01, compile=False), switch_every=3, blocks=2)

    optimizer, reference_optimizer = build(model), build(reference)
    for step in range(steps):
        _backward(model, reference, step, rank)
        assert [p.grad is not None for p in model.parameters()] == [i // 2 == optimizer.active for i in range(8)]
        for opt in (optimizer, reference_optimizer):
            opt.step()
            opt.zero_grad()
    _assert_close(label, f"parameters after {steps} steps", model, reference, exact=True)
    for (name, _), after, before in zip(model.named_parameters(), _gathered(list(model.parameters())), initial):
        assert (after - before).abs().max() > 100 * ATOL, f"{label}: {name} barely moved"
    resumed, resumed_optimizer = _resume_from_torch_save(model, optimizer, build, mesh, torch.float32)
    for step in range(steps, steps + RESUME_STEPS):
        for m, opt in ((model, optimizer), (resumed, resumed_optimizer)):
            _backward(m, None, step, rank)
            opt.step()
            opt.zero_grad()
    _assert_close(label, "run resumed via torch.save vs uninterrupted run", resumed, model, exact=True)


def _run_mezo_refusal(mesh) -> None:
    """MeZO's z spans whole tensors and its loss difference all parameters: shards are refused, by name."""
    import gradwise

    with pytest.raises(NotImplementedError, match=r"MeZO: params\[0\] is a DTensor placed \(Shard\(dim=0\),\)"):
        gradwise.MeZO(_shard(_mlp(), mesh).parameters(), lr=1e-3)


def _run_traffic(rank: int, mesh) -> None:
    """One 5 x 3 matrix under Muon on 2 ranks: rank 0 holds rows 0-2 and owns it (the only matrix goes to
    the least loaded, lowest rank); rank 1 sends its 2 x 3 float32 rows of the momentum to it (24 bytes)
    and gets its rows of the orthogonalized update back (24 bytes from rank 0)."""
    from torch.distributed.fsdp import fully_shard

    import gradwise

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 5, bias=False)
    fully_shard(model, mesh=mesh)
    optimizer = gradwise.Muon(model.parameters(), lr=0.01, compile=False)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    assert optimizer.owner(model.weight) == 0
    assert optimizer.comm_stats == {"collectives": 2, "bytes_sent": 24, "all_to_all_bytes": 24}, (
        f"rank {rank}: {optimizer.comm_stats}")


def _worker(rank: int, world_size: int, directory: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    cases = [c for c in CASES if world_size == 2 or c[0] in ON_FOUR]
    cases += [("adamw-bf16-stochastic", "AdamW", dict(lr=0.01, param_rounding="stochastic"), False, torch.bfloat16),
              ("ranger21-bf16-stochastic", "Ranger21",
               dict(ENTRY[Ranger21].required, lr=0.03, param_rounding="stochastic"), False, torch.bfloat16)]
    for label, recipe, kwargs, compiled, *dtype in cases:
        try:
            dcp_dir = os.path.join(directory, label) if label in DCP_CASES else None
            _run_case(label, recipe, kwargs, compiled, rank, mesh, dcp_dir, *dtype)
        except Exception as error:
            labelled(error, rank, label)
            raise
    if world_size == 4:  # HSDP: 2 replicas of 2 shards, Replicate() on the first mesh dimension
        hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        for label, recipe, kwargs, compiled in [c for c in CASES if c[0] in HSDP]:
            _run_case(f"{label}[hsdp]", recipe, kwargs, compiled, rank, hsdp, None)
    if world_size == 2:
        _run_skip_nonfinite(rank, mesh)
        _run_unsupported_placement(rank, mesh)
        _run_fused_backward_refusal(mesh)
        _run_badam(rank, mesh)
        _run_mezo_refusal(mesh)
        _run_traffic(rank, mesh)


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_recipe_matches_unsharded_under_fsdp2(world_size, tmp_path):
    spawn(_worker, world_size, str(tmp_path))
