"""A parameter's two bf16 buffers in shared 32-bit words (gradwise.state.bf16_pairs): the same values
and bits as two separate buffers, eager and compiled, through checkpoints and copies."""
from __future__ import annotations

import copy
import io

import pytest
import torch

import gradwise
from gradwise.core.state_keys import MARK
from gradwise.state.bf16 import BF16, element_index, round_to_bf16_stochastically, run_index
from gradwise.state.bf16_pairs import decode_words, encode_words, pair_buffers, partner_of, words_run

KEYS = ("adam.exp_avg@bf16.value", "adam.exp_avg_sq@bf16.value")


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(48, 40), (70, 33), (1000,)]  # a short last group of 8 (70 x 33), and a vector
    return [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in shapes]


def _train(opt, params, steps: int, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator) * 1e-2
        opt.step()


def _unpair(opt) -> None:
    """Give every buffer memory of its own (contiguous copies): the per-buffer path."""
    for state in opt.state.values():
        for key in KEYS:
            state[key] = state[key].clone()


def _twins(first: dict, second: dict, **hyper):
    """Two AdamW optimizers with bf16 state (every parameter) over equal parameters, each with its own
    keywords: ``(optimizer, parameters)`` for each."""
    policy = gradwise.state.StatePolicy("bf16", min_numel=1)
    out = []
    for own in (first, second):
        params = _params()
        out.append((gradwise.AdamW(params, lr=1e-2, state=policy, **hyper, **own), params))
    return out


def _values(opt, params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params] + [opt.state[p][k].float() for p in params for k in KEYS]


def test_fresh_state_pairs_both_moments_in_one_words_array():
    params = _params()
    opt = gradwise.AdamW(params, lr=1e-2, state=gradwise.state.StatePolicy("bf16", min_numel=1))
    _train(opt, params, 1)
    for p in params:
        first, second = (opt.state[p][k] for k in KEYS)
        assert (partner_of(first), partner_of(second)) == (True, False)
        assert first.shape == second.shape == p.shape
        assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
        assert first.untyped_storage().nbytes() == 4 * p.numel()  # 2 bytes an element each, nothing more


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_paired_steps_equal_separate_buffers_bit_for_bit(compile):
    """The words path (one load and one store of both moments) writes the very bits that two separate
    buffers get, stochastic rounding included, over 20 steps and on a run's short last group."""
    (paired, paired_params), (separate, separate_params) = _twins({}, {}, weight_decay=0.1, compile=compile)
    _train(paired, paired_params, 1)
    _train(separate, separate_params, 1)
    _unpair(separate)
    _train(paired, paired_params, 20, seed=2)
    _train(separate, separate_params, 20, seed=2)
    assert all(partner_of(separate.state[p][k]) is None for p in separate_params for k in KEYS)
    for a, b in zip(_values(paired, paired_params), _values(separate, separate_params)):
        assert torch.equal(a, b)


