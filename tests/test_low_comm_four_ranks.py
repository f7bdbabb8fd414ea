"""``gradwise.DiLoCo`` and ``gradwise.DeMo`` on four real gloo ranks, against data-parallel training and the
float64 references of ``tests/references/``.

One spawn of four ranks runs every case (``outcomes``), each rank on its own batches (the two-rank
modules, ``test_diloco.py`` and ``test_demo.py``, cover the rest: resume, bytes, a failing worker):

* **data-parallel**: ``sync_every=1`` with an outer SGD of lr 1 and no momentum is data-parallel training
  with an inner SGD with momentum: bit for bit on a quadratic whose arithmetic is exact (small dyadic
  numbers: every sum of four and every quartering exact), to float32 rounding on an MLP;
* **DiLoCo reference**: ``simulate`` and ``simulate_stale`` of ``tests/references/diloco.py`` (the four
  workers one after the other, float64): gradwise AdamW inside and the paper's outer Nesterov, plain and
  with Kale et al.'s eager updates (where each worker's estimate differs from the others' by a quarter of
  its own phase) and with CO2's staleness-gap penalty and clipping, over 21 steps, within 1e-10; and with
  int8 pseudo-gradients (all-gathered, each worker's decoded, summed in rank order) in float32, bit for bit;
* **DeMo reference**: ``tests/references/demo.py`` with four workers over 20 steps, within 1e-10 (sign, ``q``
  itself and the Adam-like final step); the parameters are the same on every worker, the residual momenta
  differ;
* **DiLoCo over FSDP2** (a 2 x 2 mesh: two worker groups, each ``fully_shard``ing the MLP over its two ranks,
  uneven rows; DiLoCo across the groups): H = 2 over 20 steps equals ``simulate`` of two unsharded workers,
  each fed the mean of its group's two batches, within 1e-10; each rank sends its own rows' bytes; resumed
  through ``torch.distributed.checkpoint`` mid-phase (each group under its own key), plainly and with a sync
  under way, it continues bit-identically.
"""
from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import gradwise
from gradwise.state.codec import codec_from
from tests.distributed_harness import needs_gloo, run_cases, spawn
from tests.low_comm_models import (
    DEMO_VARIANTS,
    ConvNet,
    IntegerQuadratic,
    dcp_round_trip,
    integer_quadratic_backward,
)
from tests.references.demo import simulate as simulate_demo
from tests.references.diloco import simulate, simulate_stale

WORLD_SIZE = 4
#: how far a parameter must move, so that an equality is not vacuous
MOVED = 1e-3
#: DeMo's settings: blocks of up to 5 x 5, 3 components of each sent
CHUNK, TOPK = 5, 3


# --------------------------------------------------------------------------- models and data
def _mlp(dtype=torch.float64) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(dtype)


def _backward(model, step: int, rank: int) -> None:
    g = torch.Generator().manual_seed(1000 * step + rank)
    dtype = next(model.parameters()).dtype
    x, y = torch.randn(4, 6, generator=g, dtype=dtype), torch.randn(4, 3, generator=g, dtype=dtype)
    torch.nn.functional.mse_loss(model(x), y).backward()


def _conv_backward(model, step: int, rank: int) -> None:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(4, 2, 5, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g, dtype=torch.float64)
    torch.nn.functional.mse_loss(model(x), y).backward()


def _train(optimizer, model, backward, steps, rank: int) -> None:
    for step in steps:
        backward(model, step, rank)
        optimizer.step()
        optimizer.zero_grad()


def _assert_moved(label: str, model, initial) -> None:
    for p, before in zip(model.parameters(), initial):
        assert (p - before).abs().max() > MOVED, f"{label}: a parameter barely moved; the check is vacuous"


def _assert_close(label: str, params, expected) -> None:
    for i, (p, q) in enumerate(zip(params, expected, strict=True)):
        torch.testing.assert_close(p.detach(), torch.as_tensor(q), rtol=1e-10, atol=1e-12,
                                   msg=lambda m: f"{label}, parameter {i}: {m}")


def _everyone(tensor: torch.Tensor) -> list[torch.Tensor]:
    gathered = [torch.empty_like(tensor) for _ in range(WORLD_SIZE)]
    dist.all_gather(gathered, tensor.detach().contiguous())
    return gathered


def _adamw(params):
    return gradwise.AdamW(params, lr=1e-2, weight_decay=0.1)


def _torch_adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)


