"""Pseudo-gradients sent encoded by a gradwise state codec (``gradwise.state``), and their mean.

A codec (``"int8"``: a byte per element and a float32 scale per block of 2048, Dettmers et al.'s block-wise
quantization; ``"int4"``, ``"fp8"``, ``"bf16"``, or a tag such as ``"int8-b256"``) turns a worker's flat
pseudo-gradient into a few tensors, its *parts*, sent as one byte buffer. Codes cannot be summed (an int8
sum overflows, and each worker's block has its own scale), so the workers all-gather the buffers and each
decodes every worker's and sums the decoded values in rank order, in the parameters' dtype::

    mean = (decode(payload_0) + decode(payload_1) + ... + decode(payload_{M-1})) / M

the same bits on every worker. Sent per worker and sync: the parts' bytes (``numel + 4 ceil(numel / 2048)``
for int8), counted once as this worker's share of the all-gather.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gradwise.state.codec import Codec


class EncodedBucket:
    """The byte layout of one bucket's encoded pseudo-gradient: ``numel`` elements, decoded to ``dtype``."""

    def __init__(self, codec: Codec, numel: int, dtype: torch.dtype) -> None:
        self.codec, self.shape, self.dtype = codec, torch.Size([numel]), dtype
        self.layout = {name: (part.shape, part.dtype) for name, part in
                       sorted(codec.empty(self.shape, True, torch.device("meta")).items())}

    def payload(self, flat: Tensor, seed: int) -> Tensor:
        """``flat`` encoded, its parts' bytes one after the other (``seed``: for stochastic rounding)."""
        parts = self.codec.empty(self.shape, True, flat.device)
        self.codec.encode(flat, parts, True, torch.tensor(seed, dtype=torch.int64, device=flat.device))
        return torch.cat([parts[name].reshape(-1).view(torch.uint8) for name in self.layout])

    def decode(self, payload: Tensor) -> Tensor:
        """The values a ``payload`` holds, flat, in ``dtype``."""
        sizes = [shape.numel() * dtype.itemsize for shape, dtype in self.layout.values()]
        parts = {name: piece.clone().view(dtype).view(shape)
                 for (name, (shape, dtype)), piece in zip(self.layout.items(), payload.split(sizes))}
        return self.codec.decode(parts, self.shape, True, self.dtype)

    def summed(self, payloads: list[Tensor]) -> Tensor:
        """Every worker's decoded values summed in rank order."""
        total = self.decode(payloads[0])
        for payload in payloads[1:]:
            total = total + self.decode(payload)
        return total
