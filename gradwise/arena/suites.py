"""The two built-in suites: ``quick`` (minutes, ``make arena``) and ``full``."""
from __future__ import annotations

SUITES: dict[str, dict] = {
    "quick": {"workloads": ["digits_cnn", "lstsq_ill_conditioned", "teacher_student"],
              "optimizers": ["AdamW", "NAdamW", "Lion", "torch.AdamW"], "studies": 3},
    "full": {"workloads": ["digits_cnn", "lstsq_ill_conditioned", "teacher_student", "mnist1d_cnn",
                           "shakespeare_charlm", "shakespeare_gpt"],
             "optimizers": ["AdamW", "NAdamW", "Lion", "SGD", "torch.AdamW", "torch.NAdam"], "studies": 3},
}
