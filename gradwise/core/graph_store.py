"""Compiled graphs kept on disk, so that a new process loads its optimizer's graphs instead of tracing them again.

Inductor's caches make a second process's first compiled step skip code generation and the C++ build, but not
dynamo: it traces the step again (about half of a warm first step), and AOTAutograd and inductor look their caches
up by the traced graph. ``GuardedGraphs`` (``core/ahead.py``) compiles a graph with ``torch.compile``'s
``aot_compile``, which makes the graph, its guards and dynamo's transformed code as one serializable object, and
keeps it on disk: in ``gradwise-graphs`` in inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``, so a fresh cache
folder starts cold), or in the folder ``GRADWISE_GRAPH_CACHE`` names. A later call of the same kind, in this
process or another, loads it, and uses it only where

- it was written by this torch and this Python (torch checks, at load);
- the folder's key matches: the caller's name and key (``GuardedGraphs``' key: the phase, counts, dtypes, layout),
  the call's tensors' dtypes and ranks (and sizes, for static shapes), this gradwise's source (every ``.py`` file
  of the package), this machine's vector instruction set (``vector_isa``), and inductor's, dynamo's and
  AOTAutograd's settings as they are now;
- every source the tracing read outside gradwise and torch (a transform of the user's own) is unchanged, its whole
  module compared;
- its guards, every one dynamo made but those ``GuardedGraphs`` leaves out (``left_out``), pass on the call's
  arguments: the tensors' dtypes, ranks, strides and sizes dynamo specialized, the chain's types and static
  values, grad mode and the thread count. (A graph that keeps a guard on a global of the user's is not stored:
  torch would rebuild that guard at load from the module as it is then.)

What it cannot see is what a process changes in gradwise's or torch's modules at run time (a module-level setting,
a function replaced): an in-process graph does not guard those either, but is traced after the change; set
``GRADWISE_GRAPH_CACHE=0`` (or inductor's ``force_disable_caches``) to trace every graph. A folder keeps at most
``ENTRIES`` graphs (the oldest go first); an entry that fails to load is skipped. Written atomically (torch writes
a temporary file and renames it).
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import logging
import os
import platform
import sys
import uuid
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger("gradwise")

#: the environment variable that names the store's folder, or turns it off ("0"; unset or "1": the default folder)
ENV = "GRADWISE_GRAPH_CACHE"
#: graphs kept per folder (one folder per kind of call)
ENTRIES = 8
#: bumped when what the store writes changes
FORMAT = 1
_TRUSTED = ("gradwise", "torch")  # modules whose sources the folder's key (or torch's version) covers


def enabled() -> bool:
    """Whether graphs are looked up and kept on disk: not with ``GRADWISE_GRAPH_CACHE=0``, inductor's caches
    disabled, or a torch without ``aot_compile``."""
    from torch._inductor import config

    return (os.environ.get(ENV, "1") != "0" and not config.force_disable_caches
            and hasattr(torch.compiler, "load_compiled_function"))


@functools.cache
def _package_digest() -> str:
    """A digest of gradwise's sources: every ``.py`` file of the package, in path order."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _machine(root: Path) -> tuple[str, ...]:
    return torch.__version__, sys.version, platform.machine(), vector_isa(root)


def vector_isa(root: Path) -> str:
    """The vector instruction set inductor compiles for here (``pick_vec_isa``), with its probe made once per machine.

    Inductor lists the instruction sets the CPU reports and keeps those a probe accepts: it builds a small library
    for each and loads it in a new Python process, about half a second of every warm first step (the loaded graphs
    ask for the list too). ``root`` keeps the list a probe made, by what decides it: this CPU's features
    (``torch.cpu.get_capabilities``), torch, the compiler and inductor's settings. Where that list is the CPU's own,
    this process takes the CPU's list unprobed (inductor's ``cpp.vec_isa_ok``, for that one call): the list the probe
    would make. Otherwise, and without a record or the CPU's features, inductor probes as it would."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa, valid_vec_isa_list

    features = getattr(torch.cpu, "get_capabilities", dict)()
    if not features or not hasattr(valid_vec_isa_list, "cache_info"):
        return str(pick_vec_isa())
    deciding = _canonical((torch.__version__, sys.platform, platform.machine(), config.cpp.cxx, config.cpp.simdlen,
                           config.cpp.vec_isa_ok, os.environ.get("CXX"), os.environ.get("ATEN_CPU_CAPABILITY"),
                           {k: v for k, v in features.items() if isinstance(v, (bool, str))}))
    record = root / f"isa-{hashlib.sha256(deciding.encode()).hexdigest()[:32]}.txt"
    try:
        recorded = record.read_text().split()
    except OSError:
        recorded = None
    if recorded is not None and not valid_vec_isa_list.cache_info().currsize:
        with config.patch({"cpp.vec_isa_ok": True}):
            reported = list(map(str, valid_vec_isa_list()))
        if reported != recorded:  # a probe refused one: probe again
            valid_vec_isa_list.cache_clear()
    probed = list(map(str, valid_vec_isa_list()))
    if probed != recorded:
        try:
            root.mkdir(parents=True, exist_ok=True)
            written = record.with_name(f"{record.name}.{uuid.uuid4().hex}.tmp")
            written.write_text("\n".join(probed))
            os.replace(written, record)
        except OSError as error:
            logger.debug("did not record the vector instruction sets in %s: %s", root, error)
    return str(pick_vec_isa())


def _canonical(value: Any) -> str:
    """``repr(value)``, with sets and dicts in sorted order (a set's order changes from process to process)."""
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(map(_canonical, value))) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{_canonical(k)}: {_canonical(v)}" for k, v in value.items())) + "}"
    if isinstance(value, (list, tuple)):
        return type(value).__name__ + "(" + ", ".join(map(_canonical, value)) + ")"
    return repr(value)


