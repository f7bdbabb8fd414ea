"""AlgoPerf's submission API (``algoperf/spec.py``, v0.6) as far as a PyTorch submission uses it.

Provided: the enums ``LossType``, ``ForwardPassMode`` and ``ParameterType`` (same members and values), the type
names used in signatures (``Workload``, ``ParameterContainer``, ``ParameterTypeTree``, ``ModelAuxiliaryState``,
``OptimizerState``, ``Hyperparameters``, ``RandomState``, ``Tensor``, ``UpdateReturn``, ``ShapeTuple`` and the
``*Fn`` callables), and ``TrainingCompleteError`` (raise it in ``update_params`` to stop early). ``Workload`` is
the base of the arena's adapter (``gradwise/arena/algoperf_workload.py``); its data pipeline and evaluation
(``_build_input_queue``, ``eval_model``) are the runner's, not the submission's, as in AlgoPerf. No JAX.
"""
from __future__ import annotations

import enum
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from torch import nn


class LossType(enum.Enum):
    SOFTMAX_CROSS_ENTROPY = 0
    SIGMOID_CROSS_ENTROPY = 1
    MEAN_SQUARED_ERROR = 2
    CTC_LOSS = 3
    MEAN_ABSOLUTE_ERROR = 4


class ForwardPassMode(enum.Enum):
    TRAIN = 0
    EVAL = 1


class ParameterType(enum.Enum):
    WEIGHT = 0
    BIAS = 1
    CONV_WEIGHT = 2
    BATCH_NORM_SCALE = 3
    BATCH_NORM_BIAS = 4
    LAYER_NORM_SCALE = 5
    LAYER_NORM_BIAS = 6
    EMBEDDING = 7
    ATTENTION_Q = 8
    ATTENTION_K = 9
    ATTENTION_V = 10
    ATTENTION_OUT = 11
    ATTENTION_QKV = 12
    ATTENTION_KV = 13
    ATTENTION_BIAS = 14


Tensor = Any


class ShapeTuple:
    """A shape kept whole when a tree of shapes is walked."""

    def __init__(self, shape_tuple):
        self.shape_tuple = shape_tuple

    def __repr__(self):
        return f"ShapeTuple({self.shape_tuple})"

    def __eq__(self, other):
        return self.shape_tuple == other.shape_tuple


Shape = Union[Tuple[int, ...], ShapeTuple]
ParameterShapeTree = Dict[str, Any]
ParameterKey = str
ParameterContainer = Union[Dict[ParameterKey, Any], nn.Module]
ParameterTypeTree = Dict[ParameterKey, Any]
RandomState = Any
OptimizerState = Union[Dict[str, Any], Tuple[Any, Any]]
Hyperparameters = Any
Timing = int
Steps = int
ModelAuxiliaryState = Any
ModelInitState = Tuple[ParameterContainer, ModelAuxiliaryState]
UpdateReturn = Tuple[OptimizerState, ParameterContainer, ModelAuxiliaryState]


class Workload:
    """What a submission may read of a workload: properties such as ``step_hint``, ``loss_type``,
    ``model_params_types`` and ``metrics_logger``, and the fixed functions ``init_model_fn``, ``model_fn`` and
    ``loss_fn``. The arena's adapter fills them in."""

    def __init__(self, *args, **kwargs) -> None:
        del args, kwargs
        self.metrics_logger = None

    def attach_metrics_logger(self, metrics_logger) -> None:
        self.metrics_logger = metrics_logger


class TrainingCompleteError(Exception):
    """Raised by ``update_params`` to end training; the runner then evaluates once more."""


InitOptimizerFn = Callable[[Workload, ParameterContainer, ModelAuxiliaryState, Hyperparameters, RandomState],
                           OptimizerState]
UpdateParamsFn = Callable[[Workload, ParameterContainer, ParameterTypeTree, ModelAuxiliaryState, Hyperparameters,
                           Dict[str, Tensor], LossType, OptimizerState, List[Tuple[int, float]], int, RandomState,
                           Optional[Dict[str, Any]]], UpdateReturn]
PrepareForEvalFn = Callable[[Workload, ParameterContainer, ParameterTypeTree, ModelAuxiliaryState, Hyperparameters,
                             LossType, OptimizerState, List[Tuple[int, float]], int, RandomState], UpdateReturn]
DataSelectionFn = Callable[[Workload, Iterator[Dict[str, Any]], OptimizerState, ParameterContainer,
                            ModelAuxiliaryState, Hyperparameters, int, RandomState], Dict[str, Tensor]]
