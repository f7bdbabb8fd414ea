"""Checks on optimizer state and gradients against what the chain declares, before anything changes.

The chain's ``init`` on the meta device gives every buffer's expected shape and dtype for a
parameter (and refuses a parameter the chain cannot step, as GaLore refuses a rank above
min(m, n)). ``check_step`` runs before a step's first write, over every group; ``checked_load``
runs before ``load_state_dict`` replaces anything, and returns the state dict to load: buffers
cast to the chain's dtypes, a plain-number ``step`` made a tensor (torch.optim allows both).
"""
from __future__ import annotations

import math
import warnings
from itertools import chain as chain_iterables
from typing import Any, Mapping

import torch
from torch import Tensor

from gradwise.core.hyper import choice, non_negative_int
from gradwise.core.hyper_check import Checked, check_hyperparameters, shape_signature
from gradwise.core.params import DTensor, local, param_label
from gradwise.core.sharding import sharding
from gradwise.core.state_keys import MARK, layout, parts_of
from gradwise.core.transform import counters_of, uses

#: param-group keys that torch.optim adds to groups to choose how a step runs, not what it computes.
TORCH_EXECUTION_KEYS = ("foreach", "fused", "capturable", "differentiable")
#: param-group keys that are not hyperparameters but that torch itself puts in groups.
BOOKKEEPING_KEYS = ("params", "param_names", "initial_lr", "name")

Spec = dict[str, tuple[torch.Size, torch.dtype]]


def expected_state(optimizer, p: Tensor, group: Mapping[str, Any], resolved: tuple | None = None) -> Spec:
    """``{buffer: (shape, dtype)}`` that the group's chain keeps for ``p`` (``init`` on the meta device),
    cached by the parameter's shape and dtype and the group's chain and ``shape_signature``
    (``resolved``: both, computed once per group by a caller that checks many parameters)."""
    transform, signature = resolved or (optimizer.transform.for_group(group), shape_signature(optimizer, group))
    key = (id(transform), p.shape, p.dtype, signature)
    cache = optimizer.__dict__.setdefault("_expected_state", {})
    if key not in cache:
        meta = torch.empty(p.shape, dtype=p.dtype, device="meta")
        fresh = transform.init(torch.view_as_real(meta) if p.is_complex() else meta, group)
        cache[key] = {k: (v.shape, v.dtype) for k, v in fresh.items()}
    return cache[key]


def check_step(optimizer) -> None:
    """Everything a step can check before its first write, for every group: hyperparameters, each
    gradient's layout, whether the chain accepts each parameter, and the shapes of existing state.

    A step of a small model spends most of its time here and in the engine's Python, so the loop over
    parameters does the least each needs: one test of the gradient's layout (the error comes from
    ``_refuse_gradient``), and the state's shapes against the expected ones of the parameter's shape
    and dtype, looked up once per group and layout and kept between steps while the group's chain and
    ``shape_signature`` are unchanged (a schedule's new ``lr`` keeps them: ``core/hyper_check.py``)."""
    last = optimizer.__dict__.get("_checked_groups", ())
    checked = [check_hyperparameters(optimizer, group, last[index] if index < len(last) else None)
               for index, group in enumerate(optimizer.param_groups)]
    states = optimizer.state
    chain_of = getattr(optimizer, "chain_of", optimizer.transform.for_group)
    kept_specs = optimizer.__dict__.get("_group_specs", {})
    specs = {}
    for index, group in enumerate(optimizer.param_groups):
        resolved = None
        expected_of: dict[tuple, Spec] | None = None  # (shape, dtype) -> this group's expected state
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            shape, dtype = p.shape, p.dtype
            if g.is_sparse or g.shape != shape or g.dtype != dtype or g.device != p.device or isinstance(p, DTensor):
                _refuse_gradient(group, p, g, index)
            if expected_of is None:
                expected_of = _expected_of(kept_specs, specs, index, checked[index], chain_of(group))
            expected = expected_of.get((shape, dtype))
            if expected is None:  # ``init`` on the meta device: it may refuse the parameter
                resolved = resolved or (specs[index][1], checked[index].signature)
                expected = expected_of[shape, dtype] = expected_state(optimizer, p, group, resolved)
            own = states.get(p)
            if not own:
                continue
            for key, value in own.items():
                want = expected.get(key)
                if want is not None and isinstance(value, Tensor) and value.shape != want[0]:
                    raise ValueError(f"{param_label(group, p, index)} has state {key!r} of shape"
                                     f" {tuple(value.shape)}; expected shape {tuple(want[0])}")
            step = own.get("step")
            if step is not None and not (isinstance(step, Tensor) and step.numel() == 1):
                raise TypeError(f"{param_label(group, p, index)} has state 'step'={step!r}; expected a 0-d tensor")
    optimizer._checked_groups = checked  # after every check passed: a refused group is checked again
    optimizer._group_specs = specs


