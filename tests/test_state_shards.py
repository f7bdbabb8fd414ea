"""The sharded layout of encoded state (``gradwise.state.shards``), in one process: on one shard holding
the whole tensor it stores exactly today's codes and scales, rows first; shards that a block boundary
separates encode, each at its own offset, the codes of the whole tensor; the scale table holds every
block a row meets. (The all-reduces of blocks and columns a boundary cuts run on real ranks, in
tests/test_fsdp2_state.py.)"""
from __future__ import annotations

import pytest
import torch

from gradwise.state import BF16, Fp8, Int4, Int8
from gradwise.state.quantize import unpack4
from gradwise.state.shards import LocalShard, unpack_rows

SEED = torch.tensor(4242)
#: (codec, shape): odd and even rows, rows shorter and longer than a block, a vector, a 4-d tensor
CASES = [(codec, shape) for codec in (Int8(block_size=64), Int4(), Int4(rounding="stochastic"), Fp8(block_size=64))
         for shape in ((67, 64), (13, 301), (5, 3000), (700,), (6, 3, 5, 7))]


def _tensor(shape, signed: bool) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(7)) * 3
    x.view(-1)[::37] *= 50
    return x if signed else x.square()


def _encode(codec, x, signed, shard=None):
    parts = codec.empty(x.shape, signed, x.device, shard)
    codec.encode(x, parts, signed, SEED, shard)
    return parts


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("codec, shape", CASES, ids=lambda c: str(c))
def test_one_shard_holds_todays_codes_rows_first(codec, shape, signed):
    x = _tensor(shape, signed)
    plain, sharded = _encode(codec, x, signed), _encode(codec, x, signed, LocalShard.whole(x.shape))
    whole = LocalShard.whole(x.shape)
    codes = unpack4(plain["codes"])[: x.numel()] if codec.bits == 4 else plain["codes"]
    assert torch.equal(unpack_rows(sharded["codes"], whole, codec.bits), codes)
    if codec.bits == 4 and whole.row_numel % 2 == 0:  # even rows: the very bytes of the flat packing
        assert torch.equal(sharded["codes"].view(-1), plain["codes"])
    if "absmax" in plain and whole.is_vector:  # all the blocks' scales, as they are
        assert torch.equal(sharded["absmax"], plain["absmax"])
    elif "absmax" in plain:
        index, meets = whole.table_index(codec.block_size, x.device)
        assert torch.equal(sharded["absmax"], torch.where(meets, plain["absmax"][index], 0.0))
    else:
        assert torch.equal(sharded["row_max"], plain["row_max"]) and torch.equal(sharded["col_max"], plain["col_max"])
    assert torch.equal(codec.decode(sharded, x.shape, signed, torch.float32, whole),
                       codec.decode(plain, x.shape, signed, torch.float32))


@pytest.mark.parametrize("codec, stochastic", [(Int8(block_size=64), False), (Int4(rounding="stochastic"), True),
                                               (BF16(), True), (Fp8(block_size=64), False)], ids=str)
def test_shards_at_block_boundaries_encode_the_whole_tensors_codes(codec, stochastic):
    """Rows of 128 elements: every row boundary is a block boundary, so each shard's codes, stochastic
    bits included, are the whole tensor's: its random bits come from its logical offset, not from 0."""
    x = _tensor((9, 128), signed=True)
    whole = _encode(codec, x, True, LocalShard.whole(x.shape))
    pieces = [_encode(codec, x[start:stop], True, LocalShard(x.shape, start, stop)) for start, stop in
              ((0, 4), (4, 4), (4, 7), (7, 9))]
    for part, value in whole.items():
        assert torch.equal(torch.cat([p[part] for p in pieces]), value), part
    shifted = _encode(codec, x[4:7], True, LocalShard.whole(x[4:7].shape))  # the same rows at offset 0
    assert any(not torch.equal(shifted[k], pieces[2][k]) for k in shifted) == stochastic


@pytest.mark.parametrize("row_numel, block", [(64, 64), (67, 2048), (301, 128), (3000, 2048), (768, 2048),
                                              (1, 128), (96, 64)])
def test_scale_table_is_as_wide_as_the_most_blocks_a_row_meets(row_numel, block):
    rows = 2 * block  # every offset a row can start at, modulo the block
    met = max((r * row_numel + row_numel - 1) // block - r * row_numel // block + 1 for r in range(rows))
    assert LocalShard.whole(torch.Size([rows, row_numel])).table_width(block) == met
