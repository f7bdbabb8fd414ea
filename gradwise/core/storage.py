"""Where an optimizer keeps its state buffers between steps: the protocol, and its float32 default.

The optimizer (``optimizer.storage``) calls a storage at these points and knows nothing else about
formats:

- ``check(param_groups)``, once the groups exist (a policy's name rules must match a parameter);
- ``init(state, fresh, p, name, position)``: store a parameter's fresh buffers (those it lacks);
- ``is_encoded(state)``, then ``run(phase, params, inputs, states, positions, values, layout, static,
  compiled, fall_back, outputs)`` for the parameters whose state is encoded: one phase of their step
  (``core/phases.py``), returning the parts of the next phase's reductions;
- ``decoded(state, p)``: a parameter's buffers as float tensors, for reading;
- ``expected_parts(tag, shape, signed, param)`` (the meta tensors a buffer encoded as ``tag`` is made
  of, for ``param``: a checkpoint is checked against them) and ``after_load(optimizer, state_dict)``: loading;
- ``compile_stats``: ``(graphs, seconds, loaded)`` that ``run`` compiled (or loaded from the disk store, counted in
  ``graphs`` too);
- ``traffic``: set by the optimizer, where the collectives the storage runs are counted (encoding a
  sharded parameter's state may all-reduce block maxima: ``core/collectives.py``);
- ``policy``: the ``state=`` it was built from (``None``: float32). A copy or a pickle of the
  optimizer builds its storage afresh from it (compiled graphs are not copied).

``PlainStorage`` keeps every buffer as the chain computes it. Encoded formats (``gradwise.state``: bf16,
int8, int4) live in a layer above core, which plugs its storage in with ``register_storage``;
``gradwise/__init__`` does so, so ``Optimizer(..., state="int8")`` works and core never imports state.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from gradwise.core.params import local
from gradwise.core.state_keys import MARK, has_buffer
from gradwise.core.transform import Transform

#: ``factory(state, transform)``: the storage for a ``state=`` that is not None; with ``None``, one that
#: keeps float32 and reads encoded checkpoints.
StorageFactory = Callable[[Any, Transform], Any]

#: filled by ``register_storage`` when the package (``gradwise/__init__``, above every layer) is imported
_registered: dict[str, Callable] = {}


def register_storage(factory: StorageFactory, offered_by: Callable[[], list[str]]) -> None:
    """Plug in the storage of encoded state: ``factory`` builds it; ``offered_by()`` names the optimizers
    that take ``state=``, for the errors that refuse it."""
    _registered.update(factory=factory, offered_by=offered_by)


def storage_for(state: Any, transform: Transform) -> Any:
    """The storage for an optimizer's ``state=`` argument: ``PlainStorage`` for ``None``, else the
    registered one."""
    return PlainStorage(transform) if state is None else _registered["factory"](state, transform)


def optimizers_taking_state() -> list[str]:
    """The names of the optimizers that take ``state=`` (as the registered storage says)."""
    return _registered["offered_by"]()


class PlainStorage:
    """Every buffer stored as the chain computes it (float32, or what ``init`` chose). An encoded
    checkpoint loads into it through the registered storage, decoded to float32 buffers. It has no
    ``run``: nothing it holds is encoded."""

    policy = None
    compile_stats = (0, 0.0, 0)
    traffic = None  # it runs no collective

    def __init__(self, transform: Transform):
        self.transform = transform
        self._reader = None

    def __reduce__(self):
        return (PlainStorage, (self.transform,))

    def check(self, param_groups: list[dict[str, Any]]) -> None:
        """Nothing to check: every parameter is stored alike."""

    def init(self, state: dict[str, Tensor], fresh: Mapping[str, Tensor], p: Tensor, name: str | None,
             position: int) -> None:
        for buffer, value in fresh.items():
            if not has_buffer(state, buffer):
                state[buffer] = value

    @staticmethod
    def is_encoded(state: Mapping[str, Tensor]) -> bool:
        return False

    def decoded(self, state: Mapping[str, Tensor], p: Tensor) -> dict[str, Tensor]:
        return {k: local(v) for k, v in state.items() if k != "step"}

    def expected_parts(self, tag: str, shape: torch.Size, signed: bool, param: Tensor | None = None
                       ) -> dict[str, Tensor]:
        return self._encoded_reader().expected_parts(tag, shape, signed, param)

    def after_load(self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
        """A checkpoint with encoded buffers: each decoded into a float buffer; else nothing to do."""
        if any(MARK in key for saved in state_dict["state"].values() for key in saved):
            self._encoded_reader().after_load(optimizer, state_dict)

    def _encoded_reader(self):
        if self._reader is None:
            self._reader = _registered["factory"](None, self.transform)
        return self._reader