def _expected_of(kept: Mapping[int, tuple], specs: dict[int, tuple], index: int, checked: Checked,
                 transform) -> dict[tuple, Spec]:
    """Group ``index``'s ``{(shape, dtype): expected state}``, recorded in ``specs``: the one of the last
    step while it is the same group, resolving to the same chain, with the same ``shape_signature``
    (``checked``, what ``check_hyperparameters`` returned, holds it)."""
    last = kept.get(index)
    same = last is not None and last[0].group is checked.group and last[0].signature == checked.signature \
        and last[1] is transform
    specs[index] = (checked, transform, last[2] if same else {})
    return specs[index][2]


def _refuse_gradient(group: Mapping[str, Any], p: Tensor, g: Tensor, index: int) -> None:
    """Raise for a gradient gradwise cannot step with (sparse, or not shaped, typed and placed as its
    parameter), and for a DTensor placed as gradwise does not step it; else return."""
    if g.is_sparse:
        raise TypeError(f"{param_label(group, p, index)} has a sparse gradient; gradwise optimizers need"
                        " dense gradients (use torch.optim.SparseAdam for sparse embeddings)")
    if g.shape != p.shape or g.dtype != p.dtype or g.device != p.device:
        raise ValueError(f"{param_label(group, p, index)} has a gradient of shape {tuple(g.shape)},"
                         f" {g.dtype} on {g.device};"
                         f" expected the parameter's: shape {tuple(p.shape)}, {p.dtype} on {p.device}")
    if isinstance(p, DTensor):
        sharding(p, param_label(group, p, index))  # refuses placements gradwise does not step


def refuse_nonfinite(optimizer, work, culprit) -> None:
    """Raise for a step whose statistics came out NaN or inf, read by ``culprit`` (a link that
    ``refuses_nonfinite``: one such element would reach every parameter), naming the first parameter
    whose gradient holds one (the caller has undone the step's preparations: nothing has changed)."""
    bad = next(((group, p, index) for index, (group, params) in enumerate(work) for p in params
                if p.grad.numel() and not bool(torch.isfinite(local(p.grad)).all())), None)
    where = f"{param_label(*bad)} has NaN or inf in its gradient" if bad else \
        "the step's statistics are NaN or inf (from the parameters or the state: no gradient holds one)"
    raise ValueError(f"{type(optimizer).__name__}: {where}; {culprit!r} reads a statistic of every parameter of the"
                     " step, so one such element would make every parameter NaN. Nothing was changed; pass"
                     " skip_nonfinite=True to skip such steps (counted in skipped_steps)")


def group_defaults(optimizer) -> dict[str, Any]:
    """The value of every hyperparameter in a group that does not set it: the optimizer's defaults, or the
    chain's own default where a recipe keeps one out of its defaults (Muon's AdamW-route betas)."""
    return {key: optimizer.defaults.get(key, spec.default) for key, spec in optimizer.hyper_specs.items()}


