"""PowerSGD in FSDP2's reduce-scatter (``register_powersgd_fsdp``): the cases ``tests/test_demo.py``'s spawn of 2
gloo ranks runs (``CASES``), each rank on its own batches.

* **full rank is FSDP2**: before ``start_powerSGD_iter`` the gradients are FSDP2's bit for bit; at ``rank >=``
  every matrix's smaller side with ``min_compression_rate=0`` (every matrix compressed, the empty shard and a
  1 x 7 one too), each step's gradient shards and the SGD parameters equal plain FSDP2's to rounding,
  float32 (FSDP2's AVG) and float64 (its SUM of pre-divided inputs), on a model of uneven shards and on a
  module with its own parameter besides a child's (FSDP2's post-order), whose layout ``managed_parameters``
  reads as FSDP2's param group holds it;
* **float64 reference**: rank 2 after two plain steps against PowerSGD of ``tests/references/powersgd.py`` (the
  paper's algorithm, both workers in one process), each step's gradients within 1e-10 over 12 steps, and the
  bytes by hand from the shapes;
* **DCP resume**: model, AdamW and the PowerSGD state through ``torch.distributed.checkpoint`` into a fresh
  model and registration continue bit-identically (bytes too); without the PowerSGD state they do not;
* **refusals**: ``Shard(1)`` and a 2-D (HSDP) mesh at registration, an unused parameter at backward, a state
  of another registration at load, each naming what is wrong.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch
import torch.distributed as dist

from gradwise.distributed.powersgd_fsdp import managed_parameters, register_powersgd_fsdp
from tests.references.powersgd import PowerSGDMeans, worker_gradients

WORLD = 2


class Mixed(torch.nn.Module):
    """A parameter of its own besides a child's: FSDP2 manages the child's first (post-order)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(5, 4) / 2)
        self.inner = torch.nn.Linear(16, 5)

    def forward(self, x):
        return torch.tanh(self.inner(x)) @ self.a


class TwoHeads(torch.nn.Module):
    """Two heads, the second never used: its parameters get no gradient."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = torch.nn.Linear(16, 12), torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.used(x)


def _net(dtype, mixed: bool = False) -> torch.nn.Module:
    """16 -> 12 -> 7 -> 1: rows 12 split 6 / 6, 7 split 4 / 3, 1 split 1 / 0 (an empty shard)."""
    torch.manual_seed(0)
    if mixed:
        return torch.nn.Sequential(Mixed(), torch.nn.Linear(4, 1)).to(dtype)
    return torch.nn.Sequential(torch.nn.Linear(16, 12), torch.nn.Tanh(), torch.nn.Linear(12, 7), torch.nn.Tanh(),
                               torch.nn.Linear(7, 1)).to(dtype)


def _shard(model: torch.nn.Module, mesh=None) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = mesh or init_device_mesh("cpu", (WORLD,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _backward(model, step: int, rank: int) -> None:
    g = torch.Generator().manual_seed(1000 * step + rank)
    dtype = next(model.parameters()).dtype
    x, y = torch.randn(4, 16, generator=g, dtype=dtype), torch.randn(4, 1, generator=g, dtype=dtype)
    torch.nn.functional.mse_loss(model(x), y).backward()


def _sgd_steps(model, steps, rank: int, lr: float = 0.1):
    """Each step's gradients (whole tensors), the model stepped by SGD."""
    grads = []
    for step in steps:
        _backward(model, step, rank)
        grads.append([p.grad.full_tensor() for p in model.parameters()])
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-lr)
                p.grad = None
    return grads


