"""The encoded step of an elementwise phase, run on the flat buffer's whole blocks and its last block.

An elementwise phase gives the same result on any slicing of its tensors (``core/eager.py``). When
every encoded buffer of a parameter is stored in blocks of its flat buffer (``Codec.run_width``:
block-wise codes and scales, bfloat16), its step runs on runs of whole blocks: the parameter's
whole blocks, then its shorter last block, each given as tensors of its own (``alias``: param, grad,
state and the parts' slices as ``rows x width`` matrices, one block a row). A run's decode, update
and encode then index everything by (row, column) and a compiled step fuses them into one loop over
the rows: per block, one pass reduces the new scales, a second encodes and updates the parameter,
both recomputing the decoded state from the codes (``fused.RECOMPUTE``) and the block in cache
between them; no float copy of the state is written. Its sizes are symbolic (the width of a run of
whole blocks is the block; a last block's row count is 1): one graph serves every parameter.

A block codec's new codes and scales leave the graph as tensors of their own, copied into the parts
after it (``store_run``: a byte read and one written an element per 8-bit moment). In the graph, the
scales' copy steps over 16 rows at a time, which keeps inductor's CPU backend from fusing the row
loops, and the codes are overwritten where the update reads them: the order this puts between the
update and the encode makes torch 2.13's fusion of the row loops fail (``KeyError`` in
``LoopBody.get_read_expr``, asked where an ordering-only user reads a buffer).

In the parameter's own shape instead (``fused.coded_step``), a block's elements are found through
the parameter's rows, an index inductor recomputes per element in scalar code; the whole blocks' and
the last block's codes leave that graph as new tensors too (``Codec.encode_pieces``).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import torch
from torch import Tensor

from gradwise.core.executor import run_chain
from gradwise.core.phases import Phase
from gradwise.core.transform import state_dtype
from gradwise.state.bf16_pairs import decode_words, encode_words, words_run
from gradwise.state.codec import alias
from gradwise.state.quantize import block_pieces


def plan_runs(phase: Phase, specs, param: Tensor, grad: Tensor, plain: Mapping[str, Tensor],
              output: Tensor | None) -> list[tuple[int, int, int]] | None:
    """``(start, stop, rows)`` of the runs the step of ``param`` takes, or None when it must run in
    the parameter's shape: no encoded buffer, a phase that is not elementwise, a buffer not stored in flat blocks, a
    tensor that is not contiguous, or plain state neither shaped like the parameter nor 0-d."""
    if not specs or not phase.elementwise or param.numel() == 0:
        return None
    widths = [codec.run_width(param.shape, signed) for _, codec, signed in specs]
    if None in widths:
        return None
    shaped = [param, grad, *([] if output is None else [output])]
    for value in plain.values():
        if value.shape == param.shape:
            shaped.append(value)
        elif value.dim():
            return None
    if not all(t.is_contiguous() and t.shape == param.shape for t in shaped):
        return None
    block = max(widths)  # powers of two (or 1): each divides the largest
    return [(0, param.numel(), 1)] if block == 1 else block_pieces(param.numel(), block)


def cut_runs(runs, specs, pairs, param: Tensor, plain: Mapping[str, Tensor], parts: Mapping[str, Mapping[str, Tensor]]):
    """For each run, ``(param, plain, parts, start)``: the parameter, its plain state and the encoded
    buffers' parts over the run's memory, and its first element's index (``start_tensor``; ``pairs``:
    ``bf16_pairs.pairs_in``'s, whose first buffer's parts are the pair's ``words`` and whose second's are
    empty). With ``cut_steps``' tensors, ``step_run``'s arguments; these stay valid while the tensors keep
    their memory (``gradwise.state.prepared``)."""
    paired = {specs[i][0]: specs[j][0] for i, j in pairs}
    seconds = set(paired.values())
    for start, stop, rows in runs:
        shape = (rows, (stop - start) // rows)
        run_parts = {b: {"words": words_run(parts[b]["value"], start, shape)} if b in paired
                     else {} if b in seconds else codec.run_parts(parts[b], start, stop, rows) for b, codec, _ in specs}
        yield (alias(param, start, shape), {k: alias(v, start, shape) if v.shape == param.shape else v
                                            for k, v in plain.items()},
               run_parts, start_tensor(start, param.device))


def cut_steps(runs, grad: Tensor, output: Tensor | None):
    """For each run, ``(grad, output)`` over its memory (``output`` None: None): what a step gives anew."""
    for start, stop, rows in runs:
        shape = (rows, (stop - start) // rows)
        yield alias(grad, start, shape), None if output is None else alias(output, start, shape)


@lru_cache(maxsize=4096)
def start_tensor(start: int, device: torch.device) -> Tensor:
    """A run's first element's index as the 0-d int64 tensor ``step_run`` reads (made once per value
    and device: no graph writes it)."""
    return torch.tensor(start, dtype=torch.int64, device=device)


def step_run(phase: Phase, specs, pairs, param: Tensor, grad: Tensor, plain: Mapping[str, Tensor],
             parts: Mapping[str, Mapping[str, Tensor]], start: Tensor, rounding: Tensor | None, output: Tensor | None,
             seeds: Tensor, values: Tensor, layout, static) -> tuple[dict[str, Tensor], dict[str, dict[str, Tensor]]]:
    """``fused.coded_step`` on one run (``prepared.Prepared.run_arguments``); ``start``: the run's first element's flat
    index (0-d), which stochastic rounding's random bits depend on; ``pairs``: the ``bf16`` buffers read
    and written as one word (``gradwise.state.bf16_pairs``), by index into ``specs``. Returns the
    reductions' parts and the new parts that the codecs left to store (``Codec.encode_run``), by buffer,
    for ``store_run``."""
    state = dict(plain)
    dtype = state_dtype(param)
    in_pairs = {k for pair in pairs for k in pair}
    for i, j in pairs:
        state[specs[i][0]], state[specs[j][0]] = decode_words(parts[specs[i][0]]["words"], dtype)
    for k, (buffer, codec, signed) in enumerate(specs):
        if k not in in_pairs:
            state[buffer] = codec.decode_run(parts[buffer], signed, dtype)
    reduced = run_chain(phase, [param], [grad], {k: [v] for k, v in state.items()}, values, layout, static,
                        rounding, None if output is None else [output])
    for i, j in pairs:
        high, low = specs[i][0], specs[j][0]
        if high in phase.writes or low in phase.writes:
            encode_words(parts[high]["words"], state[high] if high in phase.writes else None,
                         state[low] if low in phase.writes else None, (seeds[i], seeds[j]), start)
    later = {}
    for k, (buffer, codec, signed) in enumerate(specs):
        if buffer in phase.writes and k not in in_pairs:
            later[buffer] = codec.encode_run(state[buffer], parts[buffer], signed, seeds[k], start)
    return reduced, later


def store_run(parts: Mapping[str, Mapping[str, Tensor]], later: Mapping[str, Mapping[str, Tensor]]) -> None:
    """Copy the new parts of a run's buffers (``step_run``'s second result) into its ``run_parts``."""
    for buffer, new in later.items():
        for name, value in new.items():
            parts[buffer][name].copy_(value)
