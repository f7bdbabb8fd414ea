"""``gradwise.qk_clip`` rescales the heads' query and key rows as pytorch-optimizer 4.1.0's ``MuonClip`` does
after its step (run here with lr=0, so that its step is the clip alone), and refuses bad input unchanged."""
from __future__ import annotations

import pytest
import torch
from pytorch_optimizer import MuonClip

import gradwise

HEADS, HEAD_DIM, MODEL = 4, 3, 10


def _projections():
    gen = torch.Generator().manual_seed(0)
    return {role: torch.randn(HEADS * HEAD_DIM, MODEL, generator=gen, dtype=torch.float64)
            for role in ("query", "key", "query_rotary", "key_rotary")}


@pytest.mark.parametrize("alpha", [0.5, 0.2])
def test_matches_pytorch_optimizers_muonclip(alpha):
    logits = torch.tensor([3.0, 150.0, 100.0, 4000.0])  # below, above, at the threshold, far above
    ours, theirs = _projections(), _projections()
    scales = gradwise.qk_clip(logits, query=ours["query"], key=[ours["key"]], query_rotary=ours["query_rotary"],
                              alpha=alpha)
    params = {role: p.requires_grad_() for role, p in theirs.items()}
    reference = MuonClip([{"params": [p], "use_muon": True, "attention_name": "attn", "qk_clip": role}
                          for role, p in params.items()], lr=0.0, qk_clip_alpha=alpha)
    for p in params.values():
        p.grad = torch.zeros_like(p)
    reference.step(attention_max_logits={"attn": logits})
    for role in ours:
        torch.testing.assert_close(ours[role], params[role].detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(scales, torch.tensor([1.0, 100 / 150, 1.0, 100 / 4000]))
    assert torch.equal(ours["key_rotary"], _projections()["key_rotary"])  # the shared rotary key is not clipped
    assert not torch.equal(ours["query"], _projections()["query"])


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(max_logits=torch.ones(4), threshold=0.0), ValueError, "threshold=0.0"),
    (dict(max_logits=torch.ones(4), alpha=1.5), ValueError, "alpha=1.5"),
    (dict(max_logits=torch.ones(2, 2)), ValueError, "a non-empty 1-d tensor"),
    (dict(max_logits=torch.tensor([1.0, float("nan"), 1.0, 1.0])), ValueError, "finite"),
    (dict(max_logits=torch.ones(5)), ValueError, r"query\[0\] of shape \(12, 10\).*5 heads"),
    (dict(max_logits=torch.ones(4), query_rotary=[3.0]), TypeError, r"query_rotary\[0\] of type float"),
])
def test_bad_input_is_refused_before_any_write(kwargs, error, text):
    ours = _projections()
    with pytest.raises(error, match=text):
        gradwise.qk_clip(**{"query": ours["query"], "key": ours["key"], **kwargs})
    assert all(torch.equal(ours[r], p) for r, p in _projections().items())