def checked_load(optimizer, state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """``state_dict``, checked against this optimizer's groups and chain, ready for torch's loader.

    Raises (naming the group, the parameter and the key) on: a missing or malformed ``state`` or
    ``param_groups``, group counts or sizes that differ, an invalid hyperparameter, state
    for a parameter no group lists, a missing ``step`` or buffer, a buffer that is not a tensor, of
    the wrong shape or kind of dtype, not finite, or negative where the chain keeps it nonnegative.
    """
    if not isinstance(state_dict, Mapping) or not isinstance(state_dict.get("state"), Mapping) \
            or not isinstance(state_dict.get("param_groups"), list):
        raise TypeError(f"invalid state_dict of type {type(state_dict).__name__}: expected a dict with a 'state'"
                        " dict and a 'param_groups' list, as optimizer.state_dict() returns")
    saved_groups = state_dict["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(f"state_dict has {len(saved_groups)} param group(s); this optimizer has"
                         f" {len(optimizer.param_groups)}")
    groups, owners = [], {}
    for index, (group, saved) in enumerate(zip(optimizer.param_groups, saved_groups)):
        if not isinstance(saved, Mapping) or not isinstance(saved.get("params"), list):
            found = f"params={saved.get('params')!r}" if isinstance(saved, Mapping) else f"a {type(saved).__name__}"
            raise TypeError(f"state_dict['param_groups'][{index}] has {found}: expected a dict whose 'params' is"
                            " the list of its parameters' ids, as optimizer.state_dict() saves it")
        if len(saved["params"]) != len(group["params"]):
            raise ValueError(f"state_dict['param_groups'][{index}] lists {len(saved['params'])} parameter(s); this"
                             f" optimizer's param_groups[{index}] has {len(group['params'])}")
        # keys of the user's own (layer_id, lr_scale) load as they were saved, as add_param_group keeps them
        clean = {k: v for k, v in saved.items() if k not in TORCH_EXECUTION_KEYS}
        merged = {**group_defaults(optimizer), **clean}
        for key, spec in optimizer.hyper_specs.items():
            spec.validate(f"state_dict['param_groups'][{index}][{key!r}]", merged[key])
        groups.append(clean)
        for saved_id, p in zip(saved["params"], group["params"]):
            owners[saved_id] = (p, {**merged, "params": group["params"],
                                    "param_names": group.get("param_names")}, index)
    strays = sorted(map(repr, set(state_dict["state"]) - set(owners)))
    if strays:
        raise ValueError(f"state_dict['state'] has entries for {', '.join(strays)}, which no param group lists")
    renamed = getattr(optimizer, "renamed_state", {})  # keys an earlier version of the recipe saved
    states = {saved_id: _checked_state(optimizer, saved_id, _renamed(saved_state, renamed), *owners[saved_id])
              for saved_id, saved_state in state_dict["state"].items()}
    return {**state_dict, "state": states, "param_groups": groups}


def _renamed(saved_state: Any, renamed: Mapping[str, str]) -> Any:
    """A parameter's saved state with the keys in ``renamed`` (old: new) under their new names."""
    if not renamed or not isinstance(saved_state, Mapping):
        return saved_state
    return {renamed.get(k, k) if renamed.get(k, k) not in saved_state else k: v for k, v in saved_state.items()}


def _checked_state(optimizer, saved_id, saved_state: Any, p: Tensor, group: Mapping[str, Any], index: int):
    """One parameter's saved state, checked against its group's chain (see ``checked_load``)."""
    label = param_label(group, p, index)
    if not isinstance(saved_state, Mapping):
        raise TypeError(f"state_dict['state'][{saved_id!r}] ({label}) is a {type(saved_state).__name__};"
                        " expected a dict of tensors")
    if not saved_state:
        return {}
    expected = expected_state(optimizer, p, group)
    whole = set()
    if sharding(p) is not None:  # an owned link's state lives on the parameter's owner only, whole
        here = set(optimizer.keys_here(p, group))
        expected = {k: v for k, v in expected.items() if k in here}
        whole = optimizer.held_whole(p, group)
    extra = getattr(optimizer, "extra_state", {})
    plain, encoded = layout(tuple(saved_state))
    found = set(plain) | {b for b, _ in encoded}
    missing = sorted(set(expected) - found) + (["step"] if "step" not in found else [])
    unknown = sorted(found - set(expected) - set(extra) - {"step"})
    if missing or unknown:
        raise ValueError(f"state of {label} has keys {sorted(found)}; {type(optimizer).__name__}'s chain keeps"
                         f" {sorted([*expected, 'step'])}" + (f" (missing {missing})" if missing else "")
                         + (f" (unknown {unknown})" if unknown else ""))
    nonnegative = optimizer.transform.for_group(group).nonnegative
    out = {"step": _step(saved_state["step"], label)}
    for key in plain:
        if key == "step":
            continue
        shape, dtype = expected[key] if key in expected else extra[key]
        out[key] = _buffer(saved_state[key], label, key, shape, dtype, key in nonnegative)
    for buffer, tag in encoded:
        shape, dtype = expected[buffer]
        signed = buffer not in nonnegative
        parts = parts_of(saved_state, buffer, tag)
        for part, want in optimizer.storage.expected_parts(tag, shape, signed,
                                                                     None if buffer in whole else p).items():
            have = parts.get(part)
            if not isinstance(have, Tensor) or have.shape != want.shape or have.dtype != want.dtype:
                raise ValueError(f"state of {label}: encoded {buffer!r} ({tag}) part {part!r} is"
                                 f" {_describe(have)}; expected shape {tuple(want.shape)}, {want.dtype}")
        out.update({f"{buffer}{MARK}{tag}.{part}": v for part, v in parts.items()})
    return out


def _step(value: Any, label: str) -> Tensor:
    number = value.item() if isinstance(value, Tensor) and value.numel() == 1 else value
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number) \
            or number < 0 or number != int(number):
        raise ValueError(f"state of {label} has 'step'={value!r}; expected a whole number >= 0"
                         " (a 0-d tensor or a plain number)")
    return torch.tensor(float(number), dtype=torch.float32)  # on the CPU, as in torch.optim


