"""What the GaLore and APOLLO tests share: a small MLP whose two hidden matrices are projected (one
tall, one wide, so both sides are exercised) and a training loop that records every step."""
from __future__ import annotations

import io

import torch
from torch import nn

STEPS = 25
#: refreshes (GaLore's SVD, APOLLO's redraw) at steps 1, 8, 15 and 22: three after the first.
GAP = 7


def model(dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 1)).to(dtype)


def groups(net: nn.Sequential, **projection) -> list[dict]:
    """The hidden matrices (16 x 8 and 12 x 16) in a group carrying ``projection``; the rest plain."""
    matrices = [net[0].weight, net[2].weight]
    others = [p for p in net.parameters() if all(p is not m for m in matrices)]
    return [{"params": others}, {"params": matrices, **projection}]


def batch(step: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 8, generator=gen, dtype=dtype)
    return x, torch.sin(3 * x[:, :1]) + x[:, 1:2] * x[:, 2:3]


def train(net: nn.Module, optimizer, steps: int = STEPS, first: int = 0) -> list[list[torch.Tensor]]:
    """Train on a fixed regression stream; the parameters after every step."""
    dtype = next(net.parameters()).dtype
    trajectory = []
    for step in range(first, first + steps):
        x, y = batch(step, dtype)
        optimizer.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
        trajectory.append([p.detach().clone() for p in net.parameters()])
    return trajectory


def max_difference(ours, theirs) -> float:
    return max((a - b).abs().max().item() for x, y in zip(ours, theirs) for a, b in zip(x, y))


def assert_resumes_bit_identically(make, steps: int = 11, more: int = 10) -> dict:
    """Train ``steps``, checkpoint model and optimizer, train ``more`` (crossing a refresh); a fresh
    model and optimizer loaded from the checkpoint must give the same parameters and state bit for bit.
    Returns the saved optimizer state_dict."""
    net = model()
    optimizer = make(net)
    train(net, optimizer, steps)
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    train(net, optimizer, more, first=steps)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed_net = model(seed=1)
    resumed_net.load_state_dict(saved["model"])
    resumed = make(resumed_net)
    resumed.load_state_dict(saved["optimizer"])
    train(resumed_net, resumed, more, first=steps)
    for (name, a), b in zip(net.named_parameters(), resumed_net.parameters()):
        assert torch.equal(a, b), f"{name} differs after resuming"
    for a, b in zip(net.parameters(), resumed_net.parameters()):
        assert optimizer.state[a].keys() == resumed.state[b].keys()
        for key, value in optimizer.state[a].items():
            assert torch.equal(value, resumed.state[b][key]) and value.dtype == resumed.state[b][key].dtype, key
    return saved["optimizer"]


def state_bytes(optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))
