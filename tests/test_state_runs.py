"""The encoded step on runs of whole blocks (gradwise.state.runs): the same codes as the codecs' own
encoding, and compiled equal to eager on parameters whose last block is short."""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config

import gradwise
from gradwise.state import StatePolicy
from gradwise.state.codec import codec_from
from gradwise.state.quantize import block_pieces
from gradwise.state.runs import store_run

#: codecs whose buffers step on runs, with small blocks; int4's first moments round stochastically
TAGS = ["fp8-b64", "int8-b64-block", "int4-b64", "int8-b64-stochastic", "bf16"]


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "non-negative"])
@pytest.mark.parametrize("tag", TAGS)
def test_runs_store_what_the_whole_buffer_stores(tag, signed):
    """Encoding a buffer run by run (its whole blocks, then its short last block) writes the very parts
    that encoding it whole does, random bits of stochastic rounding included, and decodes to the same
    values; a NaN stays in its element."""
    codec, shape = codec_from(tag), torch.Size([210])  # 3 blocks of 64 and 18 more (1-D: never rank-1)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 1e-3
    x = x if signed else x.abs()
    x[65] = float("nan")
    seed = torch.tensor(12345, dtype=torch.int64)
    whole = codec.empty(shape, signed, x.device)
    codec.encode(x, whole, signed, seed)
    runs = codec.empty(shape, signed, x.device)
    width = codec.run_width(shape, signed)
    assert 64 % width == 0  # the runs below start at multiples of the codec's run width
    decoded = []
    for start, stop, rows in block_pieces(x.numel(), 64):
        parts = codec.run_parts(runs, start, stop, rows)
        later = codec.encode_run(x.view(-1)[start:stop].view(rows, -1), parts, signed, seed, torch.tensor(start))
        store_run({"m": parts}, {"m": later})
        decoded.append(codec.decode_run(parts, signed, torch.float32).view(-1))
    for name, part in whole.items():
        assert torch.equal(part.view(torch.uint8), runs[name].view(torch.uint8)), name
    expected = codec.decode(whole, shape, signed, torch.float32).view(-1)
    torch.testing.assert_close(torch.cat(decoded), expected, rtol=0, atol=0, equal_nan=True)
    assert torch.cat(decoded).isnan().nonzero().view(-1).tolist() == [65]


def test_rank1_state_does_not_step_on_runs():
    """Rank-1 maxima span the whole matrix: int8's second moments of a matrix step in its shape."""
    assert codec_from("int8").run_width(torch.Size([7, 30]), False) is None
    assert codec_from("int8").run_width(torch.Size([210]), False) == 2048


def _run(compile, steps=3):
    torch.manual_seed(0)
    # 210 elements: 3 blocks of 64 and a short last block of 18
    params = [torch.nn.Parameter(torch.randn(7, 30) * 0.1)]
    opt = gradwise.AdamW(params, lr=1e-2, weight_decay=0.1, state=StatePolicy("fp8-b64", min_numel=0),
                         compile=compile)
    for step in range(steps):
        params[0].grad = torch.randn(7, 30, generator=torch.Generator().manual_seed(step)) * 1e-2
        opt.step()
    return params[0], opt


@pytest.mark.slow
def test_compiled_equals_eager_on_a_short_last_block():
    """The reproducer of the short last block: compiled against eager, element by element, the whole
    blocks in one graph and the last block in another (sizes symbolic: the graphs serve every
    parameter; dynamo specializes a run of one row and one at the start of its buffer)."""
    threshold = torch._inductor.config.realize_reads_threshold
    (eager, eager_opt), (compiled, compiled_opt) = _run(False), _run(True)
    # the runs' graphs recompute the decoded state (gradwise.state.fused.RECOMPUTE) under a patch of their own
    assert torch._inductor.config.realize_reads_threshold == threshold
    torch.testing.assert_close(eager, compiled, rtol=1e-5, atol=1e-6)
    eager_state, compiled_state = eager_opt.state[eager], compiled_opt.state[compiled]
    assert sorted(eager_state) == sorted(compiled_state) and any("fp8" in k for k in eager_state)
    for key, value in eager_state.items():
        if value.dtype == torch.uint8:  # codes: equal but at rounding ties
            assert (value != compiled_state[key]).float().mean() < 1e-2, key
        else:
            torch.testing.assert_close(value, compiled_state[key], rtol=1e-5, atol=1e-7)
    # two graphs (dynamo's first analysis of the step may restart, compiling its graph twice), not one per shape
    assert compiled_opt.compile_stats["compiles"] <= 3
