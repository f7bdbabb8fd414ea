"""The eager path: the chain's plain list code, run over cache-sized pieces of the parameters.

An elementwise chain gives the same result on any slicing of its tensors, so the eager path runs it
on slices of about ``EAGER_CHUNK`` elements, several small parameters batched together. The chain's
temporaries then stay small: they come from the allocator's free lists and the caches instead of
fresh pages (each freshly mapped page costs a fault), which is most of the cost of a foreach step.
Parameters whose state is not shaped like them (per-parameter scalars) or whose memory is not one
dense run run whole, as does every parameter of a chain that is not elementwise. State that is not
shaped like its parameter (a 0-d running product) is only read by ``update`` (``Transform.advance``
writes it), so every piece of the parameter sees it whole.
"""
from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from gradwise.core.executor import Layout, flat_alias, flattenable, rounding_rows, run_chain
from gradwise.core.transform import Transform

#: elements per piece: 64K float32 elements make 256 KiB temporaries, which stay in L2.
EAGER_CHUNK = 1 << 16


def run_eager(
    transform: Transform,
    params: list[Tensor],
    grads: list[Tensor],
    states: list[Mapping[str, Tensor]],
    values: Tensor,
    layout: Layout,
    static: Mapping[str, Any],
    seeds: list[int] | None = None,
) -> None:
    """One step of ``transform`` on every parameter, in pieces where the chain allows it. ``seeds``
    (one per parameter) are the stochastic-rounding seeds of bfloat16 parameters, else None."""
    whole: list[int] = []
    batch: list[tuple[Tensor, Tensor, dict[str, Tensor], int, int]] = []
    size = 0
    for i, (p, g, state) in enumerate(zip(params, grads, states)):
        seed = 0 if seeds is None else seeds[i]
        if not _sliceable(transform, p, g, state):
            whole.append(i)
            continue
        if p.numel() <= EAGER_CHUNK:  # a small tensor is its own piece: no aliasing, no slicing
            pieces = [(p, g, dict(state), seed, 0)]
        else:
            flat_p, flat_g = flat_alias(p), flat_alias(g)
            flat_state = {k: flat_alias(v) if v.shape == p.shape else v for k, v in state.items()}
            pieces = [(flat_p[piece], flat_g[piece],
                       {k: v[piece] if v.shape == flat_p.shape else v for k, v in flat_state.items()},
                       seed, piece.start)
                      for piece in (slice(start, start + EAGER_CHUNK) for start in range(0, p.numel(), EAGER_CHUNK))]
        for piece in pieces:
            batch.append(piece)
            size += piece[0].numel()
            if size >= EAGER_CHUNK:
                _run_batch(transform, batch, values, layout, static, seeds is not None)
                batch, size = [], 0
    if batch:
        _run_batch(transform, batch, values, layout, static, seeds is not None)
    if whole:
        keys = states[whole[0]].keys()
        rounding = None if seeds is None else rounding_rows([seeds[i] for i in whole], [0] * len(whole),
                                                            params[0].device)
        run_chain(transform, [params[i] for i in whole], [grads[i] for i in whole],
                  {k: [states[i][k] for i in whole] for k in keys}, values, layout, static, rounding)


def _sliceable(transform: Transform, p: Tensor, g: Tensor, state: Mapping[str, Tensor]) -> bool:
    return (
        transform.elementwise
        and p.numel() > 0
        and all(v.shape == p.shape or v.dim() == 0 for v in state.values())
        and flattenable(p, g, state)
    )


def _run_batch(transform, batch, values, layout, static, rounds: bool) -> None:
    keys = batch[0][2].keys()
    rounding = rounding_rows([b[3] for b in batch], [b[4] for b in batch], batch[0][0].device) if rounds else None
    run_chain(transform, [b[0] for b in batch], [b[1] for b in batch],
              {k: [b[2][k] for b in batch] for k in keys}, values, layout, static, rounding)
