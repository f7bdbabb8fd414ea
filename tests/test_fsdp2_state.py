"""Encoded optimizer state (bf16, int8, int4) on FSDP2 shards is sharding-invariant, on real gloo ranks.

One spawn per world size (1, 2, 4) fully_shards an MLP whose matrices are encoded (their rows split
unevenly; the last one has 3 rows, so at 4 ranks one shard is empty; rows of odd length, which int4
packs within each row; a 1-D bias encoded too) and runs AdamW with ``state="bf16"|"int8"|"int4"`` for
``STEPS`` steps, and int8 on bfloat16 parameters with ``param_rounding="stochastic"`` (every tensor
encoded, so every parameter is written by the encoded path, its random bits from logical indices).
The gradients are set directly to the same logical tensors at every world size (a function of the
step only), so any difference is the optimizer's. Rank 0 saves the gathered parameters, decoded state
and parts; the test then checks them bit-identical across world sizes and against the same optimizer
stepping the unsharded model (its codes and scales in today's flat layout).

Each spawn also checks that ``optimizer.state_dict()`` holds the parts as DTensors on the parameter's
mesh, that a per-rank ``torch.save``/``torch.load`` round trip resumes bit-identically, and resumes
through ``torch.distributed.checkpoint`` from its own checkpoint and every one an earlier spawn saved
(1 -> 1, 1 -> 2, 2 -> 2, 1 -> 4, 2 -> 4, 4 -> 4; saved after ``STEPS`` steps; the last spawn also
loads the 2- and 4-rank ones on a 1-rank mesh of each rank: 2 -> 1, 4 -> 1): after ``RESUME_STEPS``
more steps its parameters are those of the uninterrupted run. (Resharding keeps the codes: blocks and
scales are the logical tensor's, indexed by rows.) Last, the state is loaded into an optimizer of the
next format (bf16 -> int8 -> int4 -> bf16), decoded and encoded again on the shards: that too must be
bit-identical to the unsharded conversion.
"""
from __future__ import annotations

import io
import os

import pytest
import torch

from tests.distributed_harness import labelled, needs_gloo, spawn

pytestmark = [pytest.mark.slow, needs_gloo]

WORLD_SIZES = (1, 2, 4)
CODECS = ("bf16", "int8", "int4")
#: the codecs on float32 parameters, and int8 on bfloat16 parameters written with stochastic rounding,
#: every tensor encoded (the 3-element bias too: at 4 ranks, one element per rank and none)
CASES = (*CODECS, "int8-bf16-params")
STEPS = 10
RESUME_STEPS = 2
#: encode every tensor of at least this many elements: the three matrices and the 301-element bias
MIN_NUMEL = 256
KWARGS = dict(lr=1e-2, weight_decay=0.1, compile=False)


def _settings(case: str) -> tuple[str, int, torch.dtype, dict]:
    """(codec, min_numel, parameter dtype, keyword arguments) of a case."""
    if case == "int8-bf16-params":
        return "int8", 1, torch.bfloat16, {"param_rounding": "stochastic"}
    return case, MIN_NUMEL, torch.float32, {}


