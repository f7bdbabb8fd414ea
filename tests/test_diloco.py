"""``gradwise.DiLoCo`` on real gloo ranks, against data-parallel training and a step-by-step simulation.

One spawn of two ranks runs every distributed case (``outcomes``), each rank on its own batches:

* **data-parallel**: with ``sync_every=1`` and an outer SGD of lr 1 without momentum, DiLoCo is data-parallel
  training with the inner optimizer, for an inner optimizer that is linear in the gradients (SGD, momentum,
  Nesterov): the mean of the workers' steps is the step on the mean gradient. Bit for bit where the
  arithmetic is exact (a quadratic on small dyadic numbers: every sum and halving exact), to float32
  rounding on an MLP;
* **simulation**: the workers simulated one after the other in this process, from the paper's rule written out
  in ``tests/references/diloco.py`` (pseudo-gradient = synced copy minus the worker's parameters, averaged, then
  the outer Nesterov ``b <- mu b + d; theta <- theta - lr (d + mu b)``): float64 with gradwise's AdamW inside
  against torch's AdamW, a torch inner optimizer with a gradwise outer one, Streaming DiLoCo's staggered
  fragments and its overlapped all-reduce (the outer step applied ``overlap`` steps late, the workers merged);
  and in float32 with bfloat16 pseudo-gradients (rounded as gloo sums them) and with int8 ones (gradwise's
  block codec: each worker's decoded, summed in worker order), bit for bit; the outer step a whole phase late,
  delayed and eager (Kale et al. 2025), and with CO2's staleness-gap penalty and clipping (Sun et al. 2024);
* **resume**: ``state_dict`` mid-phase (with a sync under way where the all-reduce is overlapped) through
  ``torch.save`` and through ``torch.distributed.checkpoint`` (each worker's state under its own key, loaded
  into a fresh DiLoCo's ``state_dict``), loaded into a new model and DiLoCo, and a ``copy.deepcopy`` of the
  model with its DiLoCo, continue bit-identically (the sent bytes too);
* **PowerSGD pseudo-gradients** (``pseudo_gradient_codec="powersgd-r2"``): against the paper's compression
  written out in ``tests/references/powersgd.py`` (float64, 20 steps, within 1e-10), not the uncompressed run;
  at full rank the uncompressed run; its bytes (three all-reduces per sync) by hand;
* **bytes**: ``comm_stats`` equals sizes computed here by hand from the shapes;
* **a worker that raises** (last, so that the spawn fails on purpose): the other worker, waiting in its
  all-reduce, is stopped at once (its all-reduce fails, or the harness ends it), well before gloo's
  collective timeout, and the test fails with the error.
"""
from __future__ import annotations

import copy
import functools
import io
import math
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import gradwise
from gradwise.state.codec import codec_from
from tests.distributed_harness import (
    assert_stopped_with_error,
    case_failures,
    needs_gloo,
    raise_on_purpose,
    run_cases,
    spawn_failing_on_purpose,
    went_on,
)
from tests.low_comm_models import IntegerQuadratic, dcp_round_trip, integer_quadratic_backward
from tests.references.co2 import co2_outer
from tests.references.diloco import simulate, simulate_stale
from tests.references.powersgd import PowerSGDMeans

WORLD_SIZE = 2
#: how far a parameter must move, so that an equality is not vacuous
MOVED = 1e-3


# --------------------------------------------------------------------------- models and data
def _mlp(dtype=torch.float32) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).to(dtype)


def _loss(model, step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    dtype = next(model.parameters()).dtype
    x, y = torch.randn(4, 6, generator=g, dtype=dtype), torch.randn(4, 3, generator=g, dtype=dtype)
    return torch.nn.functional.mse_loss(model(x), y)


def _backward(model, step: int, rank: int) -> None:
    _loss(model, step, rank).backward()


def _data_parallel_backward(backward, model, step: int, rank: int) -> None:
    backward(model, step, rank)
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= WORLD_SIZE


def _train(diloco, model, backward, steps, rank: int) -> None:
    for step in steps:
        backward(model, step, rank)
        diloco.step()
        diloco.zero_grad()


def _assert_moved(label: str, model, initial) -> None:
    for p, before in zip(model.parameters(), initial):
        assert (p - before).abs().max() > MOVED, f"{label}: a parameter barely moved; the check is vacuous"


def _assert_equal(label: str, a, b) -> None:
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), f"{label}: max abs diff {(p - q).abs().max().item():.3g}"


