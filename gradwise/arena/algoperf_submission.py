"""Load a module written against AlgoPerf's PyTorch submission interface, unchanged, for the arena.

The module's imports of ``algoperf.spec`` and ``algoperf.pytorch_utils`` resolve to gradwise's shim
(``gradwise/arena/algoperf_shim``), which ``algoperf_imports`` puts first on ``sys.path`` only while the
submission is loaded and runs (a real ``algoperf`` already imported is set aside and put back after). The module
must define AlgoPerf v0.6's submission functions (mlcommons/algorithmic-efficiency, ``algoperf/spec.py``):
``get_batch_size(workload_name)``, ``init_optimizer_state(workload, model_params, model_state, hyperparameters,
rng)``, ``update_params(workload, current_param_container, current_params_types, model_state, hyperparameters,
batch, loss_type, optimizer_state, eval_results, global_step, rng[, train_state])`` and ``data_selection(workload,
input_queue, optimizer_state, current_param_container, model_state, hyperparameters, global_step, rng)``;
``prepare_for_eval(workload, current_param_container, current_params_types, model_state, hyperparameters,
loss_type, optimizer_state, eval_results, global_step, rng)`` is optional, as in AlgoPerf's runner. Each is
checked before anything runs: a missing function or one that cannot be called as AlgoPerf calls it is refused
with its name and the expected signature.

Hyperparameters come from ``tuning_search_space.json`` beside the file (AlgoPerf's external tuning: its list or
dict form) as a ``namedtuple``; without one the submission is self-tuning and gets ``None``.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
from collections import namedtuple
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

from gradwise.arena.submissions import check_search_space
from gradwise.extras import EXTRAS

SHIM = Path(__file__).resolve().parent / "algoperf_shim"
SEARCH_SPACE = "tuning_search_space.json"

#: function -> (its parameters in AlgoPerf's order, whether AlgoPerf's runner passes them by keyword)
FUNCTIONS: dict[str, tuple[tuple[str, ...], bool]] = {
    "get_batch_size": (("workload_name",), False),
    "init_optimizer_state": (("workload", "model_params", "model_state", "hyperparameters", "rng"), False),
    "update_params": (("workload", "current_param_container", "current_params_types", "model_state",
                       "hyperparameters", "batch", "loss_type", "optimizer_state", "eval_results", "global_step",
                       "rng"), True),
    "prepare_for_eval": (("workload", "current_param_container", "current_params_types", "model_state",
                          "hyperparameters", "loss_type", "optimizer_state", "eval_results", "global_step", "rng"),
                         True),
    "data_selection": (("workload", "input_queue", "optimizer_state", "current_param_container", "model_state",
                        "hyperparameters", "global_step", "rng"), False),
}
OPTIONAL = {"prepare_for_eval"}


@contextlib.contextmanager
def algoperf_imports() -> Iterator[ModuleType]:
    """While open, ``import algoperf`` is the shim; yields its ``spec`` module."""
    aside = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "algoperf" or k.startswith("algoperf.")}
    sys.path.insert(0, str(SHIM))
    try:
        spec = importlib.import_module("algoperf.spec")
        yield spec
    finally:
        sys.path.remove(str(SHIM))
        for k in [k for k in sys.modules if k == "algoperf" or k.startswith("algoperf.")]:
            del sys.modules[k]
        sys.modules.update(aside)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def submission_name(path: str | Path) -> str:
    """The name on the leaderboard: the folder's name for a ``submission.py``, else the file's stem."""
    path = Path(path)
    return path.parent.resolve().name if path.stem == "submission" else path.stem


def check_file(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix != ".py" or not path.is_file():
        raise ValueError(f"invalid --submission={str(path)!r}: expected an existing Python file (.py)")
    return path.resolve()


def load_submission(path: str | Path) -> ModuleType:
    """Import the file as a fresh module (call inside ``algoperf_imports``) and check its functions."""
    path = check_file(path)
    module_name = f"gradwise_algoperf_submission_{file_sha256(path)[:12]}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.path.insert(0, str(path.parent))  # as AlgoPerf imports it: its own folder's modules resolve
    try:
        loader_spec.loader.exec_module(module)
    except ModuleNotFoundError as error:
        raise ValueError(f"submission {str(path)!r}: {missing_module(error.name or '')}") from error
    finally:
        sys.path.remove(str(path.parent))
    check_functions(module, path)
    return module


def missing_module(name: str) -> str:
    """What to say of a module the submission imports and this environment lacks."""
    if name == "algoperf" or name.startswith("algoperf."):
        return (f"it imports {name!r}, which the arena's algoperf shim does not provide (it has algoperf.spec and"
                " algoperf.pytorch_utils: the submission API, not AlgoPerf's workloads or runner)")
    top = name.split(".")[0]
    extra = next((e for e, modules in EXTRAS.items() if top in modules), None)
    return f"it imports {name!r}, which is not installed" + (f": pip install 'gradwise[{extra}]'" if extra else "")


def check_functions(module: ModuleType, path: Path) -> None:
    for name, (params, by_keyword) in FUNCTIONS.items():
        expected = f"{name}({', '.join(params)}{', train_state=None' if name == 'update_params' else ''})"
        function = getattr(module, name, None)
        if function is None and name in OPTIONAL:
            continue
        if not callable(function):
            raise ValueError(f"submission {str(path)!r} has no function {name}: AlgoPerf's API needs {expected}")
        try:
            signature = inspect.signature(function)
            signature.bind(**dict.fromkeys(params)) if by_keyword else signature.bind(*params)
        except TypeError as error:
            raise ValueError(f"submission {str(path)!r}: {name}{signature} cannot be called as AlgoPerf calls it"
                             f" ({error}); expected {expected}") from None


def batch_size(module: ModuleType, path: Path, workload: str) -> int:
    """``get_batch_size(workload)``, checked: an int >= 1, or an error naming the submission and workload."""
    try:
        size = module.get_batch_size(workload)
    except Exception as error:  # noqa: BLE001 - whatever the submission raises, say where it came from
        raise ValueError(f"submission {str(path)!r}: get_batch_size({workload!r}) raised"
                         f" {type(error).__name__}: {error}; it must handle the arena's workload names"
                         " (gradwise arena list)") from error
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"submission {str(path)!r}: get_batch_size({workload!r}) returned {size!r}; expected an"
                         " int >= 1")
    return size


def find_search_space(path: str | Path) -> Path | None:
    """``tuning_search_space.json`` beside the submission, if there is one."""
    candidate = Path(path).resolve().parent / SEARCH_SPACE
    return candidate if candidate.is_file() else None


def load_space(path: str | Path) -> list[dict[str, Any]] | dict[str, dict]:
    """An AlgoPerf search space: a list of fixed points or a dict of ranges and feasible points (JSON)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"invalid search space file {str(path)!r}: {error}") from error
    space = check_search_space(None, raw)
    keys = {k for point in space for k in point} if isinstance(space, list) else set(space)
    bad = sorted(k for k in keys if not k.isidentifier())
    if bad:
        raise ValueError(f"invalid hyperparameter name(s) {bad} in {str(path)!r}: a submission reads them as"
                         " attributes (hyperparameters.learning_rate), so each must be a Python identifier")
    return space


def hyperparameters_tuple(point: dict[str, Any] | None):
    """The point as AlgoPerf hands it to a submission: a ``namedtuple`` (``None`` for self-tuning)."""
    if point is None:
        return None
    return namedtuple("Hyperparameters", list(point))(**point)