def _settings() -> str:
    """Inductor's, dynamo's and AOTAutograd's settings now (each as its portable dict, the one its caches key by)."""
    configs = (torch._inductor.config, torch._dynamo.config, torch._functorch.config)
    return _canonical([config.save_config_portable() for config in configs])


def signature(value: Any, dynamic: bool) -> Any:
    """What a graph needs of a call's tensors, whatever its guards add: each one's dtype, device type and rank, and,
    for a graph of static shapes, its sizes and strides, through lists, tuples and dicts (a call's locals)."""
    if isinstance(value, torch.Tensor):
        shape = (value.dim(),) if dynamic else (tuple(value.shape), value.stride())
        return (str(value.dtype), value.device.type, *shape)
    if isinstance(value, (list, tuple)):
        return tuple(signature(v, dynamic) for v in value)
    if isinstance(value, dict):
        return tuple((k, signature(v, dynamic)) for k, v in value.items())
    return None


def folder(name: str, key: Hashable, frame: dict[str, Any], dynamic: bool) -> Path:
    """The folder of graphs for calls of ``name`` (the caller's function and backend) with ``key`` on tensors like
    ``frame``'s (``signature``)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    named = os.environ.get(ENV, "")
    root = Path(named) if named not in ("", "1") else Path(cache_dir()) / "gradwise-graphs"
    text = _canonical((FORMAT, name, key, signature(frame, dynamic), _package_digest(), _machine(root), _settings()))
    return root / hashlib.sha256(text.encode()).hexdigest()[:32]


def _module_source(name: str) -> str | None:
    try:
        return inspect.getsource(importlib.import_module(name))
    except (ImportError, OSError, TypeError):
        return None


def _sources_unchanged(compiled) -> bool:
    """Whether every module outside gradwise and torch whose code the graph's tracing read is as it was then."""
    return all(_module_source(source.module) == source.content
               for source in compiled.source_info().inlined_sources
               if source.module.partition(".")[0] not in _TRUSTED)


def guards_and_code(compiled) -> tuple[Any, Callable]:
    """An ``aot_compile`` result as ``GuardedGraphs`` keeps an entry: its guard manager and its transformed code."""
    return compiled._artifacts.guard_manager, compiled.fn


def load(where: Path, f_globals: dict[str, Any], frame: dict[str, Any]) -> tuple[Any, Callable] | None:
    """The newest graph in ``where`` whose sources are unchanged and whose guards pass on ``frame`` (the call's
    locals), as ``guards_and_code``; None where none does."""
    try:
        paths = sorted(where.glob("*.graph"), key=lambda path: path.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for path in paths:
        try:
            with open(path, "rb") as file:
                compiled = torch.compiler.load_compiled_function(file, f_globals=f_globals)
            if not _sources_unchanged(compiled):
                continue
            guards, run = guards_and_code(compiled)
            if guards.check(frame):
                return guards, run
        except Exception as error:  # written by another version, cut short, removed meanwhile: skipped
            logger.debug("skipped the stored graph %s: %s", path, error)
    return None


def save(where: Path, compiled) -> None:
    """Write ``compiled`` (an ``aot_compile`` result) into ``where``, removing its oldest graphs past ``ENTRIES``;
    a graph that cannot be written (a guard or a constant torch cannot serialize) is not kept."""
    try:
        where.mkdir(parents=True, exist_ok=True)
        present = sorted(where.glob("*.graph"), key=lambda path: path.stat().st_mtime)
        for path in present[:max(0, len(present) - ENTRIES + 1)]:
            path.unlink(missing_ok=True)
        compiled.save_compiled_function(str(where / f"{uuid.uuid4().hex}.graph"))
    except Exception as error:
        logger.debug("did not keep a graph in %s: %s", where, error)