def _adamw(params, lr=1e-2):
    return gradwise.AdamW(params, lr=lr, weight_decay=0.1)


def _torch_adamw(params, lr=1e-2):
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.1)


# --------------------------------------------------------------------------- the cases, inside each rank
def _case_data_parallel(rank: int) -> None:
    inners = {"gradwise SGD momentum": lambda ps: gradwise.SGD(ps, lr=0.5, momentum=0.5),
              "torch SGD Nesterov": lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.5, nesterov=True)}
    for name, build in inners.items():
        for kind, make, backward, steps in (("exact", IntegerQuadratic, integer_quadratic_backward, 6),
                                            ("mlp", _mlp, _backward, 20)):
            label = f"{name}, {kind}"
            model, replica = make(), make()
            initial = [p.detach().clone() for p in model.parameters()]
            diloco = gradwise.DiLoCo(build(model.parameters()), outer=torch.optim.SGD, outer_lr=1.0, sync_every=1)
            replica_optimizer = build(replica.parameters())
            _train(diloco, model, backward, range(steps), rank)
            for step in range(steps):
                _data_parallel_backward(backward, replica, step, rank)
                replica_optimizer.step()
                replica_optimizer.zero_grad()
            _assert_moved(label, model, initial)
            if kind == "exact":
                _assert_equal(f"{label}: DiLoCo H=1 vs data-parallel", model, replica)
            else:
                for p, q in zip(model.parameters(), replica.parameters()):
                    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m: f"{label}: {m}")


def _against_simulation(label, diloco_of, reference, dtype, steps, rank, exact, **kwargs) -> None:
    model = _mlp(dtype)
    initial = [p.detach().clone() for p in model.parameters()]
    diloco = diloco_of(model)
    _train(diloco, model, _backward, range(steps), rank)
    models = [_mlp(dtype) for _ in range(WORLD_SIZE)]
    expected = simulate(models, [reference(m.parameters()) for m in models], _backward, dtype, steps,
                        diloco.sync_every, diloco.outer_lr, **kwargs)[rank]
    _assert_moved(label, model, initial)
    for p, q in zip(model.parameters(), expected, strict=True):
        if exact:
            assert torch.equal(p, q), f"{label}: max abs diff {(p - q).abs().max().item():.3g}"
        else:
            torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=lambda m: f"{label}: {m}")


def _against_stale(label: str, rank: int, eager: bool, penalty: float = 0.0, clip: float | None = None) -> None:
    """``overlap=sync_every``: each phase's average applied at the next sync, delayed or eager, and with
    CO2's staleness-gap penalty and clipping."""
    f64, steps, sync_every = torch.float64, 21, 3
    model = _mlp(f64)
    initial = [p.detach().clone() for p in model.parameters()]
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=sync_every, overlap=sync_every, eager=eager,
                             staleness_penalty=penalty, outer_clip=clip)
    _train(diloco, model, _backward, range(steps), rank)
    expected = _stale(steps, sync_every, eager, penalty, clip)
    _assert_moved(label, model, initial)
    for p, q in zip(model.parameters(), expected[rank], strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=lambda m: f"{label}: {m}")
    if eager:  # each worker's outer copy follows its own estimate
        assert any((a - b).abs().max() > MOVED for a, b in zip(*expected)), f"{label}: the workers agree"
    # each correction changes the run
    for name, other in (("the penalty", _stale(steps, sync_every, eager, 0.0, clip) if penalty else None),
                        ("the clipping", _stale(steps, sync_every, eager, penalty, None) if clip else None)):
        if other is not None:
            assert any((a - b).abs().max() > MOVED for a, b in zip(other[rank], expected[rank])), \
                f"{label}: {name} changes nothing"


def _stale(steps: int, sync_every: int, eager: bool, penalty: float, clip: float | None) -> list:
    models = [_mlp(torch.float64) for _ in range(WORLD_SIZE)]
    return simulate_stale(models, [_torch_adamw(m.parameters()) for m in models], _backward, steps, sync_every, 0.7,
                          0.9, eager, penalty=penalty, clip=clip)


