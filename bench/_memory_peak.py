"""Peak process memory of one training step of a small transformer, with and without updating the
parameters inside backward (``gradwise.fused_backward``).

Each configuration runs in a fresh subprocess: build the model and optimizer, take two warm-up steps
(the optimizer state exists from then on), reset the resident-set high-water mark (writing "5" to
``/proc/self/clear_refs`` resets VmHWM to the current RSS), take one step, and read VmHWM from
``/proc/self/status``. The step's peak is VmHWM minus the RSS just before it. The subprocesses run with
``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc maps every tensor of 64 KiB or more on its own and unmaps
it when freed: RSS then follows the live tensors instead of what the allocator keeps for reuse.
Torch's own ``torch.optim.AdamW`` (stepped after backward) is the first row, and every row's ratio is
against it. Linux only (``/proc``). Run with ``python bench/memory.py --peak``.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

#: name: (optimizer, keyword arguments, update inside backward)
CONFIGS = {
    "torch AdamW, step()": ("torch.AdamW", {}, False),
    "AdamW, step()": ("AdamW", {}, False),
    "AdamW, fused_backward": ("AdamW", {}, True),
    "AdaLomo, step()": ("AdaLomo", {"fused_backward": False}, False),
    "AdaLomo, in backward": ("AdaLomo", {}, True),
    "LOMO, step()": ("LOMO", {"fused_backward": False}, False),
    "LOMO, in backward": ("LOMO", {}, True),
}
#: the transformer: vocabulary, context, width, blocks, heads; and the batch (sequences x tokens).
MODEL = dict(vocab=4096, context=64, width=384, blocks=4, heads=6)
BATCH = (4, 64)
#: each configuration runs as ``python -m bench._memory_peak NAME`` from the repository's root
ROOT = Path(__file__).resolve().parents[1]


def small_transformer(vocab: int, context: int, width: int, blocks: int, heads: int):
    """A GPT-style causal language model (pre-norm blocks, head tied to the token embedding)."""
    import torch
    from torch import nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
            layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
            self.ln_f = nn.LayerNorm(width)

        def forward(self, tokens):
            n = tokens.shape[1]
            x = self.wte(tokens) + self.wpe(torch.arange(n))
            mask = nn.Transformer.generate_square_subsequent_mask(n)
            return self.ln_f(self.blocks(x, mask=mask, is_causal=True)) @ self.wte.weight.t()

    torch.manual_seed(0)
    return Model()


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def measure(name: str, model_shape: dict | None = None) -> dict:
    """Run in the subprocess: the configuration's step, measured (``model_shape``: ``MODEL`` by default)."""
    import gc

    import torch

    import gradwise

    recipe, kwargs, fused = CONFIGS[name]
    shape = model_shape or MODEL
    model = small_transformer(**shape)
    params = list(model.parameters())
    if recipe == "torch.AdamW":
        optimizer = torch.optim.AdamW(params, lr=1e-3)
    else:
        optimizer = getattr(gradwise, recipe)(params, lr=1e-3, compile=False, **kwargs)
        if fused and recipe == "AdamW":
            gradwise.fused_backward(optimizer)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(shape["vocab"], (BATCH[0], min(BATCH[1], shape["context"]) + 1), generator=gen)

    def step():
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, shape["vocab"]), tokens[:, 1:].reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    step()
    gc.collect()
    before = _kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    step()
    peak = _kib("VmHWM")
    return {"params": sum(p.numel() for p in params), "rss_before_kib": before, "hwm_kib": peak,
            "step_peak_kib": peak - before}


def run_all(log=print) -> list[dict]:
    rows = []
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    for name in CONFIGS:
        log(f"peak memory: {name}")
        out = subprocess.run([sys.executable, "-m", "bench._memory_peak", name], cwd=ROOT, env=env, check=True,
                             capture_output=True, text=True).stdout
        rows.append({"config": name, **json.loads(out.strip().splitlines()[-1])})
    base = rows[0]
    for r in rows:
        r["hwm_vs_torch"] = r["hwm_kib"] / base["hwm_kib"]
        r["step_vs_torch"] = r["step_peak_kib"] / base["step_peak_kib"]
    return rows


def print_table(rows: list[dict]) -> None:
    n = rows[0]["params"]
    print(f"\nPeak memory of one training step, small transformer ({n / 1e6:.1f}M parameters, "
          f"{n * 4 / 2**20:.1f} MiB of float32 gradients), batch {BATCH[0]}x{BATCH[1]} tokens, fresh process each")
    print(f"{'configuration':<24}{'RSS before MiB':>16}{'peak RSS MiB':>14}{'step peak MiB':>15}"
          f"{'peak/torch':>12}{'step/torch':>12}")
    for r in rows:
        print(f"{r['config']:<24}{r['rss_before_kib'] / 1024:>16.1f}{r['hwm_kib'] / 1024:>14.1f}"
              f"{r['step_peak_kib'] / 1024:>15.1f}{r['hwm_vs_torch']:>12.3f}{r['step_vs_torch']:>12.3f}")


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    print(json.dumps(measure(sys.argv[1])))