# --------------------------------------------------------------------------- the cases, inside each rank
def _case_data_parallel(rank: int) -> None:
    for kind, make, backward, steps in (("exact", IntegerQuadratic, integer_quadratic_backward, 6),
                                        ("mlp", lambda: _mlp(torch.float32), _backward, 20)):
        model, replica = make(), make()
        initial = [p.detach().clone() for p in model.parameters()]
        diloco = gradwise.DiLoCo(gradwise.SGD(model.parameters(), lr=0.5, momentum=0.5), outer=torch.optim.SGD,
                                 outer_lr=1.0, sync_every=1)
        replica_optimizer = gradwise.SGD(replica.parameters(), lr=0.5, momentum=0.5)
        _train(diloco, model, backward, range(steps), rank)
        for step in range(steps):
            backward(replica, step, rank)
            for p in replica.parameters():
                dist.all_reduce(p.grad)
                p.grad /= WORLD_SIZE
            replica_optimizer.step()
            replica_optimizer.zero_grad()
        _assert_moved(kind, model, initial)
        for p, q in zip(model.parameters(), replica.parameters(), strict=True):
            if kind == "exact":
                assert torch.equal(p, q), f"{kind}: DiLoCo H=1 vs data-parallel, max diff {(p - q).abs().max():.3g}"
            else:
                torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m: f"{kind}: {m}")


def _case_diloco_reference(rank: int) -> None:
    steps, sync_every = 21, 3
    model = _mlp()
    initial = [p.detach().clone() for p in model.parameters()]
    _train(gradwise.DiLoCo(_adamw(model.parameters()), sync_every=sync_every), model, _backward, range(steps), rank)
    models = [_mlp() for _ in range(WORLD_SIZE)]
    expected = simulate(models, [_torch_adamw(m.parameters()) for m in models], _backward, torch.float64, steps,
                        sync_every, 0.7, momentum=0.9)
    _assert_moved("plain", model, initial)
    _assert_close("plain", model.parameters(), expected[rank])
    model = _mlp()
    _train(gradwise.DiLoCo(_adamw(model.parameters()), sync_every=sync_every, overlap=sync_every, eager=True),
           model, _backward, range(steps), rank)
    models = [_mlp() for _ in range(WORLD_SIZE)]
    expected = simulate_stale(models, [_torch_adamw(m.parameters()) for m in models], _backward, steps,
                              sync_every, 0.7, 0.9, eager=True)
    _assert_moved("eager", model, initial)
    _assert_close("eager", model.parameters(), expected[rank])
    first = _everyone(next(model.parameters()))
    assert not torch.equal(first[0], first[3]), "eager: the workers' outer copies agree"
    model = _mlp()
    _train(gradwise.DiLoCo(_adamw(model.parameters()), sync_every=sync_every, overlap=sync_every,
                           staleness_penalty=0.5, outer_clip=0.1), model, _backward, range(steps), rank)
    models = [_mlp() for _ in range(WORLD_SIZE)]
    expected = simulate_stale(models, [_torch_adamw(m.parameters()) for m in models], _backward, steps,
                              sync_every, 0.7, 0.9, eager=False, penalty=0.5, clip=0.1)
    _assert_moved("CO2", model, initial)
    _assert_close("CO2", model.parameters(), expected[rank])
    # int8 pseudo-gradients, all-gathered: every worker's decoded, summed in rank order, bit for bit
    int8 = codec_from("int8-b16")
    model = _mlp(torch.float32)
    _train(gradwise.DiLoCo(_adamw(model.parameters()), sync_every=2, pseudo_gradient_codec=int8), model, _backward,
           range(20), rank)
    models = [_mlp(torch.float32) for _ in range(WORLD_SIZE)]
    expected = simulate(models, [_adamw(m.parameters()) for m in models], _backward, torch.float32, 20, 2, 0.7,
                        momentum=0.9, codec=int8)[rank]
    for i, (p, q) in enumerate(zip(model.parameters(), expected, strict=True)):
        assert torch.equal(p, q), f"int8, parameter {i}: max abs diff {(p - q).abs().max().item():.3g}"


def _case_demo_reference(rank: int) -> None:
    for label, kwargs in DEMO_VARIANTS:
        model = ConvNet()
        initial = [p.detach().clone() for p in model.parameters()]
        demo = gradwise.DeMo(model.parameters(), lr=1e-2, momentum=0.9, chunk=CHUNK, topk=TOPK, **kwargs)
        _train(demo, model, _conv_backward, range(20), rank)
        expected = simulate_demo(ConvNet(), _conv_backward, WORLD_SIZE, 20, 1e-2, 0.9, chunk=CHUNK, topk=TOPK,
                                 **kwargs)
        _assert_moved(label, model, initial)
        _assert_close(label, model.parameters(), expected)
        first = next(model.parameters())
        assert all(torch.equal(theirs, first) for theirs in _everyone(first)), f"{label}: the workers differ"
        momenta = _everyone(demo.state[first]["momentum"])
        assert not torch.equal(momenta[0], momenta[3]), f"{label}: the workers' momenta are the same"


