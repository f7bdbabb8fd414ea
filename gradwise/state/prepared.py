"""What the encoded step works out for one parameter in one phase, kept for its next steps while it fits.

Before a parameter's encoded step runs (``engine.EncodedState.run``), the engine reads its state's keys
into plain and encoded buffers, finds each buffer's codec and parts, decides whether the step runs on runs
of the flat buffer (``runs.plan_runs``), finds the ``bf16`` pairs, and cuts the parameter, its plain state
and the parts into each run's tensors (``runs.cut_runs``). A training loop steps the same parameter with the
same state every time, so all of that is the same at every step: on a model of a few dozen tensors it was
about as long as the compiled step's own call. ``Prepared`` keeps it, and the next step takes it again
after checking, before anything is written, everything it was worked out from:

- the same state dict, holding the same tensor under the same keys in the same order (a buffer added,
  replaced or loaded makes it anew; ``load_state_dict`` also drops every kept one);
- the parameter and every state tensor it reads in the same memory, shape and strides (``p.data = ...``
  or an in-place ``set_`` changes them), the parameter of the same dtype, at the same position;
- the gradient (the phase's input) and the output of the same shape, strides, dtype and device, where
  each step's gradient may be a new tensor: only its runs are cut again, and the random-number inputs that
  depend on the step (the seeds, a bfloat16 parameter's rounding rows) are made at every step.

A DTensor parameter's step (its local shard a new tensor at every step, and stepped in its shape) is worked
out at every step, as before. A kept step holds its parameter weakly: one that is garbage collected (taken out
of the optimizer's groups and state) takes its kept steps, and the memory their tensors hold, with it
(``weakref.finalize``, ``engine.EncodedState._prepared``).
"""
from __future__ import annotations

import operator
import weakref

from torch import Tensor

from gradwise.core.executor import rounding_rows
from gradwise.core.params import local
from gradwise.core.phases import Phase
from gradwise.core.state_keys import layout
from gradwise.core.steady import memory_of
from gradwise.state.bf16_pairs import pairs_in
from gradwise.state.runs import cut_runs, cut_steps, plan_runs
from gradwise.state.store import local_parts


def _form(t: Tensor | None) -> tuple | None:
    """What a gradient or output must keep for the kept runs to fit it."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


class Prepared:
    """One parameter's encoded step in one phase, as worked out from its state (module docstring):
    ``specs`` (the phase's encoded buffers, as ``engine.EncodedState._specs_for``), ``plain`` (its plain
    buffers), ``parts``, and, where it steps on runs, ``runs`` (``plan_runs``), ``pairs`` and ``cuts`` (each
    run's parameter, plain state, parts and first index, ``cut_runs``); ``runs`` None: it steps in the
    parameter's shape."""

    def __init__(self, phase: Phase, specs_for, p: Tensor, state: dict[str, Tensor], position: int,
                 grad: Tensor, output: Tensor | None, keep: bool):
        wanted = frozenset(phase.state)
        self.keys = tuple(state)
        plain_keys, encoded = layout(self.keys)
        encoded = tuple((b, tag) for b, tag in encoded if b in wanted)
        self.specs = specs_for(encoded)
        self.plain = {k: local(state[k]) for k in plain_keys if k in wanted}
        self.parts = {buffer: local_parts(state, buffer, tag) for buffer, tag in encoded}
        self.runs = plan_runs(phase, self.specs, p, grad, self.plain, output) if keep else None
        self.pairs = self.cuts = None
        if self.runs is not None:
            self.pairs = pairs_in(self.specs, self.parts)
            self.cuts = list(cut_runs(self.runs, self.specs, self.pairs, p, self.plain, self.parts))
        #: what ``fits`` compares (``keep``: not a DTensor, whose step is kept at all)
        self.kept = keep
        self.state, self.position, self.values = state, position, tuple(state.values())
        self.param = weakref.ref(p)
        self.tensors = [*self.plain.values(), *(v for own in self.parts.values() for v in own.values())]
        self.memory = memory_of([p, *self.tensors]) if keep else None
        self.dtype, self.grad, self.output = p.dtype, _form(grad), _form(output)

    def fits(self, p: Tensor, state: dict[str, Tensor], position: int, grad: Tensor, output: Tensor | None) -> bool:
        """Whether this step was worked out from these: the same state and memory (module docstring)."""
        return (self.kept and state is self.state and position == self.position and p is self.param()
                and p.dtype == self.dtype and len(state) == len(self.keys)
                and all(map(operator.is_, map(state.get, self.keys), self.values))
                and _form(grad) == self.grad and _form(output) == self.output
                and memory_of([p, *self.tensors]) == self.memory)

    def run_arguments(self, grad: Tensor, rounding_seed: int | None, output: Tensor | None):
        """``step_run``'s tensors for each run at this step: ``(param, grad, plain, parts, start, rounding,
        output)``, the kept cuts with this step's gradient, rounding rows and output."""
        for (param, plain, parts, start), (run_grad, run_output), (first, _, _) in zip(
                self.cuts, cut_steps(self.runs, grad, output), self.runs):
            rounding = None if rounding_seed is None else rounding_rows([rounding_seed], [first], param.device)
            yield param, run_grad, plain, parts, start, rounding, run_output
