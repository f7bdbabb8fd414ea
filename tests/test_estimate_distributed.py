"""``gradwise.estimate_sharded`` against what real FSDP2 ranks hold and send: gloo on CPU, exact bytes.

One 4-rank spawn (a flat mesh of 4 shards, then an HSDP mesh of 2 replicas x 2 shards, whose shard
groups of two stand for a 2-rank world) steps every case twice on a small model with uneven shards
(7 rows over 4 ranks), a matrix large enough to be encoded, an embedding and a norm. Each rank reports,
after the second step, the bytes of every tensor in ``optimizer.state`` (a DTensor by its local shard) and what
``optimizer.comm_stats`` counted during that step (the first also builds the state); the test compares
them with the estimate computed here, from the unsharded model's shapes, without a process group.
The fast tests below check the estimate's own promises in-process: one rank holds the unsharded state
and sends nothing, an HSDP mesh is its shard groups, bad arguments are named, the CLI prints it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import gradwise
from tests.distributed_harness import labelled, needs_gloo, spawn

#: (label, recipe, keyword arguments)
CASES = [
    ("AdamW", "AdamW", {}),
    ("Muon", "Muon", {}),
    ("Shampoo", "Shampoo", {}),
    ("Adafactor", "Adafactor", {}),
    ("AdamW-int8", "AdamW", {"state": "int8"}),
    ("AdamW-skip_nonfinite", "AdamW", {"skip_nonfinite": True}),  # a guard's flag, all-reduced
]
#: (label, mesh shape) each spawn runs, by world size; a 2-D mesh is HSDP (replicas, shards)
MESHES = {4: [("4", (4,)), ("2x2", (2, 2))]}


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 24), torch.nn.Linear(24, 200), torch.nn.Tanh(),
                               torch.nn.Linear(200, 7), torch.nn.LayerNorm(7))


def _tokens(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(100 * step + rank))


# --------------------------------------------------------------------------- inside each rank
def _measure(recipe: str, kwargs: dict, mesh, rank: int) -> dict:
    """Two steps of the case on the sharded model: state bytes after them, traffic of the second."""
    from torch.distributed.fsdp import fully_shard

    from gradwise.core.params import local

    model = _model()
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = getattr(gradwise, recipe)(model.parameters(), compile=False, **kwargs)
    before = {}
    for step in range(2):
        model(_tokens(step, rank)).square().mean().backward()
        before = optimizer.comm_stats
        optimizer.step()
        optimizer.zero_grad()
    after = optimizer.comm_stats
    state = sum(local(v).nbytes for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))
    return {"state": state, "sent": after["bytes_sent"] - before["bytes_sent"],
            "collectives": after["collectives"] - before["collectives"]}


def _worker(rank: int, world_size: int, directory: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    report = {}
    for mesh_label, shape in MESHES[world_size]:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard")[-len(shape):])
        for label, recipe, kwargs in CASES:
            try:
                report[f"{mesh_label}/{label}"] = _measure(recipe, kwargs, mesh, rank)
            except Exception as error:
                labelled(error, rank, f"{mesh_label}/{label}")
                raise
    Path(directory, f"{rank}.json").write_text(json.dumps(report))


# --------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """What each rank measured, by world size: one spawn per world size, on first use."""
    runs: dict[int, list[dict]] = {}

    def of(world: int) -> list[dict]:
        if world not in runs:
            directory = tmp_path_factory.mktemp(f"world{world}")
            spawn(_worker, world, str(directory))
            runs[world] = [json.loads(Path(directory, f"{r}.json").read_text()) for r in range(world)]
        return runs[world]
    return of


@pytest.mark.slow
@needs_gloo
@pytest.mark.parametrize("world, mesh_label", [(w, label) for w, meshes in MESHES.items() for label, _ in meshes])
@pytest.mark.parametrize("label, recipe, kwargs", CASES, ids=[c[0] for c in CASES])
def test_estimate_equals_what_fsdp2_ranks_hold_and_send(measured, world, mesh_label, label, recipe, kwargs):
    shape = dict(MESHES[world])[mesh_label]
    expected = gradwise.estimate_sharded(_model(), recipe, **({"mesh": shape} if len(shape) == 2 else
                                                                {"world_size": world}), **kwargs)
    reports = [ranks[f"{mesh_label}/{label}"] for ranks in measured(world)]
    shards = shape[-1]
    # rank r of the world is shard r % shards of its replica group (init_device_mesh's row-major layout)
    assert [r["state"] for r in reports] == [expected.state[r % shards] for r in range(world)]
    assert [r["sent"] for r in reports] == [expected.sent[r % shards] for r in range(world)]
    assert [r["collectives"] for r in reports] == [expected.collectives] * world
    if label != "AdamW":
        assert max(expected.sent) > 0, f"{label}: the estimate says nothing is sent; the check would be vacuous"


@pytest.mark.parametrize("recipe, kwargs", [("AdamW", {}), ("Muon", {}), ("Shampoo", {}), ("AdamW", {"state": "int8"})])
def test_one_rank_holds_the_unsharded_state_and_sends_nothing(recipe, kwargs):
    one = gradwise.estimate_sharded(_model(), recipe, world_size=1, **kwargs)
    assert one.state == [gradwise.estimate(_model(), recipe, **kwargs).total]
    assert (one.sent, one.collectives) == ([0], 0)


def test_an_hsdp_mesh_holds_and_sends_what_its_shard_group_does():
    flat = gradwise.estimate_sharded(_model(), "Muon", world_size=4)
    hsdp = gradwise.estimate_sharded(_model(), "Muon", mesh=(3, 4))
    assert (hsdp.state, hsdp.sent, hsdp.collectives) == (flat.state, flat.sent, flat.collectives)
    assert (hsdp.world, flat.world) == (12, 4)
    assert max(flat.state) < gradwise.estimate(_model(), "Muon").total / 2


@pytest.mark.parametrize("arguments, message", [
    ({}, "takes world_size or mesh"),
    ({"world_size": 2, "mesh": (1, 2)}, "takes world_size or mesh"),
    ({"world_size": 0}, "invalid world_size=0"),
    ({"mesh": (2,)}, r"invalid mesh=\(2,\)"),
    ({"mesh": (2, 0)}, r"invalid mesh=\(2, 0\)"),
])
def test_bad_world_sizes_and_meshes_are_named(arguments, message):
    with pytest.raises((TypeError, ValueError), match=message):
        gradwise.estimate_sharded(_model(), "AdamW", **arguments)


def test_cli_prints_per_rank_state_and_traffic(capsys):
    from gradwise.cli import main

    assert main(["estimate", "--size", "tiny", "--recipe", "muon", "--state", "int8", "--world-size", "4"]) == 0
    out = capsys.readouterr().out
    expected = gradwise.estimate_sharded(
        [(n, torch.empty(s, device="meta")) for n, s in gradwise.shapes.gpt2_shapes(*gradwise.shapes.SIZES["tiny"])],
        "Muon", world_size=4, state=gradwise.StatePolicy("int8"))
    assert expected.table() in out and "4 shards" in out and f"{max(expected.sent):,}" in out
    assert main(["estimate", "--size", "tiny", "--mesh", "2,2"]) == 0
    assert "2 replica" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["estimate", "--world-size", "2", "--mesh", "1,2"])
    assert "not allowed with argument" in capsys.readouterr().err