def _sharded_mlp(mesh) -> torch.nn.Sequential:
    from torch.distributed.fsdp import fully_shard

    model = _mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _group_backward(model, step: int, group: int) -> None:
    """Worker ``group``'s gradient, unsharded: the mean of its two ranks' (as FSDP2 averages theirs)."""
    for rank in (2 * group, 2 * group + 1):
        _backward(model, step, rank)
    for p in model.parameters():
        p.grad /= 2


def _case_diloco_over_fsdp2(rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    group, across = rank // 2, mesh["replicate"].get_group()

    def build(model, **kwargs):
        return gradwise.DiLoCo(_adamw(model.parameters()), sync_every=2, process_group=across, **kwargs)

    model = _sharded_mlp(mesh["shard"])
    # refused before anything is built: the default group (shard-mates too), and what needs whole tensors
    for kwargs, error, match in (({}, ValueError, r"invalid process_group=None .* meet the shard mesh in this rank"),
                                 ({"process_group": across, "overlap": 2, "staleness_penalty": 1.0},
                                  NotImplementedError, r"staleness_penalty=1.0, outer_clip=None with FSDP2"),
                                 ({"process_group": across, "pseudo_gradient_codec": "powersgd"},
                                  NotImplementedError, r"'powersgd' with FSDP2 shards")):
        with pytest.raises(error, match=match):
            gradwise.DiLoCo(_adamw(model.parameters()), sync_every=2, **kwargs)
    initial = [p.full_tensor() for p in model.parameters()]
    diloco = build(model)
    _train(diloco, model, _backward, range(20), rank)
    models = [_mlp() for _ in range(2)]
    expected = simulate(models, [_torch_adamw(m.parameters()) for m in models], _group_backward, torch.float64, 20,
                        2, 0.7, momentum=0.9)[group]
    full = [p.full_tensor() for p in model.parameters()]
    for p, before in zip(full, initial):
        assert (p - before).abs().max() > MOVED, "a parameter barely moved; the check is vacuous"
    _assert_close("over FSDP2", full, expected)
    # this rank's rows, 8 bytes each, at each of the 10 syncs: 4 + 4 rows of the first layer, 2 + 1 of the second
    rows = (4 * 6 + 4 + 2 * 8 + 2) if rank % 2 == 0 else (4 * 6 + 4 + 1 * 8 + 1)
    assert diloco.comm_stats["all_reduce_bytes"] == 10 * 8 * rows, diloco.comm_stats
    # saved one step into the third phase; and after the third sync, its all-reduce still under way
    for label, kwargs, saved_at in (("plain", {}, 5), ("a sync under way", {"overlap": 1, "merge_alpha": 0.5}, 6)):
        model = _sharded_mlp(mesh["shard"])
        diloco = build(model, **kwargs)
        _train(diloco, model, _backward, range(saved_at), rank)
        assert bool(diloco.pending) == bool(kwargs), label
        directory = os.path.join(tempfile.gettempdir(), f"gradwise-hsdp-dcp-{os.getppid()}-{label}")
        resumed_model = _sharded_mlp(mesh["shard"])
        with torch.no_grad():
            for p in resumed_model.parameters():
                p.zero_()  # so that parameters not loaded would show
        resumed = build(resumed_model, **kwargs)
        # a worker group's ranks share its DTensors: one key per group
        dcp_round_trip(f"group{group}", directory, (model, diloco), (resumed_model, resumed))
        for m, d in ((model, diloco), (resumed_model, resumed)):
            _train(d, m, _backward, range(saved_at, 11), rank)
        for p, q in zip(model.parameters(), resumed_model.parameters(), strict=True):
            assert torch.equal(p.to_local(), q.to_local()), f"{label}: resumed through DCP vs uninterrupted"
        assert resumed.comm_stats == diloco.comm_stats, label


CASES = {"data-parallel": _case_data_parallel, "diloco reference": _case_diloco_reference,
         "demo reference": _case_demo_reference, "diloco over fsdp2": _case_diloco_over_fsdp2}


def _worker(rank: int, world_size: int, directory: str) -> None:
    run_cases(CASES, rank, directory)


# --------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> list[dict]:
    """Each rank's outcome ("ok" or its traceback) of every case."""
    directory = tmp_path_factory.mktemp("four_ranks")
    spawn(_worker, WORLD_SIZE, str(directory))
    ranks = []
    for rank in range(WORLD_SIZE):
        with open(os.path.join(directory, f"rank{rank}.json")) as f:
            ranks.append(json.load(f))
    return ranks


@pytest.mark.slow
@needs_gloo
@pytest.mark.parametrize("case", list(CASES))
def test_on_four_gloo_ranks(outcomes, case):
    failures = "\n".join(f"rank {rank}:\n{o[case]}" for rank, o in enumerate(outcomes) if o[case] != "ok")
    assert not failures, failures
