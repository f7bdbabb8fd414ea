"""``gradwise.DeMo``, PowerSGD's counted DDP hook and PowerSGD in FSDP2's reduce-scatter on real gloo ranks,
against float64 references.

One spawn of two ranks runs every distributed case (``outcomes``), each rank on its own batches:

* **DeMo reference**: the workers' algorithm written out from the paper in numpy float64 in
  ``tests/references/demo.py`` (scipy's orthonormal DCT-II per block, each worker's momentum, its top-k
  components per block removed from it, each component's mean over the workers that sent it, the inverse
  DCT, sign, q itself or the Adam-like final step, decoupled weight decay), step by step for 20 steps, within
  1e-10; the parameters are the same on both workers;
* **DeMo resume**: ``state_dict`` through ``torch.save`` and through ``torch.distributed.checkpoint`` (each
  worker's under its own key, loaded into a fresh DeMo's ``state_dict``) into a new model and DeMo, and a
  ``copy.deepcopy``, continue bit-identically (the sent bytes too);
* **DeMo bytes**: ``comm_stats`` equals the sizes computed here by hand from the shapes;
* **PowerSGD reference**: DDP with ``register_powersgd`` (rank 2, two plain steps first) against PowerSGD
  written out here in float64 (P = M Q summed and orthonormalized, Q = M^T P averaged, warm-started, the
  error fed back), each step's gradients within 1e-10 over 22 steps, and its bytes by hand;
* **PowerSGD in FSDP2** (``register_powersgd_fsdp``; the cases of ``tests/powersgd_fsdp_cases.py``): FSDP2's
  gradients at full rank, a float64 reference step by step, bytes by hand, a DCP resume, and the refusals;
* **a worker that raises** (last, so that the spawn fails on purpose): the other worker, waiting in DeMo's
  all-gather, is stopped at once, well before gloo's collective timeout, and the test fails with the error.
"""
from __future__ import annotations

import copy
import gc
import io
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist

import gradwise
from gradwise.distributed.powersgd import register_powersgd
from gradwise.distributed.powersgd_fsdp import register_powersgd_fsdp
from tests.distributed_harness import (
    assert_stopped_with_error,
    case_failures,
    needs_gloo,
    raise_on_purpose,
    run_cases,
    spawn_failing_on_purpose,
    went_on,
)
from tests.low_comm_models import DEMO_VARIANTS, ConvNet, dcp_round_trip
from tests.powersgd_fsdp_cases import CASES as FSDP_CASES
from tests.references.demo import simulate as simulate_demo
from tests.references.powersgd import worker_gradients

WORLD_SIZE = 2
#: DeMo's settings in the tests: blocks of up to 5 x 5, 3 components of each sent
CHUNK, TOPK = 5, 3


# --------------------------------------------------------------------------- models and data
def _batch(step: int, rank: int, shape_x, shape_y, dtype):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(*shape_x, generator=g, dtype=dtype), torch.randn(*shape_y, generator=g, dtype=dtype)


def _backward(model, step: int, rank: int) -> None:
    x, y = _batch(step, rank, (4, 2, 5), (4, 3), next(model.parameters()).dtype)
    torch.nn.functional.mse_loss(model(x), y).backward()


def _train(optimizer, model, steps, rank: int) -> None:
    for step in steps:
        _backward(model, step, rank)
        optimizer.step()
        optimizer.zero_grad()


# --------------------------------------------------------------------------- PowerSGD from the paper, float64
def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1)).double()


def _mlp_backward(model, step: int, rank: int) -> None:
    x, y = _batch(step, rank, (4, 16), (4, 1), torch.float64)
    torch.nn.functional.mse_loss(model(x), y).backward()


def _orthonormal(matrix: torch.Tensor) -> torch.Tensor:
    return torch.linalg.qr(matrix).Q


def _powersgd_reference(steps: int, lr: float, plain: int, rank: int, seed: int) -> list[list[torch.Tensor]]:
    """Each step's averaged gradients; only the first weight (12 x 16) is worth compressing at rank 2."""
    model = _mlp()
    params = [p.detach().clone() for p in model.parameters()]
    errors = [torch.zeros(12, 16, dtype=torch.float64) for _ in range(WORLD_SIZE)]
    q = None
    out = []
    for step in range(steps):
        grads = worker_gradients(model, params, WORLD_SIZE, lambda m, worker: _mlp_backward(m, step, worker))
        mean = [sum(g[i] for g in grads) / WORLD_SIZE for i in range(len(params))]
        if step >= plain:
            matrices = [grads[w][0] + errors[w] for w in range(WORLD_SIZE)]
            if q is None:  # torch's random start, the same on every worker
                torch.manual_seed(np.random.RandomState(seed).randint(1_000_000_000))
                q = torch.randn(1, 16, rank, dtype=torch.float64)[0]
            q = _orthonormal(q)
            p_factor = _orthonormal(sum(m @ q for m in matrices))
            q = sum(m.T @ p_factor for m in matrices) / WORLD_SIZE
            mean[0] = p_factor @ q.T
            errors = [m - mean[0] for m in matrices]
        out.append(mean)
        params = [p - lr * g for p, g in zip(params, mean)]
    return out


