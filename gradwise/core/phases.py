"""A step in phases: the links of a chain grouped into passes that each run over every bucket.

A chain runs in one pass per bucket (``p <- p + chain(g)``) unless it needs more:

- a link that declares ``reductions`` (``clip_by_global_norm``'s sum of squares, ``skip_nonfinite``'s
  flag, Ranger21's mean second moment) needs statistics of its input over *every* parameter of the
  step before it runs. The chain is cut before it: the phase before the cut ends by computing each
  bucket's part of those statistics from its output (``Transform.reduce``); the engine combines the
  parts (``combine``: the one place a distributed layer must all-reduce) and hands the totals to
  the phases after the cut as ``ctx[name]``;
- a link that ``moves_point`` (Ranger21's decay) runs in a phase of its own, on whole tensors, which
  writes the parameters where it moves them before the links after it step from there;
- adjacent stateless links that ``fuse`` (Ranger21's gradient shaping) run as one;
- a run of links that read whole tensors (a standard deviation, a matrix root) followed by
  elementwise links: the whole-tensor links run on whole tensors and the elementwise suffix in
  cache-sized pieces (eagerly) or as one compiled graph of any length. A whole-tensor run that is
  compiled needs no cut (it compiles for whole tensors, suffix included) unless it is ``batched``
  (those run eagerly), so the cut is made only where the suffix would otherwise run whole and eager.

Between phases each parameter's update is kept in a float tensor shaped like it (``Phase.last`` is
False): the cost of a cut is one write and one read of that tensor.

For sharded parameters (``plan(..., sharded=True)``) a segment is cut into runs of elementwise links,
which run on each rank's shards, and runs of whole-tensor links, which run on each parameter's owner
(``Phase.owned``, ``core/owned.py``); so is a mover's phase, and a phase that prepares its reducer
(it reads whole tensors). A phase whose first link is the reducer of an owned phase, and keeps
state, is owned too: that state is read where the reducer ran.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.transform import Chain, Context, Transform, run_links, scoped, strip_namespace


class Phase(Transform):
    """Consecutive ``links`` of a chain (with the chain's namespaces), run as one pass.

    ``reducer``: the (namespace, link) the next phase starts with, whose ``reduce`` runs on this
    phase's output, or None. ``reads_grads``: this phase's input is the gradient (so ``maximize``
    negates it), not the previous phase's output. ``last``: its output is added to the parameters.
    ``state`` holds the keys of its links and, read only, those of the reducer; ``writes`` the first.
    """

    name = "phase"

    def __init__(self, links: list[tuple[str, Transform]], reducer: tuple[str, Transform] | None,
                 reads_grads: bool, last: bool, moves: bool = False, owned: bool = False):
        self._links, self.reducer, self.reads_grads, self.last, self.moves = links, reducer, reads_grads, last, moves
        self.owned = owned
        self.run_start = self.run_end = self.run_reads_params = self.run_writes_params = False
        self.writes = tuple(_keys(links if reducer is None or not reducer[1].prepares else [*links, reducer]))
        self.state = tuple(dict.fromkeys([*self.writes, *_keys([reducer] if reducer else [])]))
        #: ``state`` less what only ``advance`` touches (``Transform.advance_only``): what a run hands the links
        self.run_state = tuple(k for k in self.state if k not in set(_keys(links, "advance_only")))
        # a reducer that prepares sees whole tensors
        self.elementwise = all(t.elementwise for _, t in links) and not (reducer and reducer[1].prepares)
        self.batched = any(t.batched for _, t in links)
        #: a last phase whose last link writes the parameters with torch's fused kernel (``Transform.torch_kernel``)
        self.torch_kernel = last and bool(links) and links[-1][1].torch_kernel
        #: an owner needs the whole parameters too (not only the phase's input)
        self.reads_params = last or moves or any(t.reads_params for _, t in links) or \
            bool(reducer and reducer[1].prepares and reducer[1].reads_params)

    def links(self) -> list[tuple[str, Transform]]:
        return list(self._links)

    def update(self, updates: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> list[Tensor]:
        return run_links(self._links, updates, state, ctx)

    def apply(self, updates: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> None:
        """The last phase: ``p <- p + phase(u)``, its last link writing the parameters (``Transform.apply``)."""
        if not self._links:
            lists.add_(ctx.params, updates)
            return
        namespace, t = self._links[-1]
        t.apply(run_links(self._links[:-1], updates, state, ctx), strip_namespace(namespace, state),
                scoped(namespace, ctx))

    def partials(self, updates: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> dict[str, Tensor]:
        """The next phase's first link on this phase's output: its ``prepare``, and its parts of its
        statistics (``{}`` without a reducer)."""
        if self.reducer is None:
            return {}
        namespace, t = self.reducer
        own_state, own_ctx = strip_namespace(namespace, state), scoped(namespace, ctx)
        if t.prepares:
            t.prepare(updates, own_state, own_ctx)
        return t.reduce(updates, own_state, own_ctx) if t.reductions else {}

    def point_factors(self, params: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> list[Tensor]:
        """A phase that ``moves``: the product of its links' factors, each link seeing where the ones
        before it moved the parameters."""
        factors = None
        for namespace, t in self._links:
            moved = params if factors is None else [p * f for p, f in zip(params, factors)]
            own = t.point_factors(moved, strip_namespace(namespace, state), scoped(namespace, ctx))
            factors = own if factors is None else [f * g for f, g in zip(factors, own)]
        return factors

    def __repr__(self) -> str:
        return "phase(" + ", ".join(repr(t) for _, t in self._links) + ")"


def plan(transform: Transform, compiled: bool, sharded: bool = False) -> tuple[Phase, ...]:
    """The phases ``transform`` (a group's resolved chain) runs in; one when it needs no cut.
    ``sharded``: for parameters sharded over ranks (module docstring)."""
    links = _fused(transform.links() if isinstance(transform, Chain) else [("", transform)])
    segments: list[tuple[list, tuple | None]] = []
    current: list[tuple[str, Transform]] = []
    for index, (namespace, t) in enumerate(links):
        if t.reductions or t.prepares:
            if any(op == "skip" for op in t.reductions.values()):
                _check_guard_position(t, links[:index])
            segments.append((current, (namespace, t)))
            current = []
        current.append((namespace, t))
    segments.append((current, None))
    phases: list[Phase] = []
    reads_grads = True
    owned_reducer = None
    for seg_links, reducer in segments:
        movers = [(n, t) for n, t in seg_links if t.moves_point]
        if movers:  # they move the parameters once the reductions before them are known, before the rest runs
            phases.append(Phase(movers, None, reads_grads, False, moves=True, owned=sharded))
            seg_links = [(n, t) for n, t in seg_links if not t.moves_point]
        parts = _runs(seg_links) if sharded else _split(seg_links, compiled)
        for part_index, part in enumerate(parts):
            final = part_index == len(parts) - 1
            phase = Phase(part, reducer if final else None, reads_grads, final and reducer is None)
            if sharded:  # the reducer of an owned phase keeps its state where that phase ran it
                follows_owned = owned_reducer is not None and bool(part) and part[0] == owned_reducer \
                    and bool(part[0][1].state)
                phase.owned = not phase.elementwise or follows_owned
            phases.append(phase)
            reads_grads = reads_grads and not part
        owned_reducer = reducer if phases and phases[-1].owned else None
    _mark_owned_runs(phases)
    return tuple(phases)


def _mark_owned_runs(phases: list[Phase]) -> None:
    """Consecutive owned phases share one gather and one scatter: the owner keeps the whole tensors
    between them. Each owned phase learns whether it starts its run (``run_start``: it gathers, the
    parameters too where a phase of the run reads or writes them, ``run_reads_params``), ends it
    (``run_end``: it scatters) and whether the run writes the parameters (``run_writes_params``)."""
    start = 0
    while start < len(phases):
        if not phases[start].owned:
            start += 1
            continue
        stop = start
        while stop + 1 < len(phases) and phases[stop + 1].owned:
            stop += 1
        run = phases[start:stop + 1]
        for ph in run:
            ph.run_start, ph.run_end = ph is run[0], ph is run[-1]
            ph.run_reads_params = any(q.reads_params for q in run)
            ph.run_writes_params = any(q.last or q.moves for q in run)
        start = stop + 1


def owned_namespaces(phases: tuple[Phase, ...]) -> set[str]:
    """The namespaces of the links whose state lives on the owner (they run in owned phases, or
    prepare for one)."""
    owned = set()
    for ph in phases:
        if ph.owned:
            owned.update(n for n, _ in ph.links())
            if ph.reducer and ph.reducer[1].prepares:
                owned.add(ph.reducer[0])
    return owned


def _fused(links: list[tuple[str, Transform]]) -> list[tuple[str, Transform]]:
    """``links`` with adjacent stateless links that ``fuse`` replaced by their fusion."""
    out: list[tuple[str, Transform]] = []
    for namespace, t in links:
        plain = not t.state and not t.reductions and not t.hooks
        if out and plain and (fused := out[-1][1].fuse(t)) is not None:
            out[-1] = (out[-1][0], fused)
        else:
            out.append((namespace, t))
    return out


def _split(links: list[tuple[str, Transform]], compiled: bool) -> list[list[tuple[str, Transform]]]:
    """A segment as whole-tensor prefix and elementwise suffix, when cutting them apart helps (module
    docstring); else as one part. An empty segment is one empty part (a reduction of the gradients)."""
    whole = [i for i, (_, t) in enumerate(links) if not t.elementwise]
    if not whole or whole[-1] == len(links) - 1:
        return [links]
    prefix = links[:whole[-1] + 1]
    if compiled and not any(t.batched for _, t in prefix):
        return [links]
    return [prefix, links[whole[-1] + 1:]]


def _runs(links: list[tuple[str, Transform]]) -> list[list[tuple[str, Transform]]]:
    """A segment as its maximal runs of elementwise and of whole-tensor links (sharded parameters:
    the first run on shards, the second on owners); an empty segment is one empty part."""
    runs: list[list[tuple[str, Transform]]] = []
    for link in links:
        if runs and runs[-1][-1][1].elementwise == link[1].elementwise:
            runs[-1].append(link)
        else:
            runs.append([link])
    return runs or [[]]


def _check_guard_position(guard: Transform, before: list[tuple[str, Transform]]) -> None:
    """A guard decides to skip a step after the links before it ran: they may keep no state."""
    stateful = [t for _, t in before if t.state or "advance" in t.hooks or t.moves_point]
    if stateful:
        raise ValueError(f"{guard!r} skips whole steps, but comes after {stateful[0]!r}, which keeps state that a"
                         " skipped step would already have changed (or moves the parameters); put the guard first in"
                         " the chain")


def combine(ops: Mapping[str, str], parts: list[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The step's totals of each statistic from every bucket's parts, by its op, in float64 (a bucket
    that has no part for a statistic does not run the link that reduces it)."""
    totals: dict[str, Tensor] = {}
    for name in dict.fromkeys(k for part in parts for k in part):
        values = torch.stack([part[name].to(torch.float64).reshape(()) for part in parts if name in part])
        op = ops[name]
        totals[name] = values.sum() if op == "sum" else values.amax() if op == "max" else values.any().double()
    return totals


def skips(ops: Mapping[str, str], totals: Mapping[str, Tensor]) -> bool:
    """Whether a guard's total says to skip the step: one host synchronization, only when a guard ran."""
    flags = [totals[name] for name, op in ops.items() if op == "skip" and name in totals]
    return bool(torch.stack(flags).any()) if flags else False


def _keys(links, attribute: str = "state") -> list[str]:
    return [f"{namespace}.{k}" if namespace else k for namespace, t in links for k in getattr(t, attribute)]
