"""Full-width loads of the 8-bit codes in inductor's AVX2 kernels (the ``int8`` and ``fp8`` states).

Inductor's CPU backend vectorizes a loop of float32 work 8 lanes wide on AVX2 and loads any other dtype 8
elements at a time: for 8-bit codes, 8 of a 32-byte vector's lanes, which it asks of ATen as
``Vectorized<uint8_t>::loadu(ptr, 8)``. That call's AVX2 form has no fast path for a partial count: it fills
a stack buffer with ones, copies the 8 bytes into it and loads it back, a store-forwarding stall each load
(its AVX-512 form, for 16 of 64 lanes, loads the 16 bytes directly: ``loadu_one_fourth``). In a compiled
AdamW step with ``fp8`` state, which loads both moments' codes in each of its two passes over a block, those
loads were the step's hottest instructions (``perf annotate``). ``full_width_byte_loads`` patches the code generation
around one compile so that an 8-lane load of 8-bit elements outside a loop's tail is ``loadu_one_fourth``,
one 8-byte load, as the AVX-512 path already does. Its other lanes are undefined, as there: the kernels'
byte vectors are converted (from their low 8 lanes) or stored 8 lanes at a time (``int4``'s codes, two a
byte, are read at half the loop's index, a load of another kind: unchanged). A post-grad pass that
changes nothing puts the patch's version into inductor's cache key (``ByteLoadsKey``), so that a kernel
generated without it is not read from the cache for a graph compiled with it. Imported by the encoded step's
backend when it compiles (it imports inductor). On a torch whose code generator is not 2.13's (the method's name or
parameters differ), nothing is patched.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch
from torch._inductor import config

try:  # inductor's private code generator, as torch 2.13 has it; another torch keeps its own loads (``SUPPORTED``)
    from torch._inductor.codegen.cpp import CppVecKernel
    from torch._inductor.codegen.cpp_utils import cexpr_index
    from torch._inductor.cpu_vec_isa import VecAVX2
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_custom_graph_passes

    #: Inductor's own method, which ``_byte_load`` replaces and calls for every other load.
    _GENERATED_LOAD = CppVecKernel._get_vec_load_line
    SUPPORTED = list(inspect.signature(_GENERATED_LOAD).parameters) == ["self", "var", "index", "dtype", "load_mask"]
except (ImportError, AttributeError):
    CustomGraphPass, SUPPORTED = object, False

#: The patch's version, in inductor's cache key: change it with the generated code.
VERSION = "gradwise byte loads 1"


def _byte_load(self, var: str, index, dtype: torch.dtype, load_mask=None):
    """``CppVecKernel._get_vec_load_line`` with an 8-byte load where an AVX2 kernel loads 8 lanes of 8-bit data
    without a mask, outside the tail (where ``num_elems`` is the tail's length)."""
    if (dtype in (torch.uint8, torch.int8) and load_mask is None and self.tail_size is None
            and isinstance(self.vec_isa, VecAVX2) and self.num_elems == 8):
        address = f"{var} + {cexpr_index(index)}" if index != 0 else var
        return f"{self._get_vec_type(dtype)}::loadu_one_fourth({address})"
    return _GENERATED_LOAD(self, var, index, dtype, load_mask)


class ByteLoadsKey(CustomGraphPass):
    """A post-grad pass that leaves the graph as it is; its ``uuid`` is ``VERSION``, so inductor's FX graph cache
    keys the graphs compiled with ``full_width_byte_loads`` apart from the others."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self) -> str:
        return VERSION


@contextlib.contextmanager
def full_width_byte_loads() -> Iterator[None]:
    """Generate the CPU kernels compiled inside the block with full-width 8-bit loads (the module's docstring).
    The code generator's method is patched for the block's duration (a compile in another thread meanwhile gets
    the same loads); the method and settings in place before it are restored after it (nested, the inner block
    changes nothing; without ``SUPPORTED``, nothing)."""
    if not SUPPORTED or CppVecKernel._get_vec_load_line is _byte_load:
        yield
        return
    passes = [*get_custom_graph_passes(config.post_grad_custom_post_pass), ByteLoadsKey()]
    before = CppVecKernel._get_vec_load_line
    CppVecKernel._get_vec_load_line = _byte_load
    try:
        with config.patch(post_grad_custom_post_pass=passes):
            yield
    finally:
        CppVecKernel._get_vec_load_line = before
