"""Encoded state inside the optimizer: every recipe, the policy, checkpoints, non-finite values."""
from __future__ import annotations

import inspect

import io
import warnings

import pytest
import torch

import gradwise
from gradwise.state import StatePolicy
from tests.registry import CASES

CODECS = ["bf16", "int8", "int4"]
#: how far from the float32 trajectory a codec may drift in 15 steps, relative to how far it moved.
DRIFT = {"bf16": 0.03, "int8": 0.1, "int4": 0.6}


def takes_state(recipe) -> bool:
    """Recipes that offer ``state=`` (SGD, Adam, AdamW, NAdamW, Lion so far)."""
    return "state" in inspect.signature(recipe.__init__).parameters


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 8))


def train(opt, net, steps, start=0):
    for step in range(start, start + steps):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(32, 64, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), torch.sin(x[:, :8])).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize("state", CODECS)
@pytest.mark.parametrize("case", [c for c in CASES if c.trains and takes_state(c.recipe)], ids=lambda c: c.name)
def test_every_recipe_keeps_large_state_encoded_and_follows_fp32(case, state):
    start = [p.detach().clone() for p in model().parameters()]
    net = model()
    net_fp32 = model()
    fp32 = train(case.ours(list(net_fp32.parameters()), compile=False), net_fp32, 15)
    opt = case.recipe(list(net.parameters()), compile=False, state=state, **case.kwargs)
    ours = train(opt, net, 15)
    weight, bias = net[0].weight, net[0].bias
    weight_keys = [k for k in opt.state[weight] if k != "step"]
    assert weight_keys or case.kwargs.get("momentum", 0) == 0 and case.recipe is gradwise.SGD
    tag = gradwise.state.codec_from(state).tag
    assert all(f"@{tag}." in k or opt.state[weight][k].dim() == 0 for k in weight_keys)
    assert all("@" not in k for k in opt.state[bias]), "tensors under 4096 elements stay float32"
    for a, b, s in zip(ours, fp32, start):
        moved = (b - s).norm()
        assert (a - b).norm() <= DRIFT[state] * moved + 1e-6, f"{state} drifted from the float32 trajectory"


@pytest.mark.parametrize("state", CODECS)
def test_resume_is_bit_identical(state):
    net = model()
    opt = gradwise.AdamW(net.named_parameters(), lr=1e-2, state=StatePolicy(state, min_numel=0), compile=False)
    train(opt, net, 5)
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buffer)
    straight = train(opt, net, 5, start=5)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    net2 = model(seed=1)
    net2.load_state_dict(saved["model"])
    opt2 = gradwise.AdamW(net2.named_parameters(), lr=1e-2, state=StatePolicy(state, min_numel=0), compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same format: no conversion, no message
        opt2.load_state_dict(saved["opt"])
    resumed = train(opt2, net2, 5, start=5)
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)
    for key, value in opt.state[net[0].weight].items():
        assert torch.equal(value, opt2.state[net2[0].weight][key]) and value.dtype == opt2.state[net2[0].weight][key].dtype


@pytest.mark.parametrize(("source", "target"), [("fp32", "int8"), ("int8", "fp32"), ("int8", "int4"), ("bf16", "int8")])
def test_loading_another_format_converts_with_a_message(source, target):
    net = model()
    opt = gradwise.AdamW(net.parameters(), lr=1e-2, state=source, compile=False)
    train(opt, net, 3)
    reference = {k: v.clone() for k, v in opt.state[net[0].weight].items()}
    opt2 = gradwise.AdamW(net.parameters(), lr=1e-2, state=target, compile=False)
    with pytest.warns(UserWarning, match=rf"converted 2 state buffer\(s\).*{source}.* -> {target}"):
        opt2.load_state_dict(opt.state_dict())
    state = opt2.state[net[0].weight]
    tag = "" if target == "fp32" else gradwise.state.codec_from(target).tag
    assert all((tag in k) if tag else ("@" not in k) for k in state if k != "step")
    from gradwise.state.store import take

    for key in ("adam.exp_avg", "adam.exp_avg_sq"):
        before = take(dict(reference), key, net[0].weight.shape, key == "adam.exp_avg", torch.float32)
        after = take(dict(state), key, net[0].weight.shape, key == "adam.exp_avg", torch.float32)
        gap = 0.25 if target == "int4" else 0.05  # the largest gap of the 4-bit map is 0.225 of a block's scale
        torch.testing.assert_close(after, before, rtol=0.3, atol=before.abs().max().item() * gap)
    train(opt2, net, 2)  # and it trains on