def _case_simulation(rank: int) -> None:
    f64 = torch.float64
    # gradwise AdamW inside, the paper's outer Nesterov (0.9, lr 0.7) by default, H = 3
    _against_simulation("gradwise AdamW, default outer", lambda m: gradwise.DiLoCo(_adamw(m.parameters()),
                        sync_every=3), _torch_adamw, f64, 21, rank, exact=False, momentum=0.9)
    # a torch inner optimizer, a gradwise outer one
    outer = functools.partial(gradwise.SGD, momentum=0.9, nesterov=True)
    _against_simulation("torch Adam, gradwise SGD outer", lambda m: gradwise.DiLoCo(
        torch.optim.Adam(m.parameters(), lr=1e-2), outer=outer, outer_lr=0.5, sync_every=4),
        lambda ps: torch.optim.Adam(ps, lr=1e-2), f64, 20, rank, exact=False, momentum=0.9)
    # Streaming DiLoCo: two fragments, synced at staggered steps
    _against_simulation("two fragments", lambda m: gradwise.DiLoCo(_adamw(m.parameters()), sync_every=4,
                        fragments=2), _torch_adamw, f64, 22, rank, exact=False, momentum=0.9, fragments=2)
    # overlapped: the all-reduce runs behind two inner steps, then the workers merge half and half; and
    # behind one step, two fragments, the workers replaced
    _against_simulation("overlap 2, merge 0.5", lambda m: gradwise.DiLoCo(_adamw(m.parameters()), sync_every=4,
                        overlap=2, merge_alpha=0.5), _torch_adamw, f64, 22, rank, exact=False, momentum=0.9,
                        overlap=2, alpha=0.5)
    _against_simulation("overlap 1, two fragments", lambda m: gradwise.DiLoCo(
        _adamw(m.parameters()), sync_every=4, fragments=2, overlap=1), _torch_adamw, f64, 21, rank, exact=False,
        momentum=0.9, fragments=2, overlap=1)
    # the all-reduce behind a whole phase: delayed outer gradients, and Kale et al.'s eager updates
    _against_stale("overlap H, delayed", rank, eager=False)
    _against_stale("overlap H, eager", rank, eager=True)
    # CO2: the delayed average penalized by its staleness gap, and clipped
    _against_stale("overlap H, CO2 penalty", rank, eager=False, penalty=1.0)
    _against_stale("overlap H, CO2 penalty and clipping", rank, eager=False, penalty=0.5, clip=0.1)
    _against_stale("overlap H, eager, clipped", rank, eager=True, clip=0.1)
    # bfloat16 pseudo-gradients, float32 parameters: bit for bit (the same inner optimizer simulated)
    _against_simulation("bfloat16 pseudo-gradients", lambda m: gradwise.DiLoCo(
        _adamw(m.parameters()), sync_every=2, pseudo_gradient_dtype=torch.bfloat16), _adamw, torch.float32, 20,
        rank, exact=True, momentum=0.9, comm_dtype=torch.bfloat16)
    # int8 pseudo-gradients (gradwise's block codec), all-gathered, decoded and averaged: bit for bit as the
    # reference decodes each worker's and takes the mean; with two fragments and an overlapped sync
    int8 = codec_from("int8-b16")
    for label, kwargs in (("int8 pseudo-gradients", {}), ("int8, two fragments, overlap 1", {"fragments": 2,
                                                                                             "overlap": 1})):
        _against_simulation(label, lambda m: gradwise.DiLoCo(_adamw(m.parameters()), sync_every=2,
                            pseudo_gradient_codec=int8, **kwargs), _adamw, torch.float32, 20, rank, exact=True,
                            momentum=0.9, codec=int8, **kwargs)
    models = [_mlp() for _ in range(WORLD_SIZE)]  # not vacuous: int8 is not the uncompressed average
    uncompressed = simulate(models, [_adamw(m.parameters()) for m in models], _backward, torch.float32, 20, 2, 0.7,
                            momentum=0.9)[rank]
    models = [_mlp() for _ in range(WORLD_SIZE)]
    quantized = simulate(models, [_adamw(m.parameters()) for m in models], _backward, torch.float32, 20, 2, 0.7,
                         momentum=0.9, codec=int8)[rank]
    assert any((a - b).abs().max() > 1e-5 for a, b in zip(uncompressed, quantized)), "int8 changes nothing"


