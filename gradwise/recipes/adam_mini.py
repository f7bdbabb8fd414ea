"""Adam-mini, with the partition of the authors' adam-mini where parameters are named."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from gradwise.core.hyper import positive_int
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms.adam_mini import by_shape, scale_by_adam_mini
from gradwise.transforms.learning_rate import scale_by_learning_rate
from gradwise.transforms.weight_decay import add_decayed_weights

#: adam-mini 1.1.1's name fragments (matched in the lowercased parameter name)
QUERY_KEY = ("k_proj", "q_proj", "wq", "wk", "query", "key")
ROWS = ("embed", "embd", "wte", "lm_head", "output", "final_layer", "v_proj", "wv", "value", "o_proj", "wo",
        "attn.proj", "feed_forward", "linear", "mlp")
NO_DECAY = ("norm", "ln", "bias")


@dataclass(frozen=True)
class ByName:
    """AdamMini's default rule (see there): a block per head of ``head_numel`` elements for queries and
    keys, per row for the matrices named in ``ROWS``, per element for biases; by shape otherwise.
    A class rather than a closure, so the optimizer pickles."""

    head_numel: int

    def __call__(self, name: str | None, param: Tensor) -> Any:
        if name is None:
            return by_shape(name, param)
        name = name.lower()
        if "bias" in name:
            return "element"
        if any(word in name for word in QUERY_KEY):
            return self.head_numel
        if param.dim() >= 2 and any(word in name for word in ROWS):
            return "row"
        return by_shape(name, param)


def no_decay(name: str) -> bool:
    """Whether AdamMini leaves the named parameter undecayed (``NO_DECAY``), as adam-mini does."""
    return any(word in name.lower() for word in NO_DECAY)


class AdamMini(Optimizer):
    """Adam-mini (Zhang et al., 2024, arXiv:2406.16793): AdamW whose second moment is one number per
    block of each parameter (``scale_by_adam_mini``), with adam-mini's ``Adam_mini`` arguments
    (``named_parameters``, ``dim``, ``n_heads``, ``n_kv_heads``) and defaults.

    Blocks, by ``rule(name, param)``; the default follows adam-mini where parameters are named:
    ``bias`` -> every element (Adam); queries and keys (``q_proj``, ``wq``, ``query``, ...) -> one block
    per attention head (dim * dim / n_heads elements); embeddings, output head, values, attention
    output and MLP matrices -> one block per row (per token for embeddings and heads, per output neuron
    otherwise); anything else -> one block per row for two or more dimensions, the whole tensor below
    (adam-mini takes the whole tensor for an unrecognized matrix too, and warns that it can be
    unstable). Unnamed parameters go by shape alone. Names holding ``norm``, ``ln`` or ``bias`` get no
    weight decay, as in adam-mini. A param group with ``"blocks"`` set keeps it for all its members.
    """

    def __init__(self, named_parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *,
                 dim=2048, n_heads=32, n_kv_heads=None, rule=None, maximize=False, skip_nonfinite=False,
                 compile="auto", state=None,
                 param_rounding="nearest"):
        positive_int("dim", dim)
        positive_int("n_heads", n_heads)
        if n_kv_heads is not None:
            positive_int("n_kv_heads", n_kv_heads)
            if n_heads % n_kv_heads:
                raise ValueError(f"invalid n_kv_heads={n_kv_heads!r}: expected a divisor of n_heads={n_heads}")
        if (dim * dim) % n_heads:
            raise ValueError(f"invalid n_heads={n_heads!r}: dim * dim = {dim * dim} must divide into n_heads blocks")
        self.dim, self.n_heads, self.n_kv_heads = dim, n_heads, n_kv_heads or n_heads
        head_numel = dim * dim // n_heads
        adam_mini = scale_by_adam_mini(rule or ByName(head_numel), no_decay=no_decay)
        super().__init__(named_parameters, chain(adam_mini, add_decayed_weights(), scale_by_learning_rate()),
                         lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize,
                         skip_nonfinite=skip_nonfinite, compile=compile, state=state,
                         param_rounding=param_rounding)
