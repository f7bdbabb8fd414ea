"""The eager path: a phase's plain list code, run over cache-sized pieces of the parameters.

An elementwise phase (``core/phases.py``) gives the same result on any slicing of its tensors, so the
eager path runs it on slices of about ``EAGER_CHUNK`` elements, several small parameters batched together. The chain's
temporaries then stay small: they come from the allocator's free lists and the caches instead of
fresh pages (each freshly mapped page costs a fault), which is most of the cost of a foreach step.
Parameters whose state is not shaped like them (per-parameter scalars) or whose memory is not one
dense run run whole, as does every parameter of a phase that is not elementwise. State that is not
shaped like its parameter (a 0-d running product) is only read by ``update`` (``Transform.advance``
writes it), so every piece of the parameter sees it whole.
"""
from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from gradwise.core.executor import Layout, flat_alias, flattenable, rounding_rows, run_chain
from gradwise.core.phases import Phase

#: elements per piece: 256K (1 MiB float32 temporaries). Measured on a 2-core AVX2 EPYC against 64K, 128K, 512K and
#: 1M: the fastest step from 168K-parameter models to 30M (64K, which kept the temporaries in L2, paid a call per
#: list op per piece; 512K and more made fresh pages again on a 756K-parameter model). README, "Benchmarks".
EAGER_CHUNK = 1 << 18


def run_eager(
    phase: Phase,
    params: list[Tensor],
    inputs: list[Tensor],
    states: list[Mapping[str, Tensor]],
    values: Tensor,
    layout: Layout,
    static: Mapping[str, Any],
    seeds: list[int] | None = None,
    outputs: list[Tensor] | None = None,
    starts: list[int] | None = None,
) -> list[dict[str, Tensor]]:
    """One phase of the step on every parameter, in pieces where the phase allows it; returns the
    parts of the next phase's reductions, one dict per piece run. ``seeds`` (one per parameter) are
    the stochastic-rounding seeds of bfloat16 parameters, else None, ``starts`` the logical index of each
    one's first element (a shard's offset; 0 when None); ``outputs``: as ``run_chain``'s."""
    if params and seeds is None and in_one_call(phase, static):
        return [_run_whole(phase, list(range(len(params))), params, inputs, states, values, layout, static, None,
                           starts, outputs)]
    whole: list[int] = []
    batch: list[tuple] = []
    parts: list[dict[str, Tensor]] = []
    size = 0
    for i, (p, g, state) in enumerate(zip(params, inputs, states)):
        seed = 0 if seeds is None else seeds[i]
        base = 0 if starts is None else starts[i]
        out = None if outputs is None else outputs[i]
        if phase.elementwise and 0 < p.numel() <= EAGER_CHUNK:
            # a small tensor is its own piece: no aliasing, no slicing, so its layout does not matter
            pieces = [(p, g, state, seed, base, out)]  # (run_chain only reads the dict)
        elif not _sliceable(phase, p, g, state):
            whole.append(i)
            continue
        else:
            flat_p, flat_g = flat_alias(p), flat_alias(g)
            flat_out = None if out is None else flat_alias(out)
            flat_state = {k: flat_alias(v) if v.shape == p.shape else v for k, v in state.items()}
            pieces = [(flat_p[piece], flat_g[piece],
                       {k: v[piece] if v.shape == flat_p.shape else v for k, v in flat_state.items()},
                       seed, base + piece.start, None if flat_out is None else flat_out[piece])
                      for piece in (slice(start, start + EAGER_CHUNK) for start in range(0, p.numel(), EAGER_CHUNK))]
        for piece in pieces:
            batch.append(piece)
            size += piece[0].numel()
            if size >= EAGER_CHUNK:
                parts.append(_run_batch(phase, batch, values, layout, static, seeds is not None))
                batch, size = [], 0
    if batch:
        parts.append(_run_batch(phase, batch, values, layout, static, seeds is not None))
    if whole:
        parts.append(_run_whole(phase, whole, params, inputs, states, values, layout, static, seeds, starts, outputs))
    return parts


def _run_whole(phase, whole, params, inputs, states, values, layout, static, seeds, starts, outputs):
    """The phase on the parameters at indices ``whole``, whole tensors, in one ``run_chain`` call."""
    keys = states[whole[0]].keys()
    rounding = None if seeds is None else rounding_rows(
        [seeds[i] for i in whole], [0 if starts is None else starts[i] for i in whole], params[0].device)
    return run_chain(phase, [params[i] for i in whole], [inputs[i] for i in whole],
                     {k: [states[i][k] for i in whole] for k in keys}, values, layout, static, rounding,
                     None if outputs is None else [outputs[i] for i in whole])


def in_one_call(phase: Phase, static: Mapping[str, Any]) -> bool:
    """Whether the phase runs on every parameter whole, in one call: one that ends in torch's fused kernel, where
    a link may run it (``Context.torch_kernels``). The kernel is one pass per parameter, allocating nothing: pieces
    would only add a call each."""
    return phase.torch_kernel and bool(static.get("torch_kernels"))


def _sliceable(phase: Phase, p: Tensor, g: Tensor, state: Mapping[str, Tensor]) -> bool:
    return (
        phase.elementwise
        and p.numel() > 0
        and all(v.shape == p.shape or v.dim() == 0 for v in state.values())
        and flattenable(p, g, state)
    )


def _run_batch(phase, batch, values, layout, static, rounds: bool) -> dict[str, Tensor]:
    keys = batch[0][2].keys()
    rounding = rounding_rows([b[3] for b in batch], [b[4] for b in batch], batch[0][0].device) if rounds else None
    outputs = None if batch[0][5] is None else [b[5] for b in batch]
    return run_chain(phase, [b[0] for b in batch], [b[1] for b in batch],
                     {k: [b[2][k] for b in batch] for k in keys}, values, layout, static, rounding, outputs)
