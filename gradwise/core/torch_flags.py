"""torch.optim's implementation keywords (``foreach``, ``fused``, ``differentiable``, ``capturable``),
mapped onto gradwise's engine, so that a recipe accepts every keyword its torch counterpart takes.

- ``foreach``: None, True or False, no effect: the eager path is already list (foreach-style) code,
  and the engine picks eager or compiled by ``compile``.
- ``fused=True``: a one-pass fused step at any size: torch's own fused kernel where the recipe's step
  ends in a link that names one (Adam's and AdamW's ``torch._fused_adamw_``, SGD's ``torch._fused_sgd_``)
  and every parameter is a CPU float32 or float64 tensor in plain state, as torch.optim's ``fused=True``
  runs it; else the compiled path (``compile=True``), gradwise's one-pass fused step. It contradicts an
  explicit ``compile=False``. ``fused=None`` or ``False``: no effect (``compile`` decides).
- ``differentiable=True``: refused: the step runs under ``torch.no_grad`` and writes in place, so no
  graph runs through it. ``capturable=True``: refused: step counts live on the CPU and the per-step
  constants are computed in Python, which a CUDA graph cannot capture. Both accept False.
"""
from __future__ import annotations

from typing import Any


def _flag(recipe: str, name: str, value: Any, none_ok: bool) -> None:
    if not (isinstance(value, bool) or (none_ok and value is None)):
        allowed = "None, True or False" if none_ok else "True or False"
        raise TypeError(f"{recipe}(): invalid {name}={value!r}: expected {allowed}")


def compile_for_torch_flags(recipe: str, compile: bool | str, *, foreach: Any = None, fused: Any = None,
                            differentiable: Any = False, capturable: Any = False) -> bool | str:
    """Check torch's implementation keywords for ``recipe`` and return the ``compile`` setting they ask
    for (``fused=True``: True; otherwise ``compile`` unchanged)."""
    _flag(recipe, "foreach", foreach, none_ok=True)
    _flag(recipe, "fused", fused, none_ok=True)
    _flag(recipe, "differentiable", differentiable, none_ok=False)
    _flag(recipe, "capturable", capturable, none_ok=False)
    if differentiable:
        raise ValueError(f"{recipe}(): differentiable=True is not supported: gradwise steps under torch.no_grad"
                         " and updates parameters and state in place, so autograd cannot run through step();"
                         " use a torch.optim optimizer for differentiable optimization")
    if capturable:
        raise ValueError(f"{recipe}(): capturable=True is not supported: gradwise keeps step counts on the CPU and"
                         " computes per-step constants in Python, which a CUDA graph cannot capture;"
                         " use capturable=False (fused=True gives a one-pass fused step)")
    if fused:  # (the recipe then sets ``Optimizer.torch_kernels``: ``fused_kernels``)
        if compile is False:
            raise ValueError(f"{recipe}(): fused=True asks for a fused step (torch's kernel or the compiled graph),"
                             " which contradicts compile=False (the list ops); give one of them")
        return True
    return compile


def fused_kernels(optimizer: Any, fused: Any) -> None:
    """After a recipe's construction: ``fused=True`` lets its step run torch's fused kernel where it has
    one (``Optimizer.torch_kernels``), as ``compile="auto"`` does."""
    optimizer.torch_kernels = optimizer.torch_kernels or fused is True
