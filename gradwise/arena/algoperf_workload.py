"""An arena workload behind AlgoPerf's PyTorch ``Workload`` interface, for ``gradwise arena run --submission``.

What a submission sees, as in AlgoPerf's PyTorch workloads (mlcommons/algorithmic-efficiency v0.6,
``algoperf/spec.py``):

- ``init_model_fn(rng) -> (model, None)``: the arena's model (an ``nn.Module``, PyTorch's parameter container;
  ``rng`` is the trial's seed); the models keep no auxiliary state, so ``model_state`` is ``None``.
- ``model_fn(params, augmented_and_preprocessed_input_batch, model_state, mode, rng, update_batch_norm,
  dropout_rate) -> (logits, model_state)``: ``params(batch["inputs"])`` in train mode for
  ``ForwardPassMode.TRAIN``, in eval mode under ``torch.no_grad`` for ``EVAL``. The arena's models have neither
  dropout nor batch norm, so ``dropout_rate`` and ``update_batch_norm`` change nothing.
- ``loss_fn(label_batch, logits_batch, mask_batch=None, label_smoothing=0.0) -> {"summed", "n_valid_examples",
  "per_example"}``: per-example (per-token for the char-LM) cross-entropy with ``label_smoothing``, or squared
  error averaged over an example's outputs (``label_smoothing`` ignored, as AlgoPerf's regression losses do),
  times ``mask_batch``; ``summed / n_valid_examples`` is the arena's training loss.
- batches ``{"inputs", "targets", "weights"}`` (weights: ones shaped like ``per_example``), from the workload's
  seeded shuffle, ``batch_size`` (the submission's ``get_batch_size``) rows each.
- properties ``step_hint``, ``max_allowed_runtime_sec``, ``loss_type`` (``spec.LossType``),
  ``model_params_types`` (``spec.ParameterType`` per ``named_parameters`` name, from each parameter's module),
  ``param_shapes``, ``num_train_examples``, ``eval_batch_size``, ``target_metric_name``,
  ``validation_target_value``, ``is_output_params(key)`` and ``metrics_logger`` (None).
"""
from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any, Iterator

import torch
from torch import nn

from gradwise.arena.workloads import Workload

CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
BATCH_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def parameter_types(spec: ModuleType, model: nn.Module) -> dict[str, Any]:
    """``spec.ParameterType`` of every ``named_parameters`` entry, by the kind of module that holds it."""
    kind = spec.ParameterType
    types: dict[str, Any] = {}
    attention_out: dict[str, Any] = {}  # set after the loop: named_modules visits out_proj after its attention
    for prefix, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            key = f"{prefix}.{name}" if prefix else name
            if isinstance(module, nn.Embedding):
                types[key] = kind.EMBEDDING
            elif isinstance(module, nn.LayerNorm):
                types[key] = kind.LAYER_NORM_SCALE if name == "weight" else kind.LAYER_NORM_BIAS
            elif isinstance(module, BATCH_NORM):
                types[key] = kind.BATCH_NORM_SCALE if name == "weight" else kind.BATCH_NORM_BIAS
            elif isinstance(module, nn.MultiheadAttention):
                types[key] = kind.ATTENTION_QKV if name == "in_proj_weight" else kind.ATTENTION_BIAS
            elif isinstance(module, CONV) and name == "weight":
                types[key] = kind.CONV_WEIGHT
            else:
                types[key] = kind.BIAS if name.endswith("bias") or p.ndim == 1 else kind.WEIGHT
        if isinstance(module, nn.MultiheadAttention):  # its output projection is a Linear inside it
            out = f"{prefix}.out_proj" if prefix else "out_proj"
            attention_out[f"{out}.weight"] = kind.ATTENTION_OUT
            if module.out_proj.bias is not None:
                attention_out[f"{out}.bias"] = kind.ATTENTION_BIAS
    return {**types, **attention_out}