def test_compiled_paired_equals_eager():
    (eager, eager_params), (compiled, compiled_params) = _twins({"compile": False}, {"compile": True})
    _train(eager, eager_params, 12)
    _train(compiled, compiled_params, 12)
    for a, b in zip(_values(eager, eager_params), _values(compiled, compiled_params)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_checkpoints_and_copies_keep_the_values_and_pair_again():
    policy = gradwise.state.StatePolicy("bf16", min_numel=1)
    params = _params()
    opt = gradwise.AdamW(params, lr=1e-2, state=policy)
    _train(opt, params, 3)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    restored_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    restored = gradwise.AdamW(restored_params, lr=1e-2, state=policy)
    restored.load_state_dict(saved)
    duplicate = copy.deepcopy(opt)
    for i, (p, q) in enumerate(zip(params, restored_params)):
        copied = duplicate.state[duplicate.param_groups[0]["params"][i]]
        for key in KEYS:
            assert torch.equal(restored.state[q][key], opt.state[p][key])
            assert torch.equal(copied[key], opt.state[p][key])
        for state in (restored.state[q], copied):
            first, second = (state[k] for k in KEYS)
            assert (partner_of(first), partner_of(second)) == (True, False)
            assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
    _train(opt, params, 5, seed=3)
    _train(restored, restored_params, 5, seed=3)
    for a, b in zip(_values(opt, params), _values(restored, restored_params)):
        assert torch.equal(a, b)


def test_words_hold_the_high_and_the_low_buffer():
    a, b = torch.randn(5, 24).bfloat16(), torch.randn(5, 24).bfloat16()
    state = {f"m{MARK}bf16.value": a.clone(), f"v{MARK}bf16.value": b.clone(), "step": torch.tensor(1.0)}
    pair_buffers(state)
    high = state[f"m{MARK}bf16.value"]
    words = words_run(high, 8, (14, 8))  # elements 8 .. 119 of the flat buffers
    m, v = decode_words(words, torch.float32)
    assert torch.equal(m.view(-1), a.float().view(-1)[8:120]) and torch.equal(v.view(-1), b.float().view(-1)[8:120])
    for half, expected in ((high, a), (state[f"v{MARK}bf16.value"], b)):  # a half alone: every other bfloat16
        run = BF16().run_parts({"value": half}, 8, 120, 14)["value"]
        assert torch.equal(run, expected.view(-1)[8:120].view(14, 8))


def test_a_half_the_phase_does_not_write_keeps_its_bits():
    high, low = torch.randn(3, 8), torch.randn(3, 8).abs()
    seeds, start = (torch.tensor(11), torch.tensor(12)), torch.tensor(16)
    words = torch.zeros(3, 8)
    encode_words(words, high, low, seeds, start)
    before = words.clone()
    encode_words(words, None, low * 3, seeds, start)
    assert torch.equal(decode_words(words, torch.float32)[0], decode_words(before, torch.float32)[0])
    expected = round_to_bf16_stochastically(low * 3, seeds[1], element_index(low, 16)).float()
    assert torch.equal(decode_words(words, torch.float32)[1], expected)


def test_run_index_is_the_element_index():
    x = torch.zeros(6, 16)
    assert torch.equal(run_index(x, torch.tensor(64)), element_index(x, 64))
    tail = torch.zeros(1, 5)
    assert torch.equal(run_index(tail, torch.tensor(40)), element_index(tail, 40))


def test_stochastic_rounding_keeps_nan_and_inf_and_may_round_past_the_largest():
    largest = torch.finfo(torch.bfloat16).max
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), largest * (1 + 2**-9)] * 64)
    codec, parts = BF16(), BF16().empty(x.shape, True, x.device)
    codec.encode(x, parts, True, torch.tensor(5))
    y = codec.decode(parts, x.shape, True, torch.float32).view(64, 4)
    assert y[:, 0].isnan().all() and (y[:, 1] == float("inf")).all() and (y[:, 2] == -float("inf")).all()
    assert set(y[:, 3].tolist()) == {largest, float("inf")}  # 1/4 of the way to inf: either, at random


def test_the_encoded_step_runs_its_kept_graphs_without_dynamo():
    """After its first compiled steps, the encoded step calls the graphs dynamo kept (``GuardedGraphs``):
    with dynamo's compiled function made to fail, later steps still run, to the same numbers."""
    (kept, kept_params), (reference, reference_params) = _twins({}, {}, compile=True)
    _train(kept, kept_params, 2)
    _train(reference, reference_params, 2)
    steps = list(kept.storage._compiled_runs.values())
    assert steps

    def refuse(**_):
        raise AssertionError("called dynamo")

    for step in steps:
        step._graphs._compiled = refuse
    _train(kept, kept_params, 3, seed=4)
    _train(reference, reference_params, 3, seed=4)
    for a, b in zip(_values(kept, kept_params), _values(reference, reference_params)):
        assert torch.equal(a, b)