# --------------------------------------------------------------------------- the cases, inside each rank
def _case_demo_reference(rank: int) -> None:
    for label, kwargs in DEMO_VARIANTS:
        model = ConvNet()
        initial = [p.detach().clone() for p in model.parameters()]
        demo = gradwise.DeMo(model.parameters(), lr=1e-2, momentum=0.9, chunk=CHUNK, topk=TOPK, **kwargs)
        _train(demo, model, range(20), rank)
        expected = simulate_demo(ConvNet(), _backward, WORLD_SIZE, 20, 1e-2, 0.9, chunk=CHUNK, topk=TOPK, **kwargs)
        for i, (p, q, before) in enumerate(zip(model.parameters(), expected, initial, strict=True)):
            assert (p - before).abs().max() > 1e-3, f"{label}: parameter {i} barely moved; the check is vacuous"
            torch.testing.assert_close(p.detach(), torch.from_numpy(q), rtol=1e-10, atol=1e-10,
                                       msg=lambda m: f"{label}, parameter {i}: {m}")
        theirs = [torch.empty_like(initial[0]) for _ in range(WORLD_SIZE)]
        dist.all_gather(theirs, next(model.parameters()).detach().contiguous())
        assert torch.equal(theirs[0], theirs[1]), f"{label}: the workers' parameters differ"
        # the residual momentum differs between workers: each kept its own
        momentum = demo.state[next(model.parameters())]["momentum"]
        dist.all_gather(theirs, momentum)
        assert not torch.equal(theirs[0], theirs[1]), f"{label}: the workers' momenta are the same"


def _case_demo_resume(rank: int) -> None:
    kwargs = {"lr": 1e-2, "momentum": 0.9, "chunk": CHUNK, "topk": TOPK, "weight_decay": 0.1}
    model = ConvNet(torch.float32)
    demo = gradwise.DeMo(model.parameters(), **kwargs)
    _train(demo, model, range(4), rank)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "demo": demo.state_dict()}, buffer)
    copied_model, copied = copy.deepcopy((model, demo))
    saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    resumed_model = ConvNet(torch.float32)
    resumed_model.load_state_dict(saved["model"])
    resumed = gradwise.DeMo(resumed_model.parameters(), **kwargs)
    resumed.load_state_dict(saved["demo"])
    # through torch.distributed.checkpoint, each worker's state under its own key (the momenta differ),
    # loaded into a fresh DeMo's state_dict
    directory = os.path.join(tempfile.gettempdir(), f"gradwise-demo-dcp-{os.getppid()}")
    dcp_model = ConvNet(torch.float32)
    from_dcp = gradwise.DeMo(dcp_model.parameters(), **kwargs)
    dcp_round_trip(f"worker{rank}", directory, (model, demo), (dcp_model, from_dcp))
    assert from_dcp.state[next(dcp_model.parameters())]["momentum"].abs().max() > 0
    for m, d in ((model, demo), (copied_model, copied), (resumed_model, resumed), (dcp_model, from_dcp)):
        _train(d, m, range(4, 10), rank)
    for other, label in ((resumed_model, "resumed from state_dict"), (copied_model, "deepcopy"),
                         (dcp_model, "resumed through DCP")):
        for p, q in zip(model.parameters(), other.parameters(), strict=True):
            assert torch.equal(p, q), f"{label} vs uninterrupted: max abs diff {(p - q).abs().max().item():.3g}"
    assert resumed.comm_stats == demo.comm_stats == copied.comm_stats == from_dcp.comm_stats and demo.steps == 10


def _case_demo_bytes(rank: int) -> None:
    # blocks x min(k, components) selected: conv weight as (4, 6) in 4 x 3 blocks: 2 x 3; conv bias (4,): 1 x 3;
    # out weight (3, 12) in 3 x 4 blocks: 3 x 3; out bias (3,): 1 x 3. 21 components of float32 + int16: 126 bytes
    model = ConvNet(torch.float32)
    demo = gradwise.DeMo(model.parameters(), chunk=CHUNK, topk=TOPK)
    _train(demo, model, range(3), rank)
    assert demo.comm_stats == {"collectives": 3, "bytes_sent": 378, "all_gather_bytes": 378, "steps": 3,
                               "bytes_sent_per_step": 126.0}, demo.comm_stats
    # float64, topk 1: 7 components of 8 + 2 bytes
    model = ConvNet()
    demo = gradwise.DeMo(model.parameters(), chunk=CHUNK, topk=1)
    _train(demo, model, range(2), rank)
    assert demo.comm_stats["bytes_sent_per_step"] == 70, demo.comm_stats


