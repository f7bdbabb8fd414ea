"""The codec protocol: how one state buffer is stored between steps, and the registry of codecs.

A codec turns a float buffer shaped like its parameter into a few plain tensors (its *parts*) and
back. The transforms never see it: the optimizer decodes every encoded buffer of a parameter into a
float tensor before the chain runs and encodes the result after (in one compiled graph on the
compiled path). Parts are plain tensors, so ``torch.save``/``torch.load(weights_only=True)`` and
``state_dict()`` round trips carry them exactly. A DTensor parameter's parts are DTensors sharded
like it, each rank encoding its own rows of the logical tensor (``gradwise.state.shards``).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from gradwise.state.shards import LocalShard

#: block sizes must divide the eager path's piece and any power-of-two shard: powers of two in this range.
MIN_BLOCK, MAX_BLOCK = 16, 1 << 16


class Codec:
    """Base class. ``signed=False`` tells a codec the buffer never holds negative values (a second
    moment), which the integer codecs use to spend no code on negatives."""

    name = "codec"

    @property
    def tag(self) -> str:
        """Names the storage format in state keys (``"adam.exp_avg@int8-b2048.codes"``): the codec and
        every parameter needed to decode it."""
        return self.name

    def empty(self, shape: torch.Size, signed: bool, device: torch.device, shard: LocalShard | None = None
              ) -> dict[str, Tensor]:
        """Zeroed parts for a buffer of ``shape``; with ``shard`` (``gradwise.state.shards``), the local
        parts of a DTensor parameter's buffer (``shape``: the local shard's)."""
        raise NotImplementedError

    def all_reduced(self, shard: LocalShard, signed: bool) -> int:
        """float32 elements that one encode of a sharded buffer all-reduces (max) over its ranks."""
        return 0

    def replicated_parts(self, shape: torch.Size, signed: bool) -> tuple[str, ...]:
        """The parts that every rank of a DTensor parameter of (logical) ``shape`` holds whole, not its
        rows' share."""
        return ()

    def encode(self, x: Tensor, parts: dict[str, Tensor], signed: bool, seed: Tensor, shard: LocalShard | None = None
               ) -> None:
        """Store ``x`` (float, shaped like the parameter, or its local shard with ``shard``) into
        ``parts`` in place. ``seed`` is a 0-d int64 tensor, different every step and buffer, for codecs
        that round stochastically. With ``shard``, a collective where a scale spans ranks."""
        raise NotImplementedError

    def encode_pieces(self, x: Tensor, signed: bool, seed: Tensor) -> list[tuple[str, int, Tensor]] | None:
        """``encode``'s result on a plain (not sharded) buffer as new tensors, ``(part, offset, values)``, for the
        caller to copy into ``part`` from element ``offset`` on after the step; None: ``encode`` writes in place."""
        return None

    def decode(self, parts: dict[str, Tensor], shape: torch.Size, signed: bool, dtype: torch.dtype,
               shard: LocalShard | None = None) -> Tensor:
        raise NotImplementedError

    def zeros(self, shape: torch.Size, signed: bool, device: torch.device) -> dict[str, Tensor]:
        """The parts ``encode`` writes for a buffer of zeros (fresh state, any seed): here by encoding them; a codec
        whose parts for zeros are constants fills them instead (``tests/test_state_codecs.py``: the same bits)."""
        parts = self.empty(shape, signed, device)
        self.encode(torch.zeros(shape, device=device), parts, signed, torch.zeros((), dtype=torch.int64, device=device))
        return parts

    def run_width(self, shape: torch.Size, signed: bool) -> int | None:
        """For the step on runs of the flat buffer (``gradwise.state.runs``): runs of a buffer of
        ``shape`` must start at multiples of this many elements (its block; 1: anywhere); None when a
        part spans the whole buffer (rank-1 maxima), and the buffer steps in its own shape."""
        return None

    def run_parts(self, parts: dict[str, Tensor], start: int, stop: int, rows: int) -> dict[str, Tensor]:
        """Tensors over the memory of ``parts`` that hold elements ``start`` to ``stop`` of the flat
        buffer, ``rows`` blocks of them (``alias``)."""
        raise NotImplementedError

    def decode_run(self, parts: dict[str, Tensor], signed: bool, dtype: torch.dtype) -> Tensor:
        """A run's values from its ``run_parts``, a block a row."""
        raise NotImplementedError

    def encode_run(self, x: Tensor, parts: dict[str, Tensor], signed: bool, seed: Tensor, start: Tensor
                   ) -> dict[str, Tensor]:
        """Encode a run (``x``: a block a row; ``start``: its first element's flat index, 0-d): store it
        into its ``run_parts``, or return new parts (by name, shaped like them) for the caller to copy
        into them after the step (``gradwise.state.runs.store_run``). A codec that reduces a block (its
        scale) returns its parts: written in the compiled step, they are read and overwritten in one
        graph, and the ordering inductor then keeps between its loops costs the step its one loop."""
        raise NotImplementedError

    def nbytes(self, shape: torch.Size, signed: bool) -> int:
        """Bytes of the parts for a buffer of ``shape``, computed without allocating."""
        parts = self.empty(torch.Size(shape), signed, torch.device("meta"))
        return sum(p.numel() * p.element_size() for p in parts.values())

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self) and other.tag == self.tag

    def __hash__(self) -> int:
        return hash(self.tag)

    def __repr__(self) -> str:
        return self.tag