def _mlp(dtype: torch.dtype = torch.float32) -> torch.nn.Sequential:
    """Weights (67, 64), (301, 67) and (3, 301): rows split 34/33 and 17/17/17/16 (int8's 2048- and
    int4's 128-element blocks cut at the shard boundaries), odd row lengths, 3 rows over 4 ranks."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 67), torch.nn.Tanh(), torch.nn.Linear(67, 301),
                               torch.nn.Tanh(), torch.nn.Linear(301, 3)).to(dtype)


def _gradient(step: int, index: int, shape: torch.Size) -> torch.Tensor:
    """The logical gradient of parameter ``index`` at ``step``, with outlier columns (for the rank-1
    scales) and a few large elements (for the block scales)."""
    g = torch.randn(shape, generator=torch.Generator().manual_seed(100 * step + index))
    if g.dim() == 2:
        g[:, ::7] *= 30
    g.view(-1)[:: 997] *= 100
    return g


def _optimizer(params, case: str):
    import gradwise

    codec, min_numel, _, kwargs = _settings(case)
    return gradwise.AdamW(params, state=gradwise.StatePolicy(codec, min_numel=min_numel), **KWARGS, **kwargs)


def _set_gradients(model, step: int) -> None:
    from torch.distributed.tensor import DTensor

    from gradwise.core.sharding import sharding

    for index, p in enumerate(model.parameters()):
        g = _gradient(step, index, p.shape).to(p.dtype)
        if isinstance(p, DTensor):
            split = sharding(p)
            start, stop = (0, p.shape[0]) if split is None else split.rows(split.rank)
            g = DTensor.from_local(g[start:stop].clone(), p.device_mesh, p.placements, run_check=False,
                                   shape=p.shape, stride=p.stride())
        p.grad = g


def _steps(model, optimizer, first: int, count: int) -> None:
    for step in range(first, first + count):
        _set_gradients(model, step)
        optimizer.step()
        optimizer.zero_grad()


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()  # (on 1 rank, not a copy)


def _snapshot(model, optimizer) -> dict:
    """Gathered parameters, decoded state and stored parts (each a full tensor), by parameter index."""
    from torch.distributed.tensor import DTensor

    out = {}
    for index, p in enumerate(model.parameters()):
        state = optimizer.state[p]
        decoded = optimizer.storage.decoded(state, p)
        if isinstance(p, DTensor):  # each rank decodes its rows: gather them like the parameter
            decoded = {k: DTensor.from_local(v, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                             stride=p.stride()).full_tensor() if v.dim() else v
                       for k, v in decoded.items()}
        parts = {k: _full(v) for k, v in state.items() if "@" in k}
        out[index] = {"param": _full(p), "decoded": {k: v.clone() for k, v in decoded.items()}, "parts": parts}
    return out


def _check_state_dict(label: str, model, optimizer) -> None:
    """Every part of an encoded buffer is a DTensor on its parameter's mesh, its rows its parameter's."""
    from torch.distributed.tensor import DTensor

    saved = optimizer.state_dict()["state"]
    encoded = 0
    for index, p in enumerate(model.parameters()):
        for key, value in saved[index].items():
            if "@" not in key:
                continue
            encoded += 1
            assert isinstance(value, DTensor) and value.device_mesh == p.device_mesh, f"{label}: {key}"
            if key.endswith("col_max") or (key.endswith("absmax") and p.dim() == 1):  # on every rank
                assert all(placement.is_replicate() for placement in value.placements), f"{label}: {key}"
            else:
                assert value.placements == p.placements and value.shape[0] == p.shape[0], f"{label}: {key}"
                assert value.to_local().shape[0] == p.to_local().shape[0], f"{label}: {key} local rows"
    assert encoded >= 4, f"{label}: only {encoded} encoded parts: the test is vacuous"


def _fresh(mesh, codec: str):
    from torch.distributed.fsdp import fully_shard

    model = _mlp(_settings(codec)[2])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # not the saved weights: a load must bring them
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, _optimizer(model.parameters(), codec)


def _resume_torch_save(model, optimizer, mesh, codec):
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed, resumed_optimizer = _fresh(mesh, codec)
    resumed.load_state_dict(saved["model"])
    resumed_optimizer.load_state_dict(saved["optimizer"])
    return resumed, resumed_optimizer


def _dcp_save(model, optimizer, directory: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=directory)


def _dcp_load(mesh, codec: str, directory: str):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, optimizer = _fresh(mesh, codec)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    target = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(target, checkpoint_id=directory)
    set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optimizer"])
    return model, optimizer


def _run_codec(codec: str, rank: int, world_size: int, mesh, solo, directory: str) -> dict:
    from torch.distributed.fsdp import fully_shard

    model = _mlp(_settings(codec)[2])
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    rows = [p.to_local().shape[0] for p in model.parameters()]
    if world_size == 4:
        assert rows[-2] == (0 if rank == 3 else 1), f"rank {rank} holds {rows[-2]} rows of the last weight"
    optimizer = _optimizer(model.parameters(), codec)
    _steps(model, optimizer, 0, STEPS)
    _check_state_dict(f"{codec} at {world_size} ranks", model, optimizer)
    result = {"after": _snapshot(model, optimizer)}

    resumed = {"torch.save": _resume_torch_save(model, optimizer, mesh, codec)}
    _dcp_save(model, optimizer, os.path.join(directory, f"{codec}-{world_size}"))
    for saved_at in WORLD_SIZES:
        source = os.path.join(directory, f"{codec}-{saved_at}")
        if os.path.exists(os.path.join(source, ".metadata")):
            resumed[f"DCP {saved_at} -> {world_size}"] = _dcp_load(mesh, codec, source)
        if solo is not None and saved_at > 1:  # and on one rank, each rank a world of its own
            resumed[f"DCP {saved_at} -> 1"] = _dcp_load(solo, codec, source)
    for label, (resumed_model, resumed_optimizer) in resumed.items():
        _check_state_dict(f"{codec}, {label}", resumed_model, resumed_optimizer)
        _steps(resumed_model, resumed_optimizer, STEPS, RESUME_STEPS)
    _steps(model, optimizer, STEPS, RESUME_STEPS)
    for label, (resumed_model, _) in resumed.items():
        for (name, p), q in zip(model.named_parameters(), resumed_model.parameters()):
            assert torch.equal(_full(p), _full(q)), f"{codec}, resumed via {label}: {name} differs"
    result["resumed"] = sorted(resumed)
    result["final"] = _snapshot(model, optimizer)
    if codec in CODECS:
        result["converted"] = _snapshot(model, _converted(model.parameters(), optimizer, codec))
    return result


def _converted(params, optimizer, codec: str):
    """``optimizer``'s state loaded into one of the next format (bf16 -> int8 -> int4 -> bf16): every
    encoded buffer decoded and encoded again, on the shards (all-reducing what a boundary cuts)."""
    import warnings

    target = _optimizer(params, CODECS[(CODECS.index(codec) + 1) % len(CODECS)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        target.load_state_dict(optimizer.state_dict())
    assert any("converted" in str(w.message) for w in caught), f"{codec}: no conversion on load"
    return target


def _worker(rank: int, world_size: int, directory: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    # in the last spawn, a 1-rank mesh on each rank too: checkpoints of more ranks load on one
    solo = init_device_mesh("cpu", (world_size, 1), mesh_dim_names=("ranks", "solo"))["solo"] \
        if world_size == WORLD_SIZES[-1] else None
    results = {}
    for codec in CASES:
        try:
            results[codec] = _run_codec(codec, rank, world_size, mesh, solo, directory)
        except Exception as error:
            labelled(error, rank, codec)
            raise
    if rank == 0:
        torch.save(results, os.path.join(directory, f"results-{world_size}.pt"))


# --------------------------------------------------------------------------- the test
def _unsharded(codec: str) -> dict:
    model = _mlp(_settings(codec)[2])
    optimizer = _optimizer(model.parameters(), codec)
    _steps(model, optimizer, 0, STEPS)
    out = {"after": _snapshot(model, optimizer), "model": model}
    _steps(model, optimizer, STEPS, RESUME_STEPS)
    out["final"] = _snapshot(model, optimizer)
    if codec in CODECS:
        out["converted"] = _snapshot(model, _converted(model.parameters(), optimizer, codec))
    return out


def _unsharded_parts(stored: str, key: str, parts: dict, p: torch.Tensor) -> torch.Tensor:
    """A plain tensor's part in the sharded layout: codes by rows (int4 unpacked), a matrix's block
    scales as the table of the blocks each row meets."""
    from gradwise.state import codec_from
    from gradwise.state.quantize import unpack4
    from gradwise.state.shards import LocalShard

    value = parts[key]
    shard = LocalShard.whole(p.shape)
    if key.endswith(".codes"):
        return (unpack4(value)[: p.numel()] if stored == "int4" else value).view(p.shape[0], -1)
    if key.endswith(".absmax") and p.dim() > 1:
        index, meets = shard.table_index(codec_from(key.split("@")[1].rsplit(".", 1)[0]).block_size, value.device)
        return torch.where(meets, value[index], 0.0)
    return value


def _comparable(stored: str, key: str, value: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A sharded run's part as ``_unsharded_parts`` gives it (int4 codes unpacked, within each row)."""
    from gradwise.state.shards import LocalShard, unpack_rows

    if key.endswith(".codes") and stored == "int4":
        return unpack_rows(value, LocalShard.whole(p.shape), 4).view(p.shape[0], -1)
    return value