def case_full_rank_is_fsdp2(rank: int) -> None:
    for dtype, tolerance in ((torch.float32, dict(rtol=1e-5, atol=1e-6)),
                             (torch.float64, dict(rtol=1e-12, atol=1e-13))):
        for mixed in (False, True):
            label = f"{dtype}, {'Mixed' if mixed else 'MLP'}"
            plain, compressed = _shard(_net(dtype, mixed)), _shard(_net(dtype, mixed))
            counted = register_powersgd_fsdp(compressed, rank=16, start_powerSGD_iter=0, min_compression_rate=0)
            if mixed:  # FSDP2's own order of the root's parameters (torch's private param group: a test's check)
                group = compressed._get_fsdp_state()._fsdp_param_group
                assert [p for _, p in managed_parameters(compressed)] == \
                    [f.sharded_param for f in group.fsdp_params], f"{label}: another order than FSDP2's"
                assert [n for n, _ in managed_parameters(compressed)] == ["0.inner.weight", "0.inner.bias", "0.a"]
            assert len(counted.q) == 3, f"{label}: compressed {sorted(counted.q)}"
            # before start_powerSGD_iter: FSDP2's reduce-scatter of the same buffer, bit for bit
            uncompressed = _shard(_net(dtype, mixed))
            register_powersgd_fsdp(uncompressed, start_powerSGD_iter=10)
            expected, actual = _sgd_steps(plain, range(4), rank), _sgd_steps(compressed, range(4), rank)
            for gs, hs in zip(expected, _sgd_steps(uncompressed, range(4), rank)):
                assert all(torch.equal(g, h) for g, h in zip(gs, hs)), f"{label}: the plain steps differ from FSDP2's"
            for step, (gs, hs) in enumerate(zip(expected, actual)):
                for i, (g, h) in enumerate(zip(gs, hs)):
                    torch.testing.assert_close(h, g, **tolerance, msg=lambda m: f"{label}, step {step}, grad {i}: {m}")
            for p, q in zip(plain.parameters(), compressed.parameters()):
                torch.testing.assert_close(q.full_tensor(), p.full_tensor(), **tolerance)
            assert counted.comm_stats["all_reduce_bytes"] > 0 and counted.steps == 4, counted.comm_stats


def case_float64_reference(rank: int) -> None:
    model = _shard(_net(torch.float64))
    counted = register_powersgd_fsdp(model, rank=2, start_powerSGD_iter=2)
    assert sorted(counted.q) == ["0.weight", "2.weight"], sorted(counted.q)  # 1 x 7 at rank 1 would not halve
    steps, lr = 12, 0.1
    actual = _sgd_steps(model, range(steps), rank, lr)
    # the reference: both workers' gradients at the reference's parameters, one process
    reference = _net(torch.float64)
    params = [p.detach().clone() for p in reference.parameters()]
    means = PowerSGDMeans(2, params, WORLD)
    zeros = [torch.zeros_like(p) for p in params]
    for step in range(steps):
        grads = worker_gradients(reference, params, WORLD, lambda m, worker: _backward(m, step, worker))
        mean = [sum(g[i] for g in grads) / WORLD for i in range(len(params))]
        plain = [m.clone() for m in mean]
        if step >= 2:  # PowerSGDMeans compresses pseudo-gradients, synced - worker's: here 0 - (-g) = g
            for i, m in means([0, 2], zeros, [[-x for x in g] for g in grads]).items():
                mean[i] = m
        for i, (g, h) in enumerate(zip(mean, actual[step])):
            torch.testing.assert_close(h, g, rtol=1e-10, atol=1e-12, msg=lambda m: f"step {step}, grad {i}: {m}")
        params = [p - lr * g for p, g in zip(params, mean)]
    # the compressed gradients are of rank 2, the plain ones' of more: the check is not vacuous
    assert torch.linalg.matrix_rank(actual[-1][0]) == 2 and torch.linalg.matrix_rank(plain[0]) > 2
    # plain step per module (padded rows, float64, half of each reduce-scatter's input to the other rank):
    # (12 x 16 + 12) / 2, (8 x 12 + 8) / 2, (2 x 7 + 2) / 2 elements; a compressed step: the biases' 12 / 2 and
    # 8 / 2, P 12 x 2 + 7 x 2 and Q 16 x 2 + 12 x 2 all-reduced, the last module plain
    plain_bytes = (102 + 52 + 8) * 8
    rs, ar = (6 + 4 + 8) * 8, (24 + 32 + 14 + 24) * 8
    assert counted.comm_stats == {"collectives": 2 * 3 + 10 * 7, "bytes_sent": 2 * plain_bytes + 10 * (rs + ar),
                                  "all_reduce_bytes": 10 * ar, "reduce_scatter_bytes": 2 * plain_bytes + 10 * rs,
                                  "steps": 12, "bytes_sent_per_step": (2 * plain_bytes + 10 * (rs + ar)) / 12}, \
        counted.comm_stats