class AlgoPerfWorkload:
    """The adapter; ``adapt`` makes it a subclass of the shim's ``spec.Workload`` too."""

    def __init__(self, spec: ModuleType, workload: Workload, *, batch_size: int, step_hint: int,
                 max_runtime: float):
        spec.Workload.__init__(self)
        self.spec, self.arena, self.batch_size = spec, workload, batch_size
        self._step_hint, self._max_runtime = step_hint, max_runtime
        self._types: dict[str, Any] | None = None
        self._shapes: dict[str, Any] | None = None
        self._output_keys: set[str] = set()

    # -- properties a submission reads ----------------------------------------------------------------
    @property
    def step_hint(self) -> int:
        return self._step_hint

    @property
    def max_allowed_runtime_sec(self) -> float:
        return self._max_runtime

    @property
    def loss_type(self):
        return self.spec.LossType[self.arena.loss_type.upper()]

    @property
    def num_train_examples(self) -> int:
        return int(self.arena.data().train_x.shape[0])

    @property
    def eval_batch_size(self) -> int:
        return self.arena.eval_batch_size

    @property
    def target_metric_name(self) -> str:
        return self.arena.metric

    @property
    def validation_target_value(self) -> float:
        return self.arena.target

    @property
    def model_params_types(self) -> dict[str, Any]:
        if self._types is None:
            raise ValueError("workload.model_params_types is set by workload.init_model_fn(); call that first")
        return self._types

    @property
    def param_shapes(self) -> dict[str, Any]:
        if self._shapes is None:
            raise ValueError("workload.param_shapes is set by workload.init_model_fn(); call that first")
        return self._shapes

    def is_output_params(self, param_key: str) -> bool:
        """Whether ``param_key`` belongs to the last module that holds parameters (the output layer)."""
        return param_key in self._output_keys

    def has_reached_validation_target(self, eval_result: dict[str, float]) -> bool:
        return self.arena.reached(eval_result[f"validation/{self.arena.metric}"], self.arena.target)

    # -- fixed functions ------------------------------------------------------------------------------
    def init_model_fn(self, rng: int) -> tuple[nn.Module, None]:
        model = self.arena.init_model(int(rng))
        self._types = parameter_types(self.spec, model)
        self._shapes = {k: self.spec.ShapeTuple(tuple(p.shape)) for k, p in model.named_parameters()}
        holders = [m for m in model.modules() if list(m.parameters(recurse=False))]
        self._output_keys = {k for k, p in model.named_parameters()
                             if any(p is q for q in holders[-1].parameters(recurse=False))}
        return model, None

    def model_fn(self, params: nn.Module, augmented_and_preprocessed_input_batch: dict[str, torch.Tensor],
                 model_state: Any, mode, rng: Any, update_batch_norm: bool, dropout_rate: float = 0.0):
        del rng, update_batch_norm, dropout_rate  # no dropout, no batch norm in the arena's models
        train = mode == self.spec.ForwardPassMode.TRAIN
        params.train(train)
        with contextlib.nullcontext() if train else torch.no_grad():
            return params(augmented_and_preprocessed_input_batch["inputs"]), model_state

    def loss_fn(self, label_batch: torch.Tensor, logits_batch: torch.Tensor, mask_batch: torch.Tensor | None = None,
                label_smoothing: float = 0.0) -> dict[str, torch.Tensor]:
        if self.loss_type == self.spec.LossType.SOFTMAX_CROSS_ENTROPY:
            per_example = nn.functional.cross_entropy(
                logits_batch.reshape(-1, logits_batch.shape[-1]), label_batch.reshape(-1), reduction="none",
                label_smoothing=label_smoothing).reshape(label_batch.shape)
        elif self.loss_type == self.spec.LossType.MEAN_SQUARED_ERROR:
            error = (logits_batch - label_batch).square()
            per_example = error.reshape(error.shape[0], -1).mean(1)
        else:
            raise ValueError(f"invalid loss_type={self.loss_type!r}: the arena's workloads use softmax cross-entropy"
                             " or mean squared error")
        if mask_batch is None:
            n_valid = torch.tensor(per_example.numel(), dtype=per_example.dtype)
        else:
            per_example = per_example * mask_batch
            n_valid = mask_batch.sum()
        return {"summed": per_example.sum(), "n_valid_examples": n_valid, "per_example": per_example}

    def input_queue(self, seed: int) -> Iterator[dict[str, torch.Tensor]]:
        """The training batches as AlgoPerf's PyTorch input queue yields them (the runner's; submissions read
        it only through ``data_selection``)."""
        for x, y in self.arena.batches(self.batch_size, seed):
            shape = y.shape if self.loss_type == self.spec.LossType.SOFTMAX_CROSS_ENTROPY else y.shape[:1]
            yield {"inputs": x, "targets": y, "weights": torch.ones(shape)}


def adapt(spec: ModuleType, workload: Workload, *, batch_size: int, step_hint: int,
          max_runtime: float) -> AlgoPerfWorkload:
    """The adapter as an instance of ``spec.Workload`` (the shim the submission imported)."""
    cls = type("Workload", (AlgoPerfWorkload, spec.Workload), {"__module__": __name__})
    return cls(spec, workload, batch_size=batch_size, step_hint=step_hint, max_runtime=max_runtime)