def test_encoded_state_is_bit_identical_at_1_2_4_ranks_and_unsharded(tmp_path):
    for world_size in WORLD_SIZES:
        spawn(_worker, world_size, str(tmp_path))
    results = {w: torch.load(tmp_path / f"results-{w}.pt", weights_only=True) for w in WORLD_SIZES}
    for codec in CASES:
        reference = _unsharded(codec)
        params = list(reference["model"].parameters())
        for world_size in WORLD_SIZES:
            got = results[world_size][codec]
            assert reference.keys() - {"model"} == got.keys() - {"resumed"}, codec
            for when in got.keys() - {"resumed"}:
                for index, p in enumerate(params):
                    want, have = reference[when][index], got[when][index]
                    where = f"{codec}, {world_size} ranks, {when}, parameter {index} {tuple(p.shape)}"
                    assert torch.equal(have["param"], want["param"]), f"{where}: parameters differ"
                    assert want["decoded"].keys() == have["decoded"].keys(), where
                    for key, value in want["decoded"].items():
                        assert torch.equal(have["decoded"][key], value), f"{where}: decoded {key} differs"
                    assert want["parts"].keys() == have["parts"].keys(), where
                    for key in want["parts"]:
                        stored = key.split("@")[1].split("-")[0].split(".")[0]  # the format: bf16, int8, int4
                        expected = _unsharded_parts(stored, key, want["parts"], p)
                        actual = _comparable(stored, key, have["parts"][key], p)
                        assert torch.equal(actual, expected), f"{where}: part {key} differs"
        encoded = [i for i, p in enumerate(params) if reference["after"][i]["parts"]]
        every = _settings(codec)[1] == 1
        assert encoded == ([0, 1, 2, 3, 4, 5] if every else [0, 2, 3, 4]), f"{codec}: encoded parameters {encoded}"
        kinds = {k.rsplit(".", 1)[1] for i in encoded for k in reference["after"][i]["parts"]}
        assert kinds == ({"value"} if codec == "bf16" else {"codes", "absmax", "row_max", "col_max"}), kinds
        assert all(p.dtype == _settings(codec)[2] for p in params), codec
    assert results[2]["int8"]["resumed"] == ["DCP 1 -> 2", "DCP 2 -> 2", "torch.save"]
    assert results[4]["int8"]["resumed"] == ["DCP 1 -> 4", "DCP 2 -> 1", "DCP 2 -> 4", "DCP 4 -> 1", "DCP 4 -> 4",
                                             "torch.save"]
