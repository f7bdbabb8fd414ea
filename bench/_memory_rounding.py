"""How far bfloat16 parameters drift from float32 training, written with round-to-nearest or with
stochastic rounding (``param_rounding``): AdamW on a small MLP regression, the same initial weights
(rounded to bfloat16) and batches for each. Printed: the distance of the final parameters to float32's,
relative to how far float32's moved, and the final loss on a held-out batch against float32's.
Run with ``python bench/memory.py --param-rounding``.
"""
from __future__ import annotations


def _mlp(seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def _batch(step: int):
    import torch

    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1000 + step))
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def train(dtype, rounding: str, seed: int, steps: int, lr: float):
    """The final parameters (as float32) and the held-out loss of one run."""
    import torch

    import gradwise

    model = _mlp(seed).to(dtype)
    optimizer = gradwise.AdamW(model.parameters(), lr=lr, param_rounding=rounding, compile=False)
    for step in range(steps):
        x, y = _batch(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).backward()
        optimizer.step()
    x, y = _batch(10**6)
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).item()
    return [p.detach().float() for p in model.parameters()], loss


def compare(seeds=(0, 1, 2), steps: int = 300, lr: float = 3e-4, log=print) -> list[dict]:
    import torch

    def distance(a, b):
        return float(sum(((x - y) ** 2).sum() for x, y in zip(a, b)).sqrt())

    rows = []
    for seed in seeds:
        log(f"param rounding: seed {seed}")
        start = [p.detach().float() for p in _mlp(seed).parameters()]
        fp32, fp32_loss = train(torch.float32, "nearest", seed, steps, lr)
        for rounding in ("nearest", "stochastic"):
            params, loss = train(torch.bfloat16, rounding, seed, steps, lr)
            rows.append({"seed": seed, "rounding": rounding, "drift": distance(params, fp32) / distance(fp32, start),
                         "loss": loss, "loss_vs_fp32": loss / fp32_loss})
    return rows


def print_table(rows: list[dict], steps: int = 300, lr: float = 3e-4) -> None:
    import statistics

    print(f"\nbfloat16 parameters, AdamW lr {lr}, {steps} steps, MLP 8-64-64-1: distance to float32's parameters"
          " / float32's distance moved, and held-out loss / float32's (mean over seeds)")
    print(f"{'param_rounding':<16}{'drift':>10}{'loss/fp32':>12}   per seed (drift)")
    for rounding in ("nearest", "stochastic"):
        mine = [r for r in rows if r["rounding"] == rounding]
        print(f"{rounding:<16}{statistics.fmean(r['drift'] for r in mine):>10.3f}"
              f"{statistics.fmean(r['loss_vs_fp32'] for r in mine):>12.4f}   {[round(r['drift'], 3) for r in mine]}")
