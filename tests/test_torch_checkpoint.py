"""Checkpoints that cross between torch.optim and gradwise: a switch mid-run continues exactly as
the optimizer it left would have, both ways, and what does not map is refused by name."""
from __future__ import annotations

import io
import re

import pytest
import torch

import gradwise

#: (torch.optim class, its kwargs, the gradwise recipe, its kwargs, parameter shapes, dtype, tolerance)
PAIRS = {
    "sgd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
            gradwise.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01), [(4, 3), (3,)]),
    "sgd-nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True),
                     gradwise.SGD, dict(lr=0.05, momentum=0.9, nesterov=True), [(4, 3), (3,)]),
    "adam": (torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
             gradwise.Adam, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05), [(4, 3), (3,)]),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1),
              gradwise.AdamW, dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1), [(4, 3), (3,)]),
    "adamw-amsgrad": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1, amsgrad=True),
                      gradwise.AdamW, dict(lr=0.01, weight_decay=0.1, amsgrad=True), [(4, 3), (3,)]),
    "adam-decoupled": (torch.optim.Adam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
                       gradwise.Adam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True), [(4, 3), (3,)]),
    "nadam-l2": (torch.optim.NAdam, dict(lr=0.01, weight_decay=0.1),
                 gradwise.NAdamW, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=False), [(4, 3), (3,)]),
    "nadamw": (torch.optim.NAdam, dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
               gradwise.NAdamW, dict(lr=0.01, weight_decay=0.1), [(4, 3), (3,)]),
    "adafactor": (torch.optim.Adafactor, dict(lr=0.01, weight_decay=0.1, d=1.5),
                  gradwise.Adafactor, dict(lr=0.01, weight_decay=0.1, d=1.5), [(4, 3), (3,), (2, 3, 4)]),
    "muon-matrices": (torch.optim.Muon, dict(lr=0.02), gradwise.Muon, dict(lr=0.02), [(4, 3), (5, 6)]),
    "muon-others": (torch.optim.AdamW, dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0),
                    gradwise.Muon, dict(adamw_lr=1e-3), [(3,), (2, 2, 2)]),
}


def _params(shapes, dtype):
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=generator, dtype=dtype)) for s in shapes]


def _run(optimizer, params, steps, start):
    for t in range(start, start + steps):
        generator = torch.Generator().manual_seed(1000 + t)
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator, dtype=p.dtype)
        optimizer.step()


def _through_a_file(state_dict):
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _dtype(name):
    return torch.float32 if name.startswith("muon-matrices") else torch.float64  # torch's Muon: bfloat16 NS


@pytest.mark.parametrize("name", PAIRS)
@pytest.mark.parametrize("direction", ["torch-to-gradwise", "gradwise-to-torch"])
def test_switching_mid_run_continues_as_the_optimizer_left(name, direction):
    torch_cls, torch_kwargs, recipe, kwargs, shapes = PAIRS[name]
    dtype = _dtype(name)
    make_torch = lambda ps: torch_cls(ps, **torch_kwargs)  # noqa: E731
    make_ours = lambda ps: recipe(ps, compile=False, **kwargs)  # noqa: E731
    first, second = (make_torch, make_ours) if direction == "torch-to-gradwise" else (make_ours, make_torch)
    params = _params(shapes, dtype)
    before = first(params)
    _run(before, params, 10, 0)
    saved = _through_a_file(before.state_dict(format="torch") if direction == "gradwise-to-torch"
                            else before.state_dict())
    switched = [torch.nn.Parameter(p.detach().clone()) for p in params]
    after = second(switched)
    after.load_state_dict(saved)
    _run(before, params, 20, 10)
    _run(after, switched, 20, 10)
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    for p, q in zip(params, switched):
        torch.testing.assert_close(q, p, **tolerance)


def test_a_torch_checkpoint_reloads_into_torch_after_a_gradwise_round_trip():
    params = _params([(4, 3), (3,)], torch.float64)
    reference = torch.optim.AdamW(params, lr=0.01)
    _run(reference, params, 3, 0)
    saved = reference.state_dict()
    ours = gradwise.AdamW(params, lr=0.01, compile=False)
    ours.load_state_dict(saved)
    exported = ours.state_dict(format="torch")
    assert {k: v for k, v in exported["param_groups"][0].items() if k in saved["param_groups"][0]} \
        == {k: v for k, v in saved["param_groups"][0].items() if k not in ("foreach", "fused", "capturable",
                                                                           "differentiable")}
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(exported["state"][1][key], saved["state"][1][key])


@pytest.mark.parametrize("source, target, found", [
    (lambda ps: torch.optim.Adam(ps, lr=0.01), gradwise.AdamW, "decoupled_weight_decay=False"),
    (lambda ps: torch.optim.AdamW(ps, lr=0.01), gradwise.Adam, "decoupled_weight_decay=True"),
    (lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), gradwise.AdamW, "momentum=0.9"),
    (lambda ps: torch.optim.Adam(ps, lr=0.01), gradwise.SGD, "betas=(0.9, 0.999)"),
    (lambda ps: torch.optim.NAdam(ps, lr=0.01), gradwise.NAdamW, "decoupled_weight_decay=False"),
    (lambda ps: torch.optim.Adam(ps, lr=0.01), gradwise.Lion, "no torch.optim counterpart"),
    (lambda ps: torch.optim.RMSprop(ps, lr=0.01), gradwise.Adam, "alpha=0.99"),
])
def test_a_torch_checkpoint_of_another_algorithm_is_refused_and_changes_nothing(source, target, found):
    params = _params([(4, 3), (3,)], torch.float64)
    theirs = source(params)
    _run(theirs, params, 2, 0)
    ours = target(params, lr=0.01, compile=False)
    _run(ours, params, 2, 0)
    before = ours.state_dict()
    with pytest.raises(ValueError) as error:
        ours.load_state_dict(theirs.state_dict())
    assert found in str(error.value)
    after = ours.state_dict()
    assert after["param_groups"] == before["param_groups"]
    assert all(torch.equal(after["state"][i][k], v) for i, s in before["state"].items() for k, v in s.items())


def test_a_torch_checkpoint_missing_a_moment_is_refused_by_name():
    params = _params([(4, 3), (3,)], torch.float64)
    theirs = torch.optim.AdamW(params, lr=0.01)
    _run(theirs, params, 2, 0)
    saved = theirs.state_dict()
    del saved["state"][1]["exp_avg"]
    ours = gradwise.AdamW(params, lr=0.01, compile=False)
    message = "torch.optim state of param_groups[0]['params'][1] has keys ['exp_avg_sq', 'step']; torch.optim.AdamW"
    with pytest.raises(ValueError, match=re.escape(message) + ".* keeps \\['exp_avg', 'exp_avg_sq', 'step'\\]"):
        ours.load_state_dict(saved)
    assert not ours.state


def test_exporting_a_recipe_without_a_torch_counterpart_is_refused():
    ours = gradwise.Lion(_params([(3,)], torch.float32), lr=0.01, compile=False)
    with pytest.raises(ValueError, match="Lion has no torch.optim counterpart"):
        ours.state_dict(format="torch")
    with pytest.raises(ValueError, match="invalid format='optax'"):
        ours.state_dict(format="optax")