def _case_powersgd_reference(rank: int) -> None:
    model = _mlp()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    counted = register_powersgd(ddp, rank=2, start_powerSGD_iter=2, random_seed=7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = _powersgd_reference(22, 0.1, plain=2, rank=2, seed=7)
    for step in range(22):
        _mlp_backward(ddp, step, rank)
        for i, (p, g) in enumerate(zip(model.parameters(), expected[step], strict=True)):
            torch.testing.assert_close(p.grad, g, rtol=1e-10, atol=1e-12, msg=lambda m: f"step {step}, grad {i}: {m}")
        optimizer.step()
        optimizer.zero_grad()
    # the compressed weight gradient is of rank 2, the plain steps' of more (the check is not vacuous)
    assert torch.linalg.matrix_rank(expected[-1][0]) == 2 and torch.linalg.matrix_rank(expected[0][0]) > 2
    # plain steps: the bucket's 192 + 12 + 12 + 1 = 217 float64 elements; then uncompressed 12 + 12 + 1,
    # P 12 x 2, Q 16 x 2: 81 elements in three all-reduces
    plain, compressed = 217 * 8, (25 + 24 + 32) * 8
    assert counted.comm_stats == {"collectives": 2 + 3 * 20, "bytes_sent": 2 * plain + 20 * compressed,
                                  "all_reduce_bytes": 2 * plain + 20 * compressed, "steps": 22,
                                  "bytes_sent_per_step": (2 * plain + 20 * compressed) / 22}, counted.comm_stats
    # free DDP (its reducer, comm hook and their futures) now, in the main thread, while the process group
    # lives: left to a later garbage collection it was once freed in a gloo thread, which then joined itself
    # ("terminate called ... Resource deadlock avoided", the rank killed by SIGABRT)
    del ddp, counted, optimizer
    gc.collect()


CASES = {"demo reference": _case_demo_reference, "demo resume": _case_demo_resume, "demo bytes": _case_demo_bytes,
         "powersgd reference": _case_powersgd_reference, **FSDP_CASES}


def _worker(rank: int, world_size: int, directory: str) -> None:
    """Every case in the same order on every rank; then rank 1 raises mid-step."""
    run_cases(CASES, rank, directory)
    model = ConvNet(torch.float32)
    demo = gradwise.DeMo(model.parameters())
    _backward(model, 0, rank)
    if rank == 1:
        raise_on_purpose(directory, "worker 1 fails on purpose before its step")
    demo.step()  # waits in the all-gather for worker 1, which never comes
    went_on(directory, "the all-gather returned without worker 1")


# --------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    """Each rank's outcome of every case, and how the failing worker ended the spawn."""
    return spawn_failing_on_purpose(_worker, WORLD_SIZE, tmp_path_factory.mktemp("demo"))


@pytest.mark.slow
@needs_gloo
@pytest.mark.parametrize("case", list(CASES))
def test_on_two_gloo_ranks(outcomes, case):
    failures = case_failures(outcomes, case)
    assert not failures, failures


@pytest.mark.slow
@needs_gloo
def test_a_worker_that_raises_stops_every_worker_with_its_error(outcomes):
    assert_stopped_with_error(outcomes, "worker 1 fails on purpose", "demo.py")


# --------------------------------------------------------------------------- one process, no spawn
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"lr": -1.0}, r"lr=-1.0: expected a finite number >= 0"),
    ({"lr": float("nan")}, r"lr=nan"),
    ({"momentum": 1.0}, r"momentum=1.0: expected a number from 0 to 1 \(1 excluded\)"),
    ({"momentum": True}, r"momentum=True"),
    ({"weight_decay": -0.1}, r"weight_decay=-0.1: expected a finite number >= 0"),
    ({"chunk": 0}, r"chunk=0: expected an int >= 1"),
    ({"topk": 2.0}, r"topk=2.0: expected an int >= 1"),
    ({"sign": 1}, r"sign=1: expected True"),
    ({"adam_beta2": 1.0, "sign": False}, r"adam_beta2=1.0: expected None or a number from 0 to 1 \(1 excluded\)"),
    ({"adam_beta2": 0.99}, r"adam_beta2=0.99 with sign=True: .* expected sign=False with it"),
    ({"eps": 0.0}, r"eps=0.0: expected a finite number > 0"),
    ({"process_group": object()}, r"process_group=.*torch.distributed is not initialized"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        gradwise.DeMo(ConvNet().parameters(), **kwargs)


def test_an_integer_parameter_and_a_second_device_are_refused():
    with pytest.raises(ValueError, match=r"parameter 1 has dtype torch.int64"):
        gradwise.DeMo([torch.nn.Parameter(torch.ones(2)), torch.ones(2, dtype=torch.long)])
    with pytest.raises(ValueError, match=r"parameter 1 is on meta, parameter 0 on cpu: DeMo sends one buffer"):
        gradwise.DeMo([torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2, device="meta"))])