def _case_resume(rank: int) -> None:
    for label, kwargs in (("plain", {}), ("bfloat16, two fragments", {"pseudo_gradient_dtype": torch.bfloat16,
                                                                       "fragments": 2}),
                          ("overlap 2, saved with a sync under way", {"overlap": 2, "merge_alpha": 0.25}),
                          ("eager, saved with a sync under way", {"overlap": 3, "eager": True}),
                          ("CO2, saved with a sync under way", {"overlap": 3, "staleness_penalty": 1.0,
                                                                "outer_clip": 0.1}),
                          ("int8, eager, saved with a sync under way", {"overlap": 3, "eager": True,
                                                                        "pseudo_gradient_codec": "int8"}),
                          ("PowerSGD rank 2", {"pseudo_gradient_codec": "powersgd-r2"})):
        model = _mlp()
        diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=3, **kwargs)
        _train(diloco, model, _backward, range(7), rank)  # one step into the third phase
        assert bool(diloco.pending) == ("overlap" in kwargs), label
        assert all(g.abs().max() > 0 for g in diloco.gaps), label  # CO2's gaps, saved non-zero
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "diloco": diloco.state_dict()}, buffer)
        copied_model, copied = copy.deepcopy((model, diloco))
        saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
        resumed_model = _mlp()
        resumed_model.load_state_dict(saved["model"])
        resumed = gradwise.DiLoCo(_adamw(resumed_model.parameters()), sync_every=3, **kwargs)
        resumed.load_state_dict(saved["diloco"])
        dcp_model, from_dcp = _through_dcp(label, model, diloco, lambda m: gradwise.DiLoCo(
            _adamw(m.parameters()), sync_every=3, **kwargs), rank)
        for m, d in ((model, diloco), (copied_model, copied), (resumed_model, resumed), (dcp_model, from_dcp)):
            _train(d, m, _backward, range(7, 14), rank)
        _assert_equal(f"{label}: resumed from state_dict vs uninterrupted", resumed_model, model)
        _assert_equal(f"{label}: resumed through DCP vs uninterrupted", dcp_model, model)
        _assert_equal(f"{label}: deepcopy vs original", copied_model, model)
        assert resumed.comm_stats == diloco.comm_stats == copied.comm_stats == from_dcp.comm_stats, label
        assert diloco.comm_stats["collectives"] > 0, label


def _through_dcp(label: str, model, diloco, build, rank: int):
    """``model`` and ``diloco`` saved with ``torch.distributed.checkpoint`` (each worker's state under its
    own key: the workers' parameters and inner states differ) and loaded into a fresh model and DiLoCo."""
    directory = os.path.join(tempfile.gettempdir(), f"gradwise-diloco-dcp-{os.getppid()}-{label}")
    fresh_model = _mlp()
    with torch.no_grad():
        for p in fresh_model.parameters():
            p.zero_()  # so that parameters not loaded would show
    fresh = build(fresh_model)
    dcp_round_trip(f"worker{rank}", directory, (model, diloco), (fresh_model, fresh))
    return fresh_model, fresh


def _case_bytes(rank: int) -> None:
    # Linear(6, 8) and Linear(8, 3): 48 + 8 + 24 + 3 = 83 float32 elements, 332 bytes per sync
    model = _mlp()
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=3)
    _train(diloco, model, _backward, range(7), rank)  # syncs after steps 3 and 6
    assert diloco.comm_stats == {"collectives": 2, "bytes_sent": 664, "all_reduce_bytes": 664, "steps": 7,
                                 "bytes_sent_per_step": 664 / 7}, diloco.comm_stats
    # in bfloat16: 166 bytes per sync
    model = _mlp()
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=3, pseudo_gradient_dtype=torch.bfloat16)
    _train(diloco, model, _backward, range(6), rank)
    assert diloco.comm_stats["bytes_sent"] == 332 and diloco.comm_stats["collectives"] == 2, diloco.comm_stats
    # two fragments, H = 4: the first (weight 48 + bias 8 = 56 elements) syncs after steps 4 and 8, the second
    # (24 + 3 = 27) after steps 2 and 6; plus a float64 parameter of 5 elements in the second, its own all-reduce
    model = _mlp()
    extra = torch.nn.Parameter(torch.ones(5, dtype=torch.float64))
    diloco = gradwise.DiLoCo(_adamw([*model.parameters(), extra]), sync_every=4, fragments=2)
    for step in range(8):
        _loss(model, step, rank).backward()
        extra.grad = torch.full_like(extra, float(rank + 1))
        diloco.step()
        diloco.zero_grad()
    first, second = 2 * 56 * 4, 2 * (27 * 4 + 5 * 8)
    assert diloco.comm_stats == {"collectives": 6, "bytes_sent": first + second, "all_reduce_bytes": first + second,
                                 "steps": 8, "bytes_sent_per_step": (first + second) / 8}, diloco.comm_stats
    # int8 in blocks of 2048: 83 codes and one float32 scale, 87 bytes per sync, all-gathered
    model = _mlp()
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=3, pseudo_gradient_codec="int8")
    _train(diloco, model, _backward, range(6), rank)
    assert diloco.comm_stats == {"collectives": 2, "bytes_sent": 174, "all_gather_bytes": 174, "steps": 6,
                                 "bytes_sent_per_step": 29.0}, diloco.comm_stats
    # in blocks of 16: 83 codes and 6 scales, 107 bytes
    model = _mlp()
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=3, pseudo_gradient_codec="int8-b16")
    _train(diloco, model, _backward, range(3), rank)
    assert diloco.comm_stats["all_gather_bytes"] == 107, diloco.comm_stats


