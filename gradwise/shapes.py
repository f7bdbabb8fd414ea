"""GPT-2-shaped parameter sets: the names and shapes ``gradwise estimate`` and the benchmarks build on."""
from __future__ import annotations

#: GPT-2 shapes: vocab, context, width, blocks. "25m" is named for its blocks; its real count is printed.
SIZES = {
    "tiny": (1000, 64, 64, 2),
    "25m": (50257, 1024, 384, 6),
    "124m": (50257, 1024, 768, 12),
}
#: the sets ``gradwise estimate`` takes, on meta tensors: SIZES and a GPT-2 as wide and deep as a 7B model
#: (LLaMA-7B's 4096 x 32 blocks, 2048 positions; its real count, 6.7B, is printed), too large to benchmark
ESTIMATE_SIZES = {**SIZES, "7b": (50257, 2048, 4096, 32)}


def gpt2_shapes(vocab: int, context: int, width: int, blocks: int) -> list[tuple[str, tuple[int, ...]]]:
    """The parameter names and shapes of a GPT-2 model (lm_head tied to wte, as in GPT-2)."""
    out = [("wte", (vocab, width)), ("wpe", (context, width))]
    for i in range(blocks):
        for name, shape in (
            ("ln_1.weight", (width,)), ("ln_1.bias", (width,)),
            ("attn.c_attn.weight", (width, 3 * width)), ("attn.c_attn.bias", (3 * width,)),
            ("attn.c_proj.weight", (width, width)), ("attn.c_proj.bias", (width,)),
            ("ln_2.weight", (width,)), ("ln_2.bias", (width,)),
            ("mlp.c_fc.weight", (width, 4 * width)), ("mlp.c_fc.bias", (4 * width,)),
            ("mlp.c_proj.weight", (4 * width, width)), ("mlp.c_proj.bias", (width,)),
        ):
            out.append((f"h.{i}.{name}", shape))
    return out + [("ln_f.weight", (width,)), ("ln_f.bias", (width,))]


def gpt2_parameters(size: str) -> list:
    """The ``size`` set (``SIZES``) as parameters drawn N(0, 0.02), each with a fixed gradient drawn N(0, 1e-3), in
    ``gpt2_shapes``' order from one generator seeded 0: the set ``bench/compile_time.py`` and ``bench/graph_calls.py``
    step."""
    import torch

    generator = torch.Generator().manual_seed(0)
    out = []
    for _, shape in gpt2_shapes(*SIZES[size]):
        p = torch.nn.Parameter(torch.randn(shape, generator=generator) * 0.02)
        p.grad = torch.randn(shape, generator=generator) * 1e-3
        out.append(p)
    return out
