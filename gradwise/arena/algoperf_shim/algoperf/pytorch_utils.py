"""``pytorch_setup`` as an AlgoPerf PyTorch submission calls it (``USE_PYTORCH_DDP = pytorch_setup()[0]``).

The arena runs every trial in one process on one device, so DDP is always off: a submission then neither
all-reduces its loss nor its gradients, as in AlgoPerf on one GPU.
"""
from __future__ import annotations

from typing import Tuple

import torch


def pytorch_setup() -> Tuple[bool, int, torch.device, int]:
    """``(use_pytorch_ddp, rank, device, n_gpus)``: ``(False, 0, cpu, 0)`` for the arena's CPU workloads."""
    return False, 0, torch.device("cpu"), 0
