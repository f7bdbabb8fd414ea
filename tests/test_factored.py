"""Adafactor and CAME beyond step-by-step parity (tests/registry.py): their factored state is the
size the papers say and ``gradwise.estimate`` predicts it, bad arguments are named, and they stay off
sharded (FSDP2) parameters, whose rows and columns they would need whole."""
from __future__ import annotations

import pytest
import torch

import gradwise
from bench.step import state_bytes


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(300, 32), torch.nn.Linear(32, 200), torch.nn.LayerNorm(200))


def _params():
    return [torch.randn(3, 2).requires_grad_(), torch.randn(4).requires_grad_()]


@pytest.mark.parametrize("recipe,kwargs", [(gradwise.Adafactor, {}), (gradwise.CAME, {"lr": 1e-3}),
                                           (gradwise.AdamMini, {})], ids=lambda x: getattr(x, "__name__", ""))
def test_estimate_equals_the_bytes_a_step_allocates(recipe, kwargs):
    net = _model()
    predicted = gradwise.estimate(net, recipe, **kwargs)
    opt = recipe(net.named_parameters(), compile=False, **kwargs)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    assert predicted.total == state_bytes(opt)


def test_factored_state_is_rows_plus_columns():
    net = _model()
    opt = gradwise.Adafactor(net.parameters(), compile=False)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    embedding, weight, bias = net[0].weight, net[1].weight, net[1].bias
    assert opt.state[embedding]["factored.row_var"].shape == (300, 1)
    assert opt.state[embedding]["factored.col_var"].shape == (1, 32)
    assert opt.state[weight]["factored.variance"].numel() == 0
    assert opt.state[bias]["factored.variance"].shape == bias.shape  # vectors keep the full second moment
    matrices = (300 + 32) + (200 + 32)
    vectors = 200 * 3
    assert gradwise.estimate(net, gradwise.Adafactor).total == 4 * (matrices + vectors) + 4 * 5
    came = gradwise.estimate(net, gradwise.CAME, lr=1e-3).total
    first_moment = sum(p.numel() for p in net.parameters())
    assert came == 4 * (first_moment + 2 * matrices + vectors) + 4 * 5


def test_adafactor_leaves_an_empty_tensor_alone():
    empty, w = torch.zeros(0, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    opt = gradwise.Adafactor([empty, w], compile=False)
    for p in (empty, w):
        p.grad = torch.ones_like(p)
    opt.step()
    assert not opt.state[empty]["factored.col_var"].isnan().any()


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(lr=-0.1), ValueError, r"lr=-0\.1: expected a finite number >= 0"),
    (dict(beta2_decay=0.5), ValueError, r"beta2_decay=0\.5: expected a finite number <= 0"),
    (dict(eps=(-1.0, 1e-3)), ValueError, r"eps\[0\]=-1\.0 in eps=\(-1\.0, 0\.001\): expected None or a finite"),
    (dict(eps=(None, None)), ValueError, r"eps\[1\]=None .*expected a finite number >= 0"),
    (dict(eps=1e-3), ValueError, r"eps=0\.001: expected a pair \(eps1, eps2\)"),
    (dict(d=0.5), ValueError, r"d=0\.5: expected a finite number >= 1"),
    (dict(weight_decay=-1.0), ValueError, r"weight_decay=-1\.0: expected a finite number >= 0"),
    (dict(foreach="yes"), TypeError, r"foreach='yes': expected None, True or False"),
])
def test_adafactor_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        gradwise.Adafactor(_params(), **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(lr=None), r"lr=None: expected a finite number >= 0"),
    (dict(betas=(0.9, 0.999)), r"betas=\(0\.9, 0\.999\): expected a triple"),
    (dict(betas=(0.9, 0.999, 1.0)), r"betas\[2\]=1\.0 in betas=\(0\.9, 0\.999, 1\.0\): expected a number in \[0, 1\)"),
    (dict(eps=(1e-30, -1.0)), r"eps\[1\]=-1\.0 .*expected a finite number >= 0"),
    (dict(clip_threshold=0.0), r"clip_threshold=0\.0: expected a finite number >= 1"),
])
def test_came_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gradwise.CAME(_params(), **{"lr": 1e-3, **kwargs})


