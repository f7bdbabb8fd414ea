"""``Context.once``: a link's per-parameter coefficients, computed from 0-d state, are computed once per compiled call,
not at every vector of the loop over a parameter's elements. Read in the C++ that inductor generated for the step
(the compiled graph's ``source_code``): each loop over a parameter's elements (its length symbolic: ``ks<i>``) holds
vector arithmetic only, no scalar conversions or products. Without ``once``, NAdam's loop divided twice in double
and Schedule-Free's converted c and multiplied four times, at every vector."""
from __future__ import annotations

import re

import pytest
import torch

import gradwise
from gradwise.core import executor
from tests.generated_code import keep_generated_code

_ELEMENT_LOOP = re.compile(r"for\(int64_t x0=static_cast<int64_t>\(0L\); x0<static_cast<int64_t>\(ks\d+\)")
_SCALAR_OP = re.compile(r"c10::convert<|= (?:float|double)\(")


def _compiled_sources(monkeypatch, optimizer_class) -> list[str]:
    """The generated code of each graph compiled for two steps of ``optimizer_class`` on two parameters (compiled
    here: none loaded from the disk store, which would not call the backend)."""
    sources = keep_generated_code(monkeypatch, executor.CompiledStep)
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in ((33, 7), (50,))]
    optimizer = optimizer_class(params, lr=1e-2, weight_decay=0.1, compile=True)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        optimizer.step()
    return sources


def _element_loops(source: str) -> list[str]:
    """The bodies of the loops over a parameter's elements (up to the next loop, or the kernel's end)."""
    starts = [m.start() for m in _ELEMENT_LOOP.finditer(source)]
    ends = [m.start() for m in re.finditer(r"for\(int64_t x0=", source)] + [source.find("''')", starts[-1])]
    return [source[start:min(e for e in ends if e > start)] for start in starts]


@pytest.mark.parametrize("optimizer_class", [gradwise.NAdamW, gradwise.ScheduleFreeAdamW])
def test_per_parameter_coefficients_are_computed_before_the_loop(monkeypatch, optimizer_class):
    sources = _compiled_sources(monkeypatch, optimizer_class)
    assert sources, "nothing compiled"
    loops = [body for source in sources for body in _element_loops(source)]
    assert len(loops) >= 2  # a graph takes executor.GROUP parameters, each its own loop
    for body in loops:
        assert "Vectorized<float>::loadu" in body  # a loop over the elements, vectorized
        assert not _SCALAR_OP.findall(body), body
