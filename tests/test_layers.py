"""Layers point down (ARCHITECTURE.md): core imports neither state, recipes nor arena, and no module
reaches into another's private names. Checked twice: by importing core in a fresh interpreter, and
by reading every module's imports (function-local ones included) from its syntax tree."""
from __future__ import annotations

import ast
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import torch

import gradwise
from gradwise.core.optimizer import Optimizer
from gradwise.core.transform import chain
from gradwise.transforms import scale_by_adam, scale_by_learning_rate

PACKAGE = Path(gradwise.__file__).parent
ROOT = PACKAGE.parent
ABOVE_CORE = ("gradwise.state", "gradwise.recipes", "gradwise.arena")
CORE_MODULES = ("gradwise.core.transform", "gradwise.core.optimizer", "gradwise.core.executor")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, imported name or None) for every import statement of ``path``, at any depth."""
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the importing module's package
                package = _module_name(path).split(".")
                package = package if path.name == "__init__.py" else package[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found += [(node.lineno, base, alias.name) for alias in node.names]
    return found


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _above_core(dotted: str) -> bool:
    return any(dotted == layer or dotted.startswith(layer + ".") for layer in ABOVE_CORE)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_importing_core_loads_no_module_of_state_recipes_or_arena():
    """Each of core's modules, imported alone in a fresh interpreter, in turn: whatever each import adds
    to ``sys.modules`` stays below the layers above core."""
    script = ("import importlib, sys\n"
              f"for name in {CORE_MODULES!r}:\n"
              "    importlib.import_module(name)\n"
              f"    print(name, *sorted(m for m in sys.modules if m.startswith({ABOVE_CORE!r})))\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(CORE_MODULES), run.stdout
    assert all(len(line.split()) == 1 for line in lines), f"loaded above core:\n{run.stdout}"


def test_no_core_module_imports_state_recipes_or_arena():
    core = [p for p in _modules() if _module_name(p).startswith("gradwise.core")]
    assert len(core) > 10, core
    offending = [f"{p.relative_to(ROOT)}:{line}: {module}{'.' + name if name else ''}"
                 for p in core for line, module, name in _imports(p)
                 if _above_core(module) or _above_core(f"{module}.{name}")]
    assert not offending, "\n".join(offending)


def test_no_module_imports_a_private_name_of_another():
    """``from gradwise.x import _y`` and ``import gradwise._x``, anywhere in gradwise, bench or tests."""
    files = [*_modules(), *sorted((ROOT / "bench").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
    offending = []
    for path in files:
        for line, module, name in _imports(path):
            if module.split(".")[0] != "gradwise":
                continue
            private = [part for part in [*module.split("."), name or ""] if _is_private(part)]
            if private:
                offending.append(f"{path.relative_to(ROOT)}:{line}: {module} {name or ''}")
    assert not offending, "\n".join(offending)


def test_no_module_reads_a_private_attribute_another_module_defines():
    """As ``optimizer._encoded`` was read in ``torch_checkpoint.py``: an attribute (method, or one assigned as
    ``x._name = ...``) whose private name only other modules define, read on anything but ``self``/``cls``."""
    trees = {p: _tree(p) for p in _modules()}
    definers: dict[str, set[Path]] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            else:
                continue
            if _is_private(name):
                definers.setdefault(name, set()).add(path)
    offending = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in definers \
                    and path not in definers[node.attr] and ast.unparse(node.value) not in ("self", "cls", "super()"):
                offending.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not offending, "\n".join(offending)


def test_the_package_keeps_its_public_names_now_that_it_imports_them_on_first_use():
    """Every name of ``__all__`` resolves and ``dir()`` lists it; a name it lacks is an AttributeError;
    subpackages load on first use (``gradwise.recipes`` without importing it)."""
    assert all(getattr(gradwise, name) is not None for name in gradwise.__all__)
    assert set(gradwise.__all__) <= set(dir(gradwise))
    assert gradwise.AdamW is gradwise.recipes.AdamW and gradwise.chain is chain
    assert gradwise.StatePolicy is gradwise.state.StatePolicy
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(gradwise, "no_such_name")


def test_state_is_plain_by_default_and_encoded_through_the_registered_storage():
    from gradwise.core.storage import PlainStorage

    p = torch.nn.Parameter(torch.randn(64, 64))
    p.grad = torch.randn(64, 64)
    transform = chain(scale_by_adam(), scale_by_learning_rate())
    plain = Optimizer([p], transform, compile=False, lr=1e-3)
    encoded = Optimizer([p], transform, compile=False, lr=1e-3, state=gradwise.StatePolicy("int8", min_numel=0))
    assert isinstance(plain.storage, PlainStorage) and type(encoded.storage).__module__ == "gradwise.state.engine"
    plain.step()
    encoded.step()
    assert set(plain.state[p]) == {"step", "adam.exp_avg", "adam.exp_avg_sq"}
    assert "adam.exp_avg@int8-b2048.codes" in encoded.state[p]
