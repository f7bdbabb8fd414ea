"""What each state format costs the recipes whose step amplifies small state errors (Muon, NorMuon,
Shampoo, SOAP, KLSOAP), next to AdamW: held-out loss after 150 steps on a 64-96-8 regression MLP (tanh), mean of 3
seeds, relative to float32 state. The same task as ``tests/test_state_optimizer.py``'s loss check.
Run with ``python bench/memory.py --recipe-quality --formats '' --quality-formats ''``.
"""
from __future__ import annotations

#: (recipe, hyperparameters): the test registry's settings.
RECIPES = {
    "AdamW": {"lr": 0.01, "betas": (0.9, 0.95), "weight_decay": 0.1},
    "Muon": {"lr": 0.02, "adamw_lr": 1e-3},
    "NorMuon": {"lr": 0.02, "adamw_lr": 1e-3, "weight_decay": 0.1},
    "Shampoo": {"lr": 0.01, "precondition_frequency": 2, "max_preconditioner_dim": 8},
    "SOAP": {"lr": 0.01, "precondition_frequency": 2, "max_precond_dim": 8},
    "KLSOAP": {"lr": 0.01, "precondition_frequency": 2, "max_precond_dim": 8},
}
FORMATS = (None, "bf16", "int8", "int4")


def held_out_loss(recipe: str, state, seed: int, steps: int = 150) -> float:
    import torch

    import gradwise

    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 8))
    opt = getattr(gradwise, recipe)(list(net.parameters()), compile=False, state=state, **RECIPES[recipe])
    for step in range(steps):
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1000 * seed + step))
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), torch.sin(x[:, :8])).backward()
        opt.step()
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        return torch.nn.functional.mse_loss(net(x), torch.sin(x[:, :8])).item()


def compare(seeds=(0, 1, 2), log=print) -> list[dict]:
    rows = []
    for recipe in RECIPES:
        log(f"recipe quality: {recipe}")
        losses = {state: sum(held_out_loss(recipe, state, s) for s in seeds) / len(seeds) for state in FORMATS}
        rows.append({"recipe": recipe, "fp32": losses[None],
                     **{state: losses[state] / losses[None] for state in FORMATS[1:]}})
    return rows


def print_table(rows: list[dict]) -> None:
    print("\nHeld-out loss after 150 steps, 64-96-8 MLP, mean of 3 seeds: float32 state, and each format's over it")
    print(f"{'recipe':<10}{'fp32':>10}" + "".join(f"{s:>8}" for s in FORMATS[1:]))
    for r in rows:
        print(f"{r['recipe']:<10}{r['fp32']:>10.4f}" + "".join(f"{r[s]:>8.3f}" for s in FORMATS[1:]))
