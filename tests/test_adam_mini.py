"""AdamMini equals the authors' adam-mini (``Adam_mini`` 1.1.1) step by step on a small transformer whose
names it recognizes (embedding, per-head queries and keys with grouped keys, values, attention output,
MLP, norms, biases, output head), and its blocks are the ones the paper describes."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import gradwise
from tests.test_parity import assert_trajectories_close, default_dtype

DIM, HEADS, KV_HEADS, VOCAB = 16, 4, 2, 11
STEPS = 40


class TinyTransformer(nn.Module):
    """One pre-norm block of causal self-attention with grouped keys and values, and an MLP."""

    def __init__(self):
        super().__init__()
        head = DIM // HEADS
        self.embed = nn.Embedding(VOCAB, DIM)
        self.attn_norm = nn.LayerNorm(DIM)
        self.q_proj = nn.Linear(DIM, DIM, bias=False)
        self.k_proj = nn.Linear(DIM, KV_HEADS * head, bias=False)
        self.v_proj = nn.Linear(DIM, KV_HEADS * head, bias=False)
        self.o_proj = nn.Linear(DIM, DIM, bias=False)
        self.ffn_norm = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        b, t = tokens.shape
        head = DIM // HEADS
        x = self.embed(tokens)
        h = self.attn_norm(x)
        q = self.q_proj(h).view(b, t, HEADS, head).transpose(1, 2)
        k = self.k_proj(h).view(b, t, KV_HEADS, head).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = self.v_proj(h).view(b, t, KV_HEADS, head).transpose(1, 2).repeat_interleave(HEADS // KV_HEADS, dim=1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, DIM))
        x = x + self.mlp(self.ffn_norm(x))
        return self.lm_head(x)


def _model(dtype):
    torch.manual_seed(0)
    return TinyTransformer().to(dtype)


def _train(model, optimizer, dtype, steps=STEPS):
    trajectory = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, VOCAB, (4, 7), generator=gen)
        optimizer.zero_grad()
        logits = model(tokens[:, :-1])
        nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
        optimizer.step()
        trajectory.append([p.detach().clone() for p in model.parameters()])
    return trajectory


KWARGS = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_matches_adam_mini(dtype):
    from adam_mini import Adam_mini

    model = _model(dtype)
    ours = _train(model, gradwise.AdamMini(model.named_parameters(), compile=False, **KWARGS), dtype)
    reference = _model(dtype)
    with default_dtype(dtype):
        theirs = _train(reference, Adam_mini(reference.named_parameters(), verbose=False, **KWARGS), dtype)
    assert_trajectories_close(ours, theirs, dtype)


def test_blocks_follow_the_paper():
    model = _model(torch.float32)
    opt = gradwise.AdamMini(model.named_parameters(), compile=False, **KWARGS)
    blocks = {name: g["blocks"] for g in opt.param_groups for name in g["param_names"]}
    decay = {name: g["weight_decay"] for g in opt.param_groups for name in g["param_names"]}
    head = DIM * DIM // HEADS
    assert blocks["q_proj.weight"] == blocks["k_proj.weight"] == head
    row_blocked = ("embed.weight", "v_proj.weight", "o_proj.weight", "mlp.0.weight", "lm_head.weight")
    assert {blocks[n] for n in row_blocked} == {"row"}
    assert blocks["mlp.0.bias"] == "element" and blocks["attn_norm.weight"] == "tensor"
    assert decay["attn_norm.weight"] == decay["mlp.0.bias"] == 0.0 and decay["q_proj.weight"] == 0.1
    _train(model, opt, torch.float32, steps=1)
    second = {n: opt.state[p]["adam_mini.exp_avg_sq"].shape for n, p in model.named_parameters()}
    assert second["q_proj.weight"] == (HEADS,) and second["k_proj.weight"] == (KV_HEADS,)
    assert second["embed.weight"] == (VOCAB,) and second["mlp.0.weight"] == (2 * DIM,)
    assert second["attn_norm.weight"] == (1,) and second["mlp.0.bias"] == (2 * DIM,)


def test_unnamed_parameters_go_by_shape_and_groups_may_set_blocks():
    a, b, c = (torch.randn(s).requires_grad_() for s in [(6, 5), (5,), (4, 3)])
    opt = gradwise.AdamMini([{"params": [a, b]}, {"params": [c], "blocks": 4}], compile=False)
    for p in (a, b, c):
        p.grad = torch.randn_like(p)
    opt.step()
    assert [opt.state[p]["adam_mini.exp_avg_sq"].shape for p in (a, b, c)] == [(6,), (1,), (3,)]


def test_state_is_small_and_estimated():
    model = _model(torch.float32)
    estimate = gradwise.estimate(model, gradwise.AdamMini, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS)
    params = sum(p.numel() for p in model.parameters())
    biases = sum(p.numel() for n, p in model.named_parameters() if "bias" in n)
    opt = gradwise.AdamMini(model.named_parameters(), compile=False, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS)
    _train(model, opt, torch.float32, steps=1)
    allocated = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values())
    assert estimate.total == allocated
    # a first moment per element; the second moment is per element only for biases
    assert params * 4 + biases * 4 < estimate.total < params * 4 + biases * 4 + 200 * 4


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_heads=3), r"n_heads=3: dim \* dim = 256 must divide"),
    (dict(n_kv_heads=3), r"n_kv_heads=3: expected a divisor of n_heads=4"),
    (dict(dim=0), r"dim=0: expected an integer >= 1"),
    (dict(lr=-1.0), r"lr=-1\.0: expected a finite number >= 0"),
    (dict(betas=(0.9, 1.0)), r"betas\[1\]=1\.0 .*\[0, 1\)"),
    (dict(eps=0.0), r"eps=0\.0: expected a finite number > 0"),
    (dict(rule=lambda name, p: "columns"), r"blocks for parameter 'embed.weight'='columns'"),
    (dict(rule=lambda name, p: 7), r"blocks=7 for parameter 'embed.weight' of shape \(11, 16\)"),
])
def test_bad_input_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gradwise.AdamMini(_model(torch.float32).named_parameters(), **{"dim": DIM, "n_heads": HEADS, **kwargs})


def test_fsdp2_refuses_whole_row_blocks():
    assert not gradwise.AdamMini([torch.zeros(2, 2, requires_grad=True)]).transform.elementwise
