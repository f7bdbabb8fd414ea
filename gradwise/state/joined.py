"""Small parameters' encoded steps, run eagerly as one.

Eagerly, a parameter's encoded step is some 70 tensor operations (decode, the chain, stochastic
rounding, encode) whatever its size, each costing microseconds of dispatch: on a model of many small
tensors that overhead is most of the step. An elementwise phase gives the same result on any slicing of its tensors
(``core/eager.py``), and a run of whole blocks (``runs.cut_runs``) is ``rows x width`` matrices, one
block a row. So the runs of several parameters with the same buffers, codecs and width, stacked row on
row (``torch.cat``), are one run, stepped by one set of operations (``runs.step_run``). Each row keeps
its own logical index (``start``: a ``(rows, 1)`` tensor of its first element's index in its
parameter, ``hashing.element_index``) and its parameter's seeds (a ``(buffers, rows, 1)`` tensor), so
every element draws the random bits it draws alone, and the result is each run's own step, bit for bit.
What the step wrote (parameter, plain state, the buffers' parts) is then copied back, one
``torch._foreach_copy_`` a tensor kind.

Where it pays and is safe: eagerly, parameters of at most ``JOIN_NUMEL`` elements, stacked up to
``JOIN_TOTAL`` elements (the stacked copies are the only memory it adds), in a phase that hands no
reduction on (its statistic would be one part for many parameters), with no bfloat16 parameter rounding
and no output tensor, its plain state shaped like the parameter.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch
from torch import Tensor

from gradwise.core.phases import Phase

#: a parameter of at most this many elements joins others (above it, dispatch is a small share of its step)
JOIN_NUMEL = 1 << 15
#: elements stacked in one join at most: what its copies may add to the step's memory
JOIN_TOTAL = 1 << 16


def joins(phase: Phase, p: Tensor, plain: Mapping[str, Tensor], rounding_seed: int | None,
          output: Tensor | None) -> bool:
    """Whether the eager runs of ``p`` may be stacked with other parameters' in this phase."""
    return (phase.reducer is None and rounding_seed is None and output is None and p.numel() <= JOIN_NUMEL
            and all(v.shape == p.shape for v in plain.values()))


class Joins:
    """The runs waiting to be stepped together, by what they must share: ``add`` them, then ``flush``.
    ``call(key, run, seeds)`` steps a run (stacked or alone) and stores what its codecs left to store."""

    def __init__(self, phase: Phase, call: Callable[[tuple, tuple, Tensor], None]):
        self.phase = phase
        self._call = call
        self._pending: dict[tuple, list[tuple[tuple, int, Tensor]]] = {}
        self._sizes: dict[tuple, int] = {}

    def add(self, key: tuple, run: tuple, start: int, seeds: Tensor) -> None:
        """Queue ``run`` (``cut_runs``'s tuple; ``start``: its first element's index; ``seeds``: its
        parameter's, one per buffer) under ``key`` (what runs stacked must share: specs, pairs, plain keys,
        width, dtype, device). A queue that reaches ``JOIN_TOTAL`` elements is stepped at once."""
        self._pending.setdefault(key, []).append((run, start, seeds))
        self._sizes[key] = self._sizes.get(key, 0) + run[0].numel()
        if self._sizes[key] >= JOIN_TOTAL:
            del self._sizes[key]
            self._run(key, self._pending.pop(key))

    def flush(self) -> None:
        """Step every queued run."""
        for key, queue in self._pending.items():
            self._run(key, queue)
        self._pending.clear()
        self._sizes.clear()

    def _run(self, key: tuple, queue: list[tuple[tuple, int, Tensor]]) -> None:
        if len(queue) == 1:
            run, _, seeds = queue[0]
            self._call(key, run, seeds)
            return
        stacked, seeds = stack(queue)
        self._call(key, stacked, seeds)
        copy_back(stacked, [run for run, _, _ in queue], self.phase)


def stack(queue: list[tuple[tuple, int, Tensor]]) -> tuple[tuple, Tensor]:
    """One run of the queued runs' rows, in order, and its seeds (``(buffers, rows, 1)``)."""
    runs = [run for run, _, _ in queue]
    first = runs[0]
    width = first[0].shape[1]
    rows = torch.tensor([run[0].shape[0] for run in runs])
    device = first[0].device
    # row r of run i (its first row at o_i of the stack) starts at s_i + (r - o_i) * width
    offsets = torch.cumsum(rows, 0) - rows
    base = torch.tensor([start for _, start, _ in queue]) - offsets * width
    starts = (torch.arange(int(rows.sum())) * width + torch.repeat_interleave(base, rows)).view(-1, 1).to(device)
    seeds = torch.repeat_interleave(torch.stack([s for _, _, s in queue]).cpu(), rows, dim=0)
    param, grad = (torch.cat([run[k] for run in runs]) for k in (0, 1))
    plain = {key: torch.cat([run[2][key] for run in runs]) for key in first[2]}
    parts = {buffer: {name: torch.cat([run[3][buffer][name] for run in runs]) for name in own}
             for buffer, own in first[3].items()}
    return (param, grad, plain, parts, starts, None, None), seeds.t().unsqueeze(-1).to(device)


def copy_back(stacked: tuple, runs: list[tuple], phase: Phase) -> None:
    """Copy what the stacked run's step wrote into each run's memory: the parameter, its plain state in
    ``phase.writes``, and every part of the encoded buffers (``stacked``'s parts hold the new ones)."""
    rows = [run[0].shape[0] for run in runs]
    torch._foreach_copy_([run[0] for run in runs], list(stacked[0].split(rows)))
    for key, value in stacked[2].items():
        if key in phase.writes:
            torch._foreach_copy_([run[2][key] for run in runs], list(value.split(rows)))
    for buffer, own in stacked[3].items():
        for name, value in own.items():
            torch._foreach_copy_([run[3][buffer][name] for run in runs], list(value.split(rows)))
