"""Memory-lean optimizer state: codecs that store any state buffer in bf16, int8, int4 or fp8, and the
policy that picks one per parameter. Orthogonal to the update rule: transforms see float tensors.

    AdamW(model.parameters(), lr=3e-4, state="int8")
    AdamW(model.named_parameters(), state=StatePolicy("int4", rules={"wte|wpe": "fp32"}))
"""
from gradwise.state.bf16 import BF16
from gradwise.state.codec import Codec, codec_from
from gradwise.state.float8 import Fp8
from gradwise.state.integer import Int4, Int8
from gradwise.state.policy import StatePolicy

__all__ = ["BF16", "Codec", "Fp8", "Int4", "Int8", "StatePolicy", "codec_from"]