def test_every_component_sent_without_momentum_or_sign_is_sgd():
    """One worker, k = every component of a block, beta = 0, q itself: q is the gradient (the DCT is
    orthonormal), nothing is left in the momentum, nothing is sent without torch.distributed."""
    model, plain = ConvNet(), ConvNet()
    demo = gradwise.DeMo(model.parameters(), lr=0.1, momentum=0.0, chunk=CHUNK, topk=25, sign=False)
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1)
    _train(demo, model, range(3), 0)
    _train(sgd, plain, range(3), 0)
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)
        assert demo.state[p]["momentum"].abs().max() < 1e-14
    assert demo.comm_stats == {"collectives": 0, "bytes_sent": 0, "steps": 3, "bytes_sent_per_step": 0.0}


def test_a_missing_gradient_is_refused_before_anything_changes():
    model = ConvNet()
    demo = gradwise.DeMo(model.parameters(), chunk=CHUNK, topk=TOPK)
    _train(demo, model, range(1), 0)
    before = copy.deepcopy((model.state_dict(), demo.state_dict()))
    _backward(model, 1, 0)
    model.out.bias.grad = None
    with pytest.raises(ValueError, match=r"parameter 3 \(shape \(3,\)\) has no gradient"):
        demo.step()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), before[0].values()))
    assert all(torch.equal(s["momentum"], before[1]["state"][i]["momentum"]) for i, s in
               enumerate(demo.state_dict()["state"].values())) and demo.steps == 1


def test_a_state_of_another_model_or_setting_is_refused_before_anything_changes():
    model = ConvNet()
    demo = gradwise.DeMo(model.parameters(), chunk=CHUNK, topk=TOPK)
    _train(demo, model, range(2), 0)
    before = copy.deepcopy(demo.state_dict())
    other = gradwise.DeMo(ConvNet().parameters(), chunk=CHUNK, topk=TOPK + 1)
    with pytest.raises(ValueError, match=r"topk=4, this DeMo topk=3"):
        demo.load_state_dict(other.state_dict())
    wrong = copy.deepcopy(before)
    wrong["state"][0]["momentum"] = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"momentum of parameter 0 has shape \(3, 3\), this model's \(4, 2, 3\)"):
        demo.load_state_dict(wrong)
    assert all(torch.equal(demo.state_dict()["state"][i]["momentum"], s["momentum"])
               for i, s in before["state"].items())


def test_powersgd_refuses_a_module_without_ddp_and_bad_settings():
    with pytest.raises(TypeError, match=r"invalid model, a Sequential: expected a DistributedDataParallel"):
        register_powersgd(_mlp())
    ddp_free = object.__new__(torch.nn.parallel.DistributedDataParallel)  # the checks come before any use
    with pytest.raises(ValueError, match=r"rank=0: expected an int >= 1"):
        register_powersgd(ddp_free, rank=0)
    with pytest.raises(ValueError, match=r"start_powerSGD_iter=1: expected an int >= 2"):
        register_powersgd(ddp_free, start_powerSGD_iter=1)
    with pytest.raises(ValueError, match=r"min_compression_rate=-1"):
        register_powersgd(ddp_free, min_compression_rate=-1)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"rank": 0}, r"rank=0: expected an int >= 1"),
    ({"rank": True}, r"rank=True"),
    ({"start_powerSGD_iter": -1}, r"start_powerSGD_iter=-1: expected an int >= 0"),
    ({"min_compression_rate": float("inf")}, r"min_compression_rate=inf: expected a finite number >= 0"),
    ({"random_seed": 1.5}, r"random_seed=1.5: expected an int >= 0"),
])
def test_powersgd_for_fsdp2_refuses_bad_settings_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):  # the settings are checked before the model
        register_powersgd_fsdp(_mlp(), **kwargs)


def test_powersgd_for_fsdp2_refuses_a_module_fsdp2_does_not_shard():
    with pytest.raises(TypeError, match=r"invalid model, a Sequential: expected a module fully_shard'ed by FSDP2"):
        register_powersgd_fsdp(_mlp())