def _case_powersgd(rank: int) -> None:
    f64 = torch.float64

    def run(codec):
        model = _mlp(f64)
        _train(gradwise.DiLoCo(_adamw(model.parameters()), sync_every=2, pseudo_gradient_codec=codec), model,
               _backward, range(20), rank)
        return list(model.parameters())

    def reference(compress):
        models = [_mlp(f64) for _ in range(WORLD_SIZE)]
        return simulate(models, [_torch_adamw(m.parameters()) for m in models], _backward, f64, 20, 2, 0.7,
                        momentum=0.9, compress=compress and compress(list(models[0].parameters())))[rank]

    uncompressed = reference(None)
    # rank 2 of the 8 x 6 and 3 x 8 weights: the paper's compression, not the uncompressed mean
    low = run("powersgd-r2")
    expected = reference(lambda params: PowerSGDMeans(2, params, WORLD_SIZE))
    for i, (p, q) in enumerate(zip(low, expected, strict=True)):
        torch.testing.assert_close(p.detach(), q, rtol=1e-10, atol=1e-12, msg=lambda m: f"rank 2, parameter {i}: {m}")
    assert (low[0] - uncompressed[0]).abs().max() > MOVED, "rank 2 changes nothing"
    # at full rank (8 >= 6 and 3) the projection keeps the whole mean
    for i, (p, q) in enumerate(zip(run("powersgd-r8"), uncompressed, strict=True)):
        torch.testing.assert_close(p.detach(), q, rtol=1e-10, atol=1e-12, msg=lambda m: f"full rank, {i}: {m}")
    # float32, rank 2, two syncs: per sync the biases (8 + 3), P (8 x 2 + 3 x 2) and Q (6 x 2 + 8 x 2)
    model = _mlp()
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=3, pseudo_gradient_codec="powersgd-r2")
    _train(diloco, model, _backward, range(6), rank)
    sync = 4 * ((8 + 3) + (16 + 6) + (12 + 16))
    assert diloco.comm_stats == {"collectives": 6, "bytes_sent": 2 * sync, "all_reduce_bytes": 2 * sync, "steps": 6,
                                 "bytes_sent_per_step": 2 * sync / 6}, diloco.comm_stats


CASES = {"data-parallel": _case_data_parallel, "simulation": _case_simulation, "resume": _case_resume,
         "powersgd": _case_powersgd, "bytes": _case_bytes}


def _worker(rank: int, world_size: int, directory: str) -> None:
    """Every case in the same order on every rank; then rank 1 raises mid-step."""
    run_cases(CASES, rank, directory)
    model = _mlp()
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=1)
    _backward(model, 0, rank)
    if rank == 1:
        raise_on_purpose(directory, "worker 1 fails on purpose before its sync")
    diloco.step()  # waits in the all-reduce for worker 1, which never comes
    went_on(directory, "the all-reduce returned without worker 1")


# --------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    """Each rank's outcome of every case, and how the failing worker ended the spawn."""
    return spawn_failing_on_purpose(_worker, WORLD_SIZE, tmp_path_factory.mktemp("diloco"))


@needs_gloo
@pytest.mark.parametrize("case", list(CASES))
def test_on_two_gloo_ranks(outcomes, case):
    failures = case_failures(outcomes, case)
    assert not failures, failures


@needs_gloo
def test_a_worker_that_raises_stops_every_worker_with_its_error(outcomes):
    assert_stopped_with_error(outcomes, "worker 1 fails on purpose", "diloco.py")