def _buffer(value: Any, label: str, key: str, shape: torch.Size, dtype: torch.dtype, nonnegative: bool) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"state of {label} has {key!r}={_describe(value)}; expected a tensor of shape"
                        f" {tuple(shape)}, {dtype}")
    if value.shape != shape or value.dtype.is_floating_point != dtype.is_floating_point:
        raise ValueError(f"state of {label} has {key!r} of {_describe(value)}; expected shape {tuple(shape)},"
                         f" {dtype}")
    if dtype.is_floating_point:
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"state of {label} has {key!r} holding NaN or inf; expected finite values")
        if nonnegative and bool((value < 0).any()):
            raise ValueError(f"state of {label} has {key!r} holding negative values (min {float(value.min())});"
                             " expected values >= 0 (a second moment)")
    return value.to(dtype=dtype)


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"shape {tuple(value.shape)}, {value.dtype}"
    return f"{value!r} (a {type(value).__name__})"


def saved_ids(state_dict: Mapping[str, Any]):
    """The saved parameter ids, in group order."""
    return chain_iterables.from_iterable(g["params"] for g in state_dict["param_groups"])


def put_back_uncast(optimizer, state_dict: Mapping[str, Any]) -> None:
    """After torch's loader: torch.optim casts state to its parameter's dtype, but a transform chooses
    the dtype of its state (float32 for 16-bit parameters, float64 running scalars, APOLLO's int64
    seeds, which float32 would round), so put back the checked values, uncast."""
    params = chain_iterables.from_iterable(g["params"] for g in optimizer.param_groups)
    for saved_id, p in zip(saved_ids(state_dict), params):
        for key, value in state_dict["state"].get(saved_id, {}).items():
            if isinstance(value, Tensor) and key in optimizer.state[p] and optimizer.state[p][key].dtype != value.dtype:
                optimizer.state[p][key] = value.to(device=p.device)


#: the key of every saved param group under which ``state_dict()`` keeps what belongs to the whole optimizer
#: (``skipped_steps``, the mode, the chain's counters): torch.distributed.checkpoint's ``get_state_dict`` keeps
#: only ``"state"`` and ``"param_groups"`` of a state dict, and every group, so that each of several optimizers
#: saved together keeps its own. Checkpoints from before kept it as a top-level key, which still loads.
OPTIMIZER_KEY = "gradwise"


