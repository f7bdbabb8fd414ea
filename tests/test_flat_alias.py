"""``executor.flat_alias``: the 1-D tensors an elementwise graph takes. A plain 1-D dense gradient that is not a view
goes in as itself (no new tensor per step); anything else gets a new 1-D tensor over the same memory, never a view
(dynamo would guard on its base) and never a Parameter (dynamo keeps a Parameter's sizes static)."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise.core.ahead import GuardedGraphs
from gradwise.core.executor import flat_alias

pytestmark = pytest.mark.slow


def test_a_plain_dense_vector_is_its_own_alias():
    t = torch.randn(10)
    assert flat_alias(t) is t


@pytest.mark.parametrize("make", [
    lambda: torch.nn.Parameter(torch.randn(10)),
    lambda: torch.randn(3, 4),
    lambda: torch.randn(20)[5:15],
    lambda: torch.randn(4, 5).t().contiguous(),
    lambda: torch.randn(10, requires_grad=True),
], ids=["parameter", "matrix", "view", "transposed-then-dense", "needs-grad"])
def test_anything_else_gets_a_new_flat_tensor_over_its_memory(make):
    t = make()
    flat = flat_alias(t)
    assert flat is not t and type(flat) is torch.Tensor and flat.dim() == 1 and not flat._is_view()
    assert flat.data_ptr() == t.data_ptr() and flat.numel() == t.numel() and not flat.requires_grad
    assert torch.equal(flat, t.detach().reshape(-1))


def test_compiled_steps_take_vector_gradients_as_they_are_and_match_eager(monkeypatch):
    passed = []
    passing = GuardedGraphs._passing  # (every call's frame reaches it: the first step's and a steady step's)

    def spying(self, key, frame):
        passed.append(list(frame["inputs"]))
        return passing(self, key, frame)

    monkeypatch.setattr(GuardedGraphs, "_passing", spying)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in [(6, 5), (5,), (7,)]]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    compiled = gradwise.AdamW(params, lr=0.1, weight_decay=0.1, compile=True)
    eager = gradwise.AdamW(twins, lr=0.1, weight_decay=0.1, compile=False)
    for _ in range(3):
        for p, q in zip(params, twins):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        compiled.step()
        eager.step()
        last = passed[-1]
        assert last[1] is params[1].grad and last[2] is params[2].grad and last[0] is not params[0].grad
    for p, q in zip(params, twins):
        torch.testing.assert_close(p, q, rtol=2e-6, atol=1e-7)
    assert compiled.compile_stats["compiles"] == 1
