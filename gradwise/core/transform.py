"""The central abstraction: a transform maps a list of update tensors to a list of update tensors.

A transform declares the per-parameter state buffers it keeps (``state``) and the param-group
hyperparameters it reads (``hyper``). Its ``update`` is written once, in plain PyTorch over lists of
tensors; the engine runs it eagerly (the reference path: in cache-sized pieces when it is elementwise,
on whole tensors when not, ``core/eager.py``) or compiles it with ``torch.compile`` into one fused pass
per parameter. ``chain(a, b, c)`` is itself a transform whose links keep their state under namespaced
keys (``"adam.exp_avg"``), so two momenta never collide.

The optional hooks (``HOOKS``: ``seed``, ``advance``, ``set_mode``, ``split_group``) are
declared, in ``Transform.hooks``: a class that defines one in its body declares it. A composite
(``chain``, ``route``, ``project_low_rank``, ``scale_by_apollo``) names what it wraps in ``wrapped``, and
the base class's hook methods forward each hook to the wrapped transforms that use it; ``uses(t, hook)``
reads the declarations of ``t`` and everything it wraps. So a hook a transform gains is forwarded by
every wrapper, and the optimizer calls a hook only on a chain that uses it.

A transform may also declare ``reductions``: small statistics of its input over every parameter of
the step (a sum of squares, a maximum, whether anything is NaN), computed by its ``reduce`` on each
bucket, combined by the engine (``core/phases.py``) before the link runs and handed to its ``update``
(and every later link's) as ``ctx[name]``. The engine runs such a chain in phases, every bucket
through one phase before the next, so a global-norm clip or a guard is an ordinary link.

The update convention follows optax: the chain turns gradients into the *change* added to the
parameters, so recipes end with ``scale_by_learning_rate`` (which multiplies by ``-lr``).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from gradwise.core import lists
from gradwise.core.context import Context
from gradwise.core.hyper import Hyper
from gradwise.core.namespaces import scoped, strip_namespace

#: the hooks a transform may implement besides ``init``, ``scalars`` and ``update`` (which every
#: transform has), and which the optimizer calls only on a chain that ``uses`` them.
HOOKS = ("seed", "advance", "set_mode", "split_group")
#: how a reduction's partial values combine over buckets (and, later, ranks): "skip" is an "any"
#: whose total, when true, skips the whole step (nothing changes; ``skipped_steps`` counts it).
REDUCE_OPS = ("sum", "max", "any", "skip")


class Transform:
    """Base class. Subclasses set ``state``, ``hyper`` and implement ``update``.

    ``elementwise`` says the update of one element depends only on that element (and scalars), so the
    executor may run it on flattened views and on local shards of DTensor parameters.
    ``batched`` says the update stacks same-shaped tensors of different parameters (one batched matmul
    or eigh), so it runs over a whole bucket at once, eagerly, never one parameter per compiled call.
    ``name`` namespaces the state keys inside a chain.

    ``hooks`` declares the ``HOOKS`` the transform implements itself. Defining one in a class body
    declares it (``__init_subclass__`` adds it to the class's ``hooks``); an instance may narrow its
    own (``lookahead()`` without ``evaluate_slow`` has no ``set_mode``). A composite does not
    define hooks: it returns what it wraps from ``wrapped``, and the base class's hook methods
    forward to those of them that use the hook; a hook that does work of its own and then forwards
    calls ``super()`` (APOLLO's ``seed``).
    """

    name: str = "transform"
    state: tuple[str, ...] = ()
    #: the ``state`` buffers that never hold negative values (second moments): a quantizing codec
    #: spends no code on negatives for them. A fact about the math, not about how buffers are stored.
    nonnegative: tuple[str, ...] = ()
    #: the ``state`` buffers that are a copy of the weights (Schedule-Free's z): ``state=`` never
    #: encodes them, as a codec's rounding error in them is an error in the weights themselves.
    weights_like: tuple[str, ...] = ()
    #: the ``state`` only ``advance`` reads and writes (0-d values ``update`` never reads: Schedule-Free's lr_max
    #: and weight sum): a step does not hand it to ``update``, so a compiled step takes no guarded input for it
    advance_only: tuple[str, ...] = ()
    hyper: Mapping[str, Hyper] = {}
    #: the whole-number attributes (>= 0) the transform counts events in (Shampoo's ``eigh_failures``):
    #: the optimizer saves them in ``state_dict()`` and sets them back in ``load_state_dict`` (``counters_of``).
    counters: tuple[str, ...] = ()
    elementwise: bool = True
    batched: bool = False
    hooks: frozenset[str] = frozenset()
    #: the statistics ``reduce`` computes, name -> one of ``REDUCE_OPS``; a composite has those of
    #: the transforms it wraps (a name is one statistic in the whole chain: two links may not share one)
    reductions: Mapping[str, str] = {}
    #: the statistics (of ``reductions``) this link's update reads, which a link before it (or itself) computes
    reads: tuple[str, ...] = ()
    #: a link through which one NaN or inf gradient element would reach every parameter (it reads a
    #: statistic of the whole step): the optimizer refuses such a step, naming the parameter, unless a
    #: guard (``skip_nonfinite``) skips it
    refuses_nonfinite: bool = False
    #: a link that moves the point the later links of its chain take their step from (``point_factors``)
    moves_point: bool = False
    #: a link that computes some of its own state from its whole input before its update (``prepare``)
    prepares: bool = False
    #: whether ``update`` (or ``prepare``) reads ``ctx.params``: a whole-tensor link that does not is sent
    #: only its input, not its parameter, when it runs on a sharded parameter's owner (``core/owned.py``)
    reads_params: bool = True
    #: a link whose ``apply`` runs torch's fused kernel of its ops eagerly, where the lists fit
    #: (``Context.torch_kernels``): under ``compile="auto"`` or torch's ``fused=True`` a last phase ending in one
    #: runs eagerly on CPU parameters (``PhasedStep._runner``), that kernel being faster than the phase's graph there
    torch_kernel: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.hooks = frozenset(cls.hooks) | {hook for hook in HOOKS if hook in vars(cls)}

    def wrapped(self, group: Mapping[str, Any] | None = None) -> list[tuple[str, "Transform"]]:
        """The (namespace, transform) pairs this composite wraps, where each one's state and scalars
        live under ``"<namespace>.<key>"`` (namespace ``""``: under the same keys); with ``group``, only
        those that run on that group's parameters. A transform that wraps nothing returns ``[]``."""
        return []

    def init(self, param: Tensor, group: Mapping[str, Any]) -> dict[str, Tensor]:
        """State buffers for one parameter; the default is zeros shaped like the parameter."""
        dtype = state_dtype(param)
        return {key: torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format) for key in self.state}

    def seed(self, state: Mapping[str, Tensor], index: int) -> None:
        """Called once on a parameter's freshly made state (``init``'s buffers) with the parameter's
        index among all the optimizer's parameters, in group order: a seed that is the same in every
        run and every process, for state drawn at random (APOLLO's projections). The default forwards
        to the wrapped transforms that use it.
        """
        for namespace, t in _wrapped_using(self, "seed"):
            if _kept_here(t, own := strip_namespace(namespace, state)):
                t.seed(own, index)

    def scalars(self, hyper: Mapping[str, Any], step: int) -> dict[str, float]:
        """Per-step constants computed in Python from the hyperparameters and the step count (e.g.
        Adam's bias corrections). They reach ``update`` as 0-d tensors, computed once per step rather
        than once per element inside the fused loop, and in double precision, as torch.optim does."""
        return {}

    def advance(self, state: Mapping[str, Tensor], hyper: Mapping[str, Any], scalars: Mapping[str, float]) -> None:
        """Advance one parameter's state that is not shaped like it (0-d running products and the
        like), once per step, before ``update``; ``scalars`` are this link's values for the step.

        ``update`` may only write state shaped like the parameter: that is what lets the executor
        run it on any slicing of the parameter (eager pieces, flat views) without repeating a write.
        A transform that is not ``elementwise`` always sees whole tensors, so its ``update`` may write
        any of its state (Shampoo's factors, Adafactor's row and column means). The default forwards
        to the wrapped transforms that use it.
        """
        for namespace, t in _wrapped_using(self, "advance"):
            if _kept_here(t, own := strip_namespace(namespace, state)):
                t.advance(own, hyper, strip_namespace(namespace, scalars))

    def advance_many(self, states: list[Mapping[str, Tensor]], hyper: Mapping[str, Any],
                     scalars: Mapping[str, float]) -> None:
        """``advance`` on each of a bucket's states (parameters of one step count, so one ``scalars``): what the
        optimizer calls. A transform that defines ``advance`` runs it on each state; one may override this
        to advance the whole bucket in one op per list, bit for bit as ``advance`` on each would
        (Schedule-Free's). A composite that does not define ``advance`` hands the bucket on to the wrapped
        transforms that use it, one call each."""
        if "advance" in self.hooks:
            for state in states:
                self.advance(state, hyper, scalars)
            return
        for link, namespace, own in _advanced_below(self, states):
            link.advance_many(own, hyper, strip_namespace(namespace, scalars))

    def advancer(self, states: list[Mapping[str, Tensor]]):
        """``advance_many`` on ``states``, as a call ``(hyper, scalars, saved)`` for a caller that advances the same
        states step after step (a steady step, ``core/steady.py``, through ``advance_plan``). The call first adds to
        ``saved`` what a roll back copies back (``(tensors, a stacked copy)`` of the 0-d state it writes). A transform
        may keep between calls what it can reuse (Schedule-Free keeps its 0-d state stacked)."""
        zero_d = lists.scalar_state(states, False)

        def advance(hyper: Mapping[str, Any], scalars: Mapping[str, float], saved: list) -> None:
            saved += lists.snapshot(zero_d)
            self.advance_many(states, hyper, scalars)
        return advance

    def update(self, updates: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> list[Tensor]:
        raise NotImplementedError

    def apply(self, updates: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> None:
        """As the last link of a chain's last phase: ``p <- p + update(u)``, written into the parameters
        (``ctx.params``). The default adds ``update``'s result; a link may write it in an op order of its
        own (AdamW's, torch.optim's: ``transforms/adam.py``). Parameters below the update's precision
        (bfloat16, rounded once or stochastically) get ``update``'s result added instead (``core/executor.py``)."""
        lists.add_(ctx.params, self.update(updates, state, ctx))

    def set_mode(self, mode: str, param: Tensor, state: Mapping[str, Tensor], group: Mapping[str, Any]) -> None:
        """Move one parameter between its training point and its evaluation point.

        ``Optimizer.train()`` calls it with ``mode="train"`` and ``Optimizer.eval()`` with ``"eval"``,
        once per parameter that has state, only when the mode changes. A transform whose gradients
        are taken at one point and whose model is evaluated at another (Schedule-Free's y and x)
        defines it; the default forwards to the wrapped transforms of ``group`` that use it.
        """
        for namespace, t in _wrapped_using(self, "set_mode", group):
            t.set_mode(mode, param, strip_namespace(namespace, state), group)

    def reduce(self, updates: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> dict[str, Tensor]:
        """This bucket's part of each statistic in ``reductions``, from this link's input ``updates``, its
        state before its update and ``ctx`` (0-d tensors; combined over every bucket of the step by the
        statistic's op, so a part must be combinable: a sum, maximum or any of element-wise values). The
        engine runs it before the link's ``update``, which reads the totals as ``ctx[name]``. The
        default forwards to the wrapped transforms that reduce, on this transform's input."""
        out: dict[str, Tensor] = {}
        for namespace, t in self.wrapped():
            if t.reductions:
                out.update(t.reduce(updates, strip_namespace(namespace, state), scoped(namespace, ctx)))
        return out

    def point_factors(self, params: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> list[Tensor]:
        """For a link that ``moves_point``: the factor (broadcastable: 0-d, or one per row) each
        parameter is multiplied by before the step (Ranger21's decay before its core). The engine runs
        it on whole tensors at the start of the link's phase, after the reductions before it, and
        writes the parameters there; the link's ``update`` is the identity, so the links of its phase
        take their step from the moved parameters. ``params`` are in the state's dtype."""
        raise NotImplementedError

    def fuse(self, other: "Transform") -> "Transform | None":
        """This link and the stateless ``other`` right after it as one link computing both, under this
        link's namespace (fewer passes), or None. The engine fuses where it can (``core/phases.py``);
        the default: None."""
        return None

    def prepare(self, updates: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> None:
        """For a link whose class sets ``prepares``: write its own state that is not shaped like the
        parameter (a per-tensor 0-d factor) from its input ``updates``, which it sees whole, before its
        ``update`` runs, so that the update itself can be elementwise and run in pieces or compiled flat
        (Ranger21's renormalized momentum input). The engine runs it where it runs ``reduce``."""
        raise NotImplementedError

    def links(self) -> list[tuple[str, "Transform"]]:
        """The (namespace, transform) pairs this transform is made of."""
        return [(self.name, self)]

    def split_group(self, group: dict[str, Any]) -> list[dict[str, Any]]:
        """The param groups a user's group becomes; one, itself, except under ``route``, which
        splits it by route (called before torch normalizes the group, so items may be (name, p)).
        The default: the one wrapped transform that splits groups decides."""
        splitters = _wrapped_using(self, "split_group")
        if len(splitters) > 1:
            raise ValueError(f"{self!r} holds more than one route(); give one route() all the routes instead")
        return splitters[0][1].split_group(group) if splitters else [group]

    def for_group(self, group: Mapping[str, Any]) -> "Transform":
        """The transform that runs on this group's parameters: itself, except under ``route``. It reads only the
        group's static hyperparameters (``Hyper(static=True)``: ``route``, ``amsgrad``), which the steady step
        (``core/steady.py``) relies on: the same static values, the same chain."""
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Chain(Transform):
    """Run transforms one after the other; each link's state lives under ``"<link name>.<buffer>"``."""

    name = "chain"

    def __init__(self, *transforms: Transform):
        flat: list[Transform] = []
        for t in transforms:
            if not isinstance(t, Transform):
                raise TypeError(f"chain() takes Transform objects, got {t!r} of type {type(t).__name__}")
            flat.extend(t.transforms if isinstance(t, Chain) else [t])
        self.transforms = tuple(flat)
        self._names = _unique_names(self.transforms)
        self.state = tuple(f"{n}.{k}" for n, t in zip(self._names, self.transforms) for k in t.state)
        self.nonnegative = tuple(f"{n}.{k}" for n, t in zip(self._names, self.transforms) for k in t.nonnegative)
        self.weights_like = tuple(f"{n}.{k}" for n, t in zip(self._names, self.transforms) for k in t.weights_like)
        self.elementwise = all(t.elementwise for t in self.transforms)
        self.batched = any(t.batched for t in self.transforms)
        self.reductions = merged_reductions(self.transforms)
        for i, t in enumerate(self.transforms):
            missing = [name for name in t.reads if not any(name in s.reductions for s in self.transforms[:i + 1])]
            if missing:
                raise ValueError(f"chain(): {t!r} reads the statistic(s) {missing}, which no link before it computes"
                                 " (e.g. trace_second_moment() or scale_by_pnm_adam(second_moment_statistics=True)"
                                 " reports the second moment)")
        merged: dict[str, Hyper] = {}
        for t in self.transforms:
            for key, spec in t.hyper.items():
                if key in merged and merged[key] != spec:
                    raise ValueError(
                        f"chain(): transforms {t!r} and another declare hyperparameter {key!r} differently;"
                        " rename one of them"
                    )
                merged[key] = spec
        self.hyper = merged

    def links(self) -> list[tuple[str, Transform]]:
        return list(zip(self._names, self.transforms))

    def wrapped(self, group: Mapping[str, Any] | None = None) -> list[tuple[str, Transform]]:
        return self.links()

    def for_group(self, group: Mapping[str, Any]) -> Transform:
        resolved = tuple(t.for_group(group) for t in self.transforms)
        if all(a is b for a, b in zip(resolved, self.transforms)):
            return self
        key = tuple(id(t) for t in resolved)
        cache = self.__dict__.setdefault("_resolved", {})
        if key not in cache:
            cache[key] = Chain(*resolved)
        return cache[key]

    def init(self, param: Tensor, group: Mapping[str, Any]) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for name, t in self.links():
            out.update({f"{name}.{k}": v for k, v in t.init(param, group).items()})
        return out

    def scalars(self, hyper: Mapping[str, Any], step: int) -> dict[str, float]:
        return {f"{name}.{k}": v for name, t in self.links() for k, v in t.scalars(hyper, step).items()}

    def update(self, updates: list[Tensor], state: Mapping[str, list[Tensor]], ctx: Context) -> list[Tensor]:
        return run_links(self.links(), updates, state, ctx)

    def __repr__(self) -> str:
        return "chain(" + ", ".join(repr(t) for t in self.transforms) + ")"


def merged_reductions(transforms) -> dict[str, str]:
    """The reductions of ``transforms`` together; a statistic's name may belong to one of them only."""
    merged: dict[str, str] = {}
    for t in transforms:
        for name, op in t.reductions.items():
            if op not in REDUCE_OPS:
                raise ValueError(f"{t!r} declares reduction {name!r} with op={op!r}: expected one of {REDUCE_OPS}")
            if name in merged:
                raise ValueError(f"two links of one chain compute the statistic {name!r} ({t!r} and another);"
                                 " a chain holds one link per statistic (e.g. one clip_by_global_norm)")
            merged[name] = op
    return merged


def uses(transform: Transform, hook: str, group: Mapping[str, Any] | None = None) -> bool:
    """Whether ``transform`` or anything it wraps (on ``group``'s parameters, when given) declares
    ``hook``, one of ``HOOKS``."""
    if hook not in HOOKS:
        raise ValueError(f"invalid hook={hook!r}: expected one of {sorted(HOOKS)}")
    return hook in transform.hooks or bool(_wrapped_using(transform, hook, group))


def counters_of(transform: Transform) -> dict[str, tuple[Transform, str]]:
    """Every counter ``transform`` and what it wraps declare: ``{key: (transform, attribute)}``, keyed
    like state (``"shampoo.eigh_failures"``); a key two routes share is numbered (``"...2"``)."""
    out: dict[str, tuple[Transform, str]] = {name: (transform, name) for name in transform.counters}
    for namespace, t in transform.wrapped():
        for key, where in counters_of(t).items():
            key = f"{namespace}.{key}" if namespace else key
            unique, n = key, 1
            while unique in out and out[unique] != where:
                n += 1
                unique = f"{key}{n}"
            out[unique] = where
    return out


def _wrapped_using(transform: Transform, hook: str,
                   group: Mapping[str, Any] | None = None) -> list[tuple[str, Transform]]:
    """The (namespace, transform) pairs ``transform`` wraps (for ``group``) that use ``hook``."""
    return [(namespace, t) for namespace, t in transform.wrapped(group) if uses(t, hook, group)]


def advance_plan(transform: Transform, states: list[Mapping[str, Tensor]],
                 namespace: str = "") -> list[tuple[Transform, str, list[Mapping[str, Tensor]]]]:
    """What ``transform.advance_many(states, ...)`` runs, as ``(link, namespace, its states)``: through the composites
    that hand the bucket on (``Transform.advance_many``'s default, which walks them this way at every call), down to
    each link that advances (or advances a bucket its own way). A steady
    step (``core/steady.py``) makes it once and calls ``link.advance_many(states, hyper, strip_namespace(namespace,
    scalars))`` on each: the same calls, without a walk whose cost grows with the bucket's parameters."""
    if "advance" in transform.hooks or type(transform).advance_many is not Transform.advance_many:
        return [(transform, namespace, states)]
    return _advanced_below(transform, states, namespace)


def _advanced_below(transform: Transform, states: list[Mapping[str, Tensor]],
                    namespace: str = "") -> list[tuple[Transform, str, list[Mapping[str, Tensor]]]]:
    """``advance_plan`` of each transform ``transform`` wraps that uses ``advance``, on the states it keeps."""
    plan = []
    for inner, t in _wrapped_using(transform, "advance"):
        own = [s for s in (strip_namespace(inner, st) for st in states) if _kept_here(t, s)]
        if own:
            plan += advance_plan(t, own, f"{namespace}.{inner}" if namespace and inner else namespace or inner)
    return plan


def _kept_here(t: Transform, state: Mapping[str, Any]) -> bool:
    """Whether this process keeps ``t``'s state: a sharded parameter's owned link keeps it on its owner
    only (``core/sharded_step.py``), and its hooks run there."""
    return not t.state or any(k in state for k in t.state)


def run_links(links: list[tuple[str, Transform]], updates: list[Tensor], state: Mapping[str, list[Tensor]],
              ctx: Context) -> list[Tensor]:
    """Run ``links`` (namespace, transform) one after the other, each on its own state and scalars (only
    the last may write into ``ctx.out``)."""
    inner = ctx.but(out=None) if ctx.out is not None else ctx
    for i, (namespace, t) in enumerate(links):
        updates = t.update(updates, strip_namespace(namespace, state), scoped(namespace, ctx if i == len(links) - 1
                                                                                  else inner))
    return updates


def _unique_names(transforms: tuple[Transform, ...]) -> list[str]:
    names, seen = [], {}
    for t in transforms:
        seen[t.name] = seen.get(t.name, 0) + 1
        names.append(t.name if seen[t.name] == 1 else f"{t.name}{seen[t.name]}")
    return names


def chain(*transforms: Transform) -> Chain:
    """Compose transforms left to right into one transform (optax's ``chain``)."""
    return Chain(*transforms)


def state_dtype(param: Tensor) -> torch.dtype:
    """The dtype state buffers and updates use: float32 for 16-bit parameters, else the parameter's."""
    return torch.float32 if param.dtype in (torch.float16, torch.bfloat16) else param.dtype