def save_counters(optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict()``'s post-hook: the counters and mode torch's state dict has no place for, with the
    counters the chain's transforms declare (``counters_of``), in every saved group (``OPTIMIZER_KEY``)."""
    counters = {key: int(getattr(t, name)) for key, (t, name) in counters_of(optimizer.transform).items()}
    for group in state_dict["param_groups"]:
        group[OPTIMIZER_KEY] = {"skipped_steps": optimizer.skipped_steps, "mode": optimizer.mode,
                                **({"counters": dict(counters)} if counters else {})}
    return state_dict


def saved_counters(state_dict: Mapping[str, Any]) -> tuple[str, Any]:
    """Where ``state_dict`` keeps the optimizer's counters and mode, and what it keeps there: every group's
    copy (refused unless they agree), else the top-level key of an older checkpoint, else None."""
    copies = [(f"state_dict['param_groups'][{index}][{OPTIMIZER_KEY!r}]", group[OPTIMIZER_KEY])
              for index, group in enumerate(state_dict["param_groups"]) if OPTIMIZER_KEY in group]
    for where, saved in copies[1:]:
        if saved != copies[0][1]:
            raise ValueError(f"{where}={saved!r} differs from {copies[0][0]}={copies[0][1]!r}; every param group"
                             " keeps the same copy of the optimizer's counters and mode, as optimizer.state_dict()"
                             " saves them")
    if copies:
        return copies[0]
    return f"state_dict[{OPTIMIZER_KEY!r}]", state_dict.get(OPTIMIZER_KEY)


def load_counters(optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """``load_state_dict()``'s pre-hook: the saved counters and mode (``saved_counters``), all checked
    before any is set; a checkpoint from before a counter was saved sets it to 0. Returns the state dict
    for torch's loader, its groups without their copies (param groups hold hyperparameters only)."""
    where, saved = saved_counters(state_dict)
    if saved is None and state_dict["state"] and uses(optimizer.transform, "set_mode"):
        warnings.warn(f"{type(optimizer).__name__}.load_state_dict: the state dict does not say which mode it was"
                      f" saved in (its param groups have no {OPTIMIZER_KEY!r} entry, where state_dict() keeps it;"
                      " torch.distributed.checkpoint with flatten_optimizer_state_dict=True leaves it out), so it"
                      " loads in train mode: had it been saved in eval mode, its parameters would hold the"
                      " evaluation point, and the run would go on from the wrong one", stacklevel=4)
    saved = {} if saved is None else saved
    if not isinstance(saved, Mapping):
        raise TypeError(f"invalid {where}={saved!r}: expected a dict, as optimizer.state_dict() saves it")
    skipped = non_negative_int(f"{where}['skipped_steps']", saved.get("skipped_steps", 0))
    mode = choice(("train", "eval"))(f"{where}['mode']", saved.get("mode", "train"))
    declared = counters_of(optimizer.transform)
    counters = saved.get("counters", {})
    if not isinstance(counters, Mapping):
        raise TypeError(f"invalid {where}['counters']={counters!r}: expected a dict of whole numbers,"
                        " as optimizer.state_dict() saves it")
    unknown = sorted(map(repr, set(counters) - set(declared)))
    if unknown:
        raise ValueError(f"{where}['counters'] has {', '.join(unknown)}, which {type(optimizer).__name__}'s chain"
                         f" does not count; it counts {sorted(declared)}")
    values = {key: non_negative_int(f"{where}['counters'][{key!r}]", counters.get(key, 0)) for key in declared}
    optimizer.skipped_steps = int(skipped)
    # the model's weights come from the same checkpoint, saved in this mode: adopt it, move nothing
    optimizer.mode = mode
    for key, (t, name) in declared.items():
        setattr(t, name, int(values[key]))
    return {**state_dict, "param_groups": [{k: v for k, v in group.items() if k != OPTIMIZER_KEY}
                                           for group in state_dict["param_groups"]]}