def _adamw_steps(model, optimizer, steps, rank: int) -> None:
    for step in steps:
        _backward(model, step, rank)
        optimizer.step()
        optimizer.zero_grad()


def case_dcp_resume(rank: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def build(seed):
        model = _net(torch.float32)
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * seed)
        model = _shard(model)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2), register_powersgd_fsdp(
            model, rank=2, start_powerSGD_iter=1)

    model, optimizer, counted = build(0)
    _adamw_steps(model, optimizer, range(4), rank)
    directory = os.path.join(tempfile.gettempdir(), f"gradwise-powersgd-fsdp-dcp-{os.getppid()}")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state, "powersgd": counted.state_dict()},
             checkpoint_id=directory)
    runs = {}
    for with_state in (True, False):  # and without the PowerSGD state: the check is not vacuous
        resumed, resumed_optimizer, resumed_counted = build(1)
        model_state, optimizer_state = get_state_dict(resumed, resumed_optimizer)
        target = {"model": model_state, "optimizer": optimizer_state}
        if with_state:
            target["powersgd"] = resumed_counted.state_dict()
        dcp.load(target, checkpoint_id=directory)
        set_state_dict(resumed, resumed_optimizer, model_state_dict=target["model"],
                       optim_state_dict=target["optimizer"])
        if with_state:
            resumed_counted.load_state_dict(target["powersgd"])
        runs[with_state] = (resumed, resumed_optimizer, resumed_counted)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(directory)
    assert any(e.abs().max() > 0 for e in runs[True][2].error.values()), "the resumed errors are all zero"
    for m, opt, _ in ((model, optimizer, counted), *runs.values()):
        _adamw_steps(m, opt, range(4, 8), rank)
    for p, q, r in zip(model.parameters(), runs[True][0].parameters(), runs[False][0].parameters()):
        assert torch.equal(p.to_local(), q.to_local()), f"resumed vs uninterrupted: {(p - q).abs().max()}"
    assert not all(torch.equal(p.to_local(), r.to_local()) for p, r in zip(model.parameters(),
                                                                           runs[False][0].parameters())), \
        "resumed without the PowerSGD state, the run is the same: the check is vacuous"
    assert runs[True][2].comm_stats == counted.comm_stats and counted.steps == 8, counted.comm_stats


def case_refusals(rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    model = torch.nn.Linear(8, 6)
    fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,)), shard_placement_fn=lambda p: Shard(p.dim() - 1))
    with pytest.raises(NotImplementedError, match=r"parameter 'weight' is a DTensor placed \(Shard\(dim=1\),\)"):
        register_powersgd_fsdp(model)
    hsdp = init_device_mesh("cpu", (1, WORLD), mesh_dim_names=("replicate", "shard"))
    with pytest.raises(NotImplementedError, match=r"parameter '0.weight' .* on a 2-D mesh: .* HSDP"):
        register_powersgd_fsdp(_shard(_net(torch.float32), hsdp))
    unused = TwoHeads()
    fully_shard(unused, mesh=init_device_mesh("cpu", (WORLD,)))
    register_powersgd_fsdp(unused, rank=2, start_powerSGD_iter=0)
    with pytest.raises(RuntimeError, match=r"reduce-scatter of module '<root>' holds 204 elements, .* 272 padded"):
        unused(torch.randn(2, 16)).sum().backward()  # the second head unused: the buffer lacks its blocks
    counted = register_powersgd_fsdp(_shard(_net(torch.float32)), rank=2)
    other = register_powersgd_fsdp(_shard(_net(torch.float32)), rank=3)
    before = {k: v.clone() for k, v in counted.q.items()}
    with pytest.raises(ValueError, match=r"not one of this model's at rank 2 on 2 workers"):
        counted.load_state_dict(other.state_dict())
    assert all(torch.equal(before[k], counted.q[k]) for k in before)


CASES = {"powersgd fsdp2 full rank": case_full_rank_is_fsdp2, "powersgd fsdp2 reference": case_float64_reference,
         "powersgd fsdp2 dcp resume": case_dcp_resume, "powersgd fsdp2 refusals": case_refusals}