def test_bad_value_between_steps_fails_the_step_and_changes_nothing():
    params = _params()
    opt = gradwise.Adafactor(params, compile=False)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    before = [p.detach().clone() for p in params], [{k: v.clone() for k, v in opt.state[p].items()} for p in params]
    opt.param_groups[0]["d"] = 0.0
    with pytest.raises(ValueError, match=r"d=0\.0"):
        opt.step()
    for p, b, st in zip(params, *before):
        assert torch.equal(p, b) and all(torch.equal(opt.state[p][k], v) for k, v in st.items())


@pytest.fixture(scope="module")
def one_rank_mesh():
    dist = pytest.importorskip("torch.distributed")
    if not (dist.is_available() and dist.is_gloo_available()) or dist.is_initialized():
        pytest.skip("needs torch.distributed with gloo and no process group yet")
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("recipe", [gradwise.Adafactor, gradwise.CAME, gradwise.AdamMini])
def test_a_one_rank_dtensor_steps_as_a_plain_tensor(recipe, one_rank_mesh):
    """A DTensor on a one-rank mesh holds its whole tensor, so it steps exactly as the plain tensor
    (sharded meshes: tests/test_fsdp2.py, where each parameter is factored whole on its owner)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.manual_seed(0)
    plain = torch.nn.Parameter(torch.randn(4, 3))
    p = torch.nn.Parameter(distribute_tensor(plain.detach().clone(), one_rank_mesh, [Shard(0)]))
    optimizers = [recipe([q], lr=1e-3, compile=False) for q in (p, plain)]
    for _ in range(3):
        grad = torch.randn(4, 3)
        p.grad, plain.grad = distribute_tensor(grad, one_rank_mesh, [Shard(0)]), grad.clone()
        for opt in optimizers:
            opt.step()
    assert torch.equal(p.detach().full_tensor(), plain.detach())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("kwargs", [dict(lr=0.01, maximize=True, weight_decay=0.05),
                                    dict(lr=0.05, beta2_decay=-0.5, eps=(1e-3, 1e-2), foreach=True)],
                         ids=["maximize", "eps-decay-foreach"])
def test_adafactor_options_match_torch(kwargs, dtype):
    """More of torch.optim.Adafactor's options than the registry's case (tests/registry.py) covers."""
    from tests.models import bag_of_tensors
    from tests.registry import _adafactor
    from tests.test_parity import _clone, assert_trajectories_close, run_bag

    params = bag_of_tensors(dtype)
    ours = run_bag(lambda p: gradwise.Adafactor(p, compile=False, **kwargs), _clone(params), dtype)
    theirs = run_bag(lambda p: _adafactor(p, **kwargs), _clone(params), dtype, reference=True)
    assert_trajectories_close(ours, theirs, dtype)


def test_cli_estimates_the_recipes(capsys):
    from gradwise.cli import main

    assert main(["estimate", "--size", "tiny", "--recipe", "Adafactor"]) == 0
    out = capsys.readouterr().out
    assert "Adafactor" in out and "fp32" in out and "total" in out


def test_memory_bench_rows(capsys):
    from bench.memory import main

    assert main(["--bytes", "--size", "tiny", "--measure", "--formats", ""]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert float(rows["Adafactor"][0]) == float(rows["Adafactor"][1]) < 0.2  # predicted == measured
    assert float(rows["Adafactor"][1]) == float(rows["torch.optim.Adafactor"][1])
    assert rows["torch.optim.Adafactor"][0] == "-"  # no prediction for torch's optimizer, and no nan
    assert 4 < float(rows["CAME"][1]) < 4.3 and 4 < float(rows["AdamMini"][1]) < 4.2