# --------------------------------------------------------------------------- one process, no spawn
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"sync_every": 0}, r"sync_every=0: expected an int >= 1"),
    ({"sync_every": 2.0}, r"sync_every=2.0"),
    ({"sync_every": True}, r"sync_every=True"),
    ({"outer_lr": 0.0}, r"outer_lr=0.0: expected a finite number > 0"),
    ({"outer_lr": -0.7}, r"outer_lr=-0.7"),
    ({"outer_lr": math.nan}, r"outer_lr=nan"),
    ({"outer_lr": math.inf}, r"outer_lr=inf"),
    ({"fragments": 0}, r"fragments=0: expected an int from 1 to the number of parameters \(4\)"),
    ({"fragments": 5}, r"fragments=5"),
    ({"pseudo_gradient_dtype": torch.int8}, r"pseudo_gradient_dtype=torch.int8"),
    ({"outer": "sgd"}, r"outer='sgd': expected an optimizer class or a factory"),
    ({"outer": lambda params, lr: params}, r"returned a list, not a torch.optim.Optimizer"),
    ({"overlap": 3, "sync_every": 2}, r"overlap=3: expected an int from 0 to sync_every \(2\)"),
    ({"eager": True, "sync_every": 4}, r"invalid eager=True with overlap=0: .* overlap=sync_every \(4\)"),
    ({"eager": 1, "overlap": 4, "sync_every": 4}, r"invalid eager=1 with overlap=4"),
    ({"overlap": -1}, r"overlap=-1"),
    ({"merge_alpha": 1.5}, r"merge_alpha=1.5: expected a number from 0 to 1"),
    ({"process_group": object()}, r"process_group=.*torch.distributed is not initialized"),
    ({"staleness_penalty": -1.0}, r"staleness_penalty=-1.0: expected a finite number >= 0"),
    ({"staleness_penalty": 1.0, "sync_every": 4},
     r"staleness_penalty=1.0 with overlap=0, eager=False: .* expected overlap=sync_every \(4\) and eager=False"),
    ({"staleness_penalty": 1.0, "sync_every": 4, "overlap": 4, "eager": True}, r"overlap=4, eager=True"),
    ({"outer_clip": 0.0}, r"outer_clip=0.0: expected None or a finite norm > 0"),
    ({"outer_clip": True}, r"outer_clip=True"),
    ({"pseudo_gradient_codec": "int3"}, r"invalid pseudo_gradient_codec='int3': expected one of 'fp32'"),
    ({"pseudo_gradient_codec": "powersgd-r0"}, r"pseudo_gradient_codec='powersgd-r0': PowerSGD is spelled"),
    ({"pseudo_gradient_codec": "powersgd4"}, r"pseudo_gradient_codec='powersgd4'"),
    ({"pseudo_gradient_codec": "powersgd", "overlap": 2, "sync_every": 2},
     r"pseudo_gradient_codec='powersgd' with overlap=2, eager=False.*expected overlap=0"),
    ({"pseudo_gradient_codec": "int8", "pseudo_gradient_dtype": torch.bfloat16},
     r"pseudo_gradient_codec='int8' with pseudo_gradient_dtype=torch.bfloat16: expected one of them, not both"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    model = _mlp()
    with pytest.raises((TypeError, ValueError), match=match):
        gradwise.DiLoCo(_adamw(model.parameters()), **kwargs)


def test_an_inner_optimizer_that_is_not_an_optimizer_is_refused():
    with pytest.raises(TypeError, match=r"invalid inner, a Sequential: expected a torch.optim.Optimizer"):
        gradwise.DiLoCo(_mlp())


def test_a_state_of_another_configuration_is_refused_before_anything_changes():
    model = _mlp()
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=2)
    _train(diloco, model, _backward, range(3), 0)
    other = _mlp()
    saved = gradwise.DiLoCo(_adamw(other.parameters()), sync_every=3).state_dict()
    before = copy.deepcopy(diloco.state_dict())
    with pytest.raises(ValueError, match=r"sync_every=3, this DiLoCo sync_every=2"):
        diloco.load_state_dict(saved)
    after = diloco.state_dict()
    assert after["local_step"] == before["local_step"] == 3
    assert all(torch.equal(a, b) for a, b in zip(after["synced"], before["synced"]))
    assert _same(after["inner"], before["inner"]) and _same(after["outer"], before["outer"])


def test_a_state_without_co2_gaps_is_refused_by_a_diloco_with_a_staleness_penalty():
    model = _mlp()
    co2 = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=2, overlap=2, staleness_penalty=1.0)
    plain = gradwise.DiLoCo(_adamw(_mlp().parameters()), sync_every=2, overlap=2)
    with pytest.raises(ValueError, match=r"holds 0 staleness gaps, this DiLoCo 4 \(staleness_penalty=1.0\)"):
        co2.load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match=r"holds 4 staleness gaps, this DiLoCo 0"):
        plain.load_state_dict(co2.state_dict())