def alias(t: Tensor, offset: int, shape: tuple[int, ...], every: int = 1) -> Tensor:
    """A tensor of ``shape`` over the memory of ``t`` from its element ``offset`` on, ``t`` contiguous or,
    with ``every``, every ``every``-th element of its memory (one half of ``bf16_pairs``' words): then
    the tensor's strides are ``every`` times a contiguous tensor's. Not a view: dynamo would guard on a
    view's base, one graph per base shape."""
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset() + every * offset, shape,
                               contiguous_strides(tuple(shape), every))


@lru_cache(maxsize=1024)
def contiguous_strides(shape: tuple[int, ...], every: int = 1) -> tuple[int, ...]:
    """A contiguous tensor's strides for ``shape``, times ``every`` (computed here: a meta tensor's
    ``stride()`` costs microseconds at every step of every parameter)."""
    strides, size = [], every
    for n in reversed(shape):
        strides.append(size)
        size *= max(n, 1)
    return tuple(reversed(strides))


def check_block_size(argument: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_BLOCK <= value <= MAX_BLOCK \
            or value & (value - 1):
        raise ValueError(f"invalid {argument}={value!r}: expected a power of two from {MIN_BLOCK} to {MAX_BLOCK},"
                         f" so that blocks divide the eager path's {MAX_BLOCK}-element pieces and power-of-two shards")
    return value


def n_blocks(numel: int, block: int) -> int:
    return math.ceil(numel / block)


def codec_from(spec: Any, argument: str = "state") -> Codec | None:
    """A codec from a name (``"fp32"``, ``"bf16"``, ``"int8"``, ``"int4"``, ``"fp8"``), a tag
    (``"int8-b256"``), or a ``Codec``; ``None`` for float32 (the buffer is stored as it is)."""
    from gradwise.state.bf16 import BF16
    from gradwise.state.float8 import Fp8
    from gradwise.state.integer import Int4, Int8

    if isinstance(spec, Codec):
        return spec
    if spec is None or spec in ("fp32", "float32"):
        return None
    names = {"bf16": BF16, "int8": Int8, "int4": Int4, "fp8": Fp8}
    if isinstance(spec, str):
        name, separator, rest = spec.partition("-b")
        block, *options = rest.split("-")
        if name in names and not separator:
            return names[name]()
        normalization = next((o for o in options if o in ("block", "rank1")), "default")
        rounding = next((o for o in options if o in ("nearest", "stochastic")), "default")
        named = (normalization != "default") + (rounding != "default")
        if name in ("int8", "int4", "fp8") and block.isdigit() and len(options) == named:
            try:
                return names[name](block_size=int(block), normalization=normalization, rounding=rounding)
            except ValueError as error:
                raise ValueError(f"invalid {argument}={spec!r}: {error}") from None
    raise ValueError(f"invalid {argument}={spec!r}: expected one of 'fp32', 'bf16', 'int8', 'int4', 'fp8' (or a tag"
                     " such as 'int8-b256', 'int4-b64-rank1-nearest'), a gradwise.state codec, or a StatePolicy")