def test_policy_picks_per_parameter_from_name_and_size():
    emb = torch.nn.Embedding(100, 64)
    head = torch.nn.Linear(64, 100)
    named = [("embed.weight", emb.weight), ("head.weight", head.weight), ("head.bias", head.bias)]
    policy = StatePolicy("int4", rules={r"^embed": "fp32", r"bias$": "bf16"})
    opt = gradwise.AdamW(named, lr=1e-3, state=policy, compile=False)
    for p in (emb.weight, head.weight, head.bias):
        p.grad = torch.randn_like(p)
    opt.step()
    assert all("@" not in k for k in opt.state[emb.weight])
    assert any("@int4-b128." in k for k in opt.state[head.weight])
    assert any("@bf16." in k for k in opt.state[head.bias]), "a rule wins over the size threshold"


def test_a_rule_that_matches_nothing_is_an_error():
    net = model()
    with pytest.raises(ValueError, match=r"rule 'wte' matches no parameter; parameter names: \['0.weight'"):
        gradwise.AdamW(net.named_parameters(), state=StatePolicy("int8", rules={"wte": "fp32"}))
    with pytest.raises(ValueError, match="no parameter has a name: pass model.named_parameters()"):
        gradwise.AdamW(net.parameters(), state=StatePolicy("int8", rules={"wte": "fp32"}))


@pytest.mark.parametrize(("state", "error", "match"), [
    ("int9", ValueError, r"invalid state='int9'"), ("int8-b1000", ValueError, r"block_size=1000"),
    (8, TypeError, r"invalid state=8"),
])
def test_bad_state_arguments_name_themselves(state, error, match):
    with pytest.raises(error, match=match):
        gradwise.AdamW(model().parameters(), state=state)
    with pytest.raises(error, match=match):
        gradwise.Lion(model().parameters(), state=state)


@pytest.mark.parametrize("state", ["int8", "int4"])
def test_a_nan_gradient_poisons_only_its_own_element(state):
    w = torch.nn.Parameter(torch.randn(128, 64))
    opt = gradwise.AdamW([w], lr=1e-2, state=state, compile=False)
    w.grad = torch.randn(128, 64)
    opt.step()
    before = w.detach().clone()
    w.grad = torch.randn(128, 64)
    w.grad[5, 7] = float("nan")
    opt.step()
    assert torch.isnan(w[5, 7]) and torch.isfinite(w).sum() == w.numel() - 1
    w.grad = torch.randn(128, 64)
    opt.step()  # the NaN stays in its element: every other parameter keeps moving by finite steps
    moved = (w - before).abs()
    assert torch.isfinite(w).sum() == w.numel() - 1 and (moved[torch.isfinite(moved)] > 0).float().mean() > 0.99


def test_a_skipped_step_leaves_encoded_state_untouched():
    w = torch.nn.Parameter(torch.randn(128, 64))
    opt = gradwise.AdamW([w], lr=1e-2, state="int8", skip_nonfinite=True, compile=False)
    w.grad = torch.randn(128, 64)
    opt.step()
    saved = {k: v.clone() for k, v in opt.state[w].items()}
    w.grad[0, 0] = float("inf")
    opt.step()
    assert opt.skipped_steps == 1
    assert all(torch.equal(v, opt.state[w][k]) for k, v in saved.items())


@pytest.mark.slow
@pytest.mark.parametrize("state", CODECS)
def test_compiled_equals_eager_with_encoded_state(state):
    results = []
    for compile in (False, True):
        net = model()
        opt = gradwise.AdamW(net.parameters(), lr=1e-2, state=state, compile=compile)
        params = train(opt, net, 1)
        results.append((params, {k: v.clone() for k, v in opt.state[net[0].weight].items()}))
        if compile:
            assert opt.compile_stats["compiles"] >= 1
    (eager, eager_state), (compiled, compiled_state) = results
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    for key, value in eager_state.items():
        if value.dtype == torch.uint8 or value.dtype == torch.bfloat16:  # codes: equal but at rounding ties
            assert (value != compiled_state[key]).float().mean() < 1e-3, key
        else:
            torch.testing.assert_close(value, compiled_state[key], rtol=1e-6, atol=0)