@pytest.mark.parametrize("clip", [None, 0.05])
def test_co2_outer_momentum_matches_the_authors_released_step(clip):
    """``CO2OuterMomentum`` against the float64 rule of the authors' code, 20 steps, within 1e-12; the
    clamp bites at 0.05 (it is what differs from the code, whose clamp is a no-op)."""
    from gradwise.distributed import CO2OuterMomentum

    g = torch.Generator().manual_seed(0)
    theta = [torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)]
    grads = [[torch.randn(t.shape, generator=g, dtype=torch.float64) * 0.1 for t in theta] for _ in range(20)]
    params = [torch.nn.Parameter(t.clone()) for t in theta]
    outer = CO2OuterMomentum(params, lr=0.7, momentum=0.5, gap_penalty=2.0, clip=clip)
    for step in grads:
        for p, d in zip(params, step):
            p.grad = d.clone()
        outer.step()
    expected = co2_outer(theta, grads, 0.7, 0.5, 2.0, clip)
    for p, q, t in zip(params, expected, theta):
        torch.testing.assert_close(p.detach(), q, rtol=1e-12, atol=1e-14)
        assert (p - t).abs().max() > MOVED
    buffers = [outer.state[p]["momentum_buffer"] for p in params]
    assert (max(b.abs().max() for b in buffers) == 0.05) == (clip is not None)
    unclipped = co2_outer(theta, grads, 0.7, 0.5, 2.0, None)
    assert (clip is None) == all(torch.equal(a, b) for a, b in zip(expected, unclipped))


@pytest.mark.parametrize(("kwargs", "match"), [({"lr": 0.0}, r"invalid lr=0.0"), ({"momentum": 1.0}, r"momentum=1.0"),
                                               ({"gap_penalty": -1.0}, r"gap_penalty=-1.0"), ({"clip": 0}, r"clip=0")])
def test_co2_outer_momentum_refuses_bad_arguments_by_name(kwargs, match):
    from gradwise.distributed import CO2OuterMomentum

    with pytest.raises(ValueError, match=match):
        CO2OuterMomentum([torch.nn.Parameter(torch.zeros(2))], **kwargs)


def test_a_state_with_another_powersgd_rank_or_none_is_refused():
    low, other, plain = (gradwise.DiLoCo(_adamw(_mlp().parameters()), sync_every=2, pseudo_gradient_codec=codec)
                         for codec in ("powersgd-r2", "powersgd-r3", None))
    with pytest.raises(ValueError, match=r"PowerSGD state \(rank 3\) is not one of this model's at rank 2"):
        low.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match=r"saved with no PowerSGD state"):
        low.load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match=r"saved with PowerSGD state"):
        plain.load_state_dict(low.state_dict())


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_one_worker_without_torch_distributed_sends_nothing_and_syncs():
    """Without a process group, one worker: each sync is the outer step on its own pseudo-gradient."""
    model, alone = _mlp(torch.float64), _mlp(torch.float64)
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=2)
    before = [p.detach().clone() for p in model.parameters()]
    _train(diloco, model, _backward, range(2), 0)
    inner = _adamw(alone.parameters())
    for step in range(2):
        _backward(alone, step, 0)
        inner.step()
        inner.zero_grad()
    assert diloco.comm_stats["bytes_sent"] == 0 and diloco.comm_stats["steps"] == 2
    for p, s, x0, x in zip(model.parameters(), diloco.synced, before, alone.parameters()):
        assert torch.equal(p, s)  # the worker restarts from the synced copy
        # Nesterov's first step: b = d, theta <- theta - lr (d + 0.9 d), d = theta at the sync - theta now
        torch.testing.assert_close(p, x0 - 0.7 * 1.9 * (x0 - x), rtol=1e-12, atol=1e-14)
        assert (p - x0).abs().max() > MOVED


def test_one_worker_eager_is_plain_diloco_and_delayed_restarts_a_phase_late():
    """With one worker the eager estimate is the worker's own fresh pseudo-gradient: plain DiLoCo (to
    rounding); delayed, the first phase's progress is dropped at its sync and applied at the next one."""
    models = [_mlp(torch.float64) for _ in range(3)]
    start = [p.detach().clone() for p in models[0].parameters()]
    plain, eager, delayed = (gradwise.DiLoCo(_adamw(m.parameters()), sync_every=2, **kwargs) for m, kwargs in zip(
        models, ({}, {"overlap": 2, "eager": True}, {"overlap": 2})))
    for diloco, model in zip((plain, eager, delayed), models):
        _train(diloco, model, _backward, range(2), 0)
    assert all(torch.equal(p, x0) for p, x0 in zip(models[2].parameters(), start))  # restarted, not stepped
    for diloco, model in zip((plain, eager, delayed), models):
        _train(diloco, model, _backward, range(2, 8), 0)
    for p, q, x0 in zip(models[0].parameters(), models[1].parameters(), start):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)
        assert (p - x0).abs().max() > MOVED
    assert delayed.outer[0].state and delayed.pending[0].own is None and eager.pending[0].own


def test_a_refused_inner_step_changes_nothing():
    """The inner step raises (here its closure): no step is counted, nothing syncs, nothing moves."""
    model = _mlp()
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=1)
    before = [p.detach().clone() for p in model.parameters()]

    def closure():
        raise RuntimeError("the loss could not be computed")

    with pytest.raises(RuntimeError, match="could not be computed"):
        diloco.step(closure)
    assert diloco.local_step == 0 and diloco.comm_stats["steps"] == 0
    assert all(torch.equal(p, b) and torch.equal(s, b) for p, s, b in zip(model.parameters(), diloco.synced, before))
    assert not diloco.inner.state and all(not o.state for o in diloco.outer)


def _flat(state, prefix=""):
    """(path, shape or value) of every leaf of a nested state dict."""
    if isinstance(state, dict):
        return [leaf for k, v in state.items() for leaf in _flat(v, f"{prefix}.{k}")]
    if isinstance(state, list):
        return [leaf for k, v in enumerate(state) for leaf in _flat(v, f"{prefix}.{k}")]
    return [(prefix, tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__)]


@pytest.mark.parametrize("kwargs", [{}, {"overlap": 2, "fragments": 2}, {"overlap": 3, "eager": True}])
def test_a_fresh_state_dict_has_the_layout_of_a_trained_one_and_loads_as_fresh(kwargs):
    """What torch.distributed.checkpoint needs: it loads into a fresh DiLoCo's state_dict, and skips what
    that lacks. A fresh one's, loaded, leaves a fresh DiLoCo fresh (its optimizers not stepped)."""
    models = [_mlp() for _ in range(3)]
    trained, fresh, reloaded = (gradwise.DiLoCo(_adamw(m.parameters()), sync_every=3, **kwargs) for m in models)
    _train(trained, models[0], _backward, range(4), 0)
    assert _flat(trained.state_dict()) == _flat(fresh.state_dict())
    assert not fresh.inner.state and not any(o.state for o in fresh.outer)  # its state was taken on a copy
    reloaded.load_state_dict(fresh.state_dict())
    assert not reloaded.inner.state
    for diloco, model in ((fresh, models[1]), (reloaded, models[2])):
        _train(diloco, model, _backward, range(4), 0)
    _assert_equal("fresh vs loaded from a fresh state", models[1], models[2])
    _assert_equal("fresh vs trained", models[1], models[0])


def test_a_state_saved_in_the_layout_before_dcp_still_resumes_bit_identically():
    """The layout ``state_dict`` had before it was made DCP-friendly: the optimizers' own state dicts, a list
    of the syncs under way each naming its fragment, no staleness gaps."""
    model, resumed_model = _mlp(), _mlp()
    diloco = gradwise.DiLoCo(_adamw(model.parameters()), sync_every=3, overlap=2, fragments=2)
    _train(diloco, model, _backward, range(5), 0)
    state = copy.deepcopy(diloco.state_dict())
    assert any(slot["apply_at"] >= 0 for slot in state["pending"])
    old = {**{k: v for k, v in state.items() if k != "gaps"}, "inner": state["inner"]["state_dict"],
           "outer": [o["state_dict"] for o in state["outer"]],
           "pending": [{"fragment": f, "apply_at": slot["apply_at"], "summed": slot["summed"], "own": None}
                       for f, slot in enumerate(state["pending"]) if slot["apply_at"] >= 0]}
    resumed_model.load_state_dict(model.state_dict())
    resumed = gradwise.DiLoCo(_adamw(resumed_model.parameters()), sync_every=3, overlap=2, fragments=2)
    resumed.load_state_dict(old)
    for d, m in ((diloco, model), (resumed, resumed_model)):
        _train(d, m, _backward, range(5, 12), 0)
    _assert_equal("resumed from the old layout vs uninterrupted", resumed_model, model)
