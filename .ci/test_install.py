"""CI's install job: what a newcomer installs, checked in fresh virtual environments.

1. A bare install (``pip install torch==2.13.0``, then ``pip install .``, nothing else): ``import gradwise``,
   one step of every recipe, ``gradwise --help`` and ``--version``, every command that needs an extra
   naming it instead of failing with ``ModuleNotFoundError``, no benchmark installed (they are the clone's
   ``bench/`` scripts) and ``gradwise bench`` saying where they are.
2. The README's Install section, its commands read from README.md so they cannot drift: the ``pip install``
   lines with ``gradwise`` read as this checkout, then the from-a-clone block as one bash script, after which
   the clone's ``gradwise bench step`` runs its ``bench/step.py``.

Run by ``.ci/run`` with the test environment's pytest (``python -m pytest -q .ci/test_install.py``); a few
minutes, most of it installing torch twice from the local wheel (torch==2.13.0: anything else downloads).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
EXTRA_DISTRIBUTIONS = {"rich", "numpy", "optuna", "matplotlib", "scikit-learn", "mnist1d", "psycopg"}
STEP_EVERY_RECIPE = """
import torch, gradwise
from gradwise.by_name import recipe_names
for name in recipe_names():
    model = torch.nn.Linear(4, 3)
    budget = {"num_iterations": 10} if name == "Ranger21" else {}  # Ranger21 needs its step budget
    optimizer = gradwise.create(name, model, lr=1e-2, **budget)
    before = model.weight.detach().clone()
    for _ in range(2):  # ADOPT's first step only fills its second moment
        model(torch.randn(2, 4)).square().sum().backward()  # LOMO and AdaLomo step inside backward
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.equal(before, model.weight), name
print(len(recipe_names()), "recipes stepped")
"""


def _run(argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)


def _ok(argv, **kwargs) -> subprocess.CompletedProcess:
    proc = _run(argv, **kwargs)
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc


def install_blocks() -> list[str]:
    """The ```bash blocks of the README's Install section, in order."""
    section = (ROOT / "README.md").read_text().split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A clone of this repository and a virtual environment with torch and ``pip install <clone>`` alone."""
    work = tmp_path_factory.mktemp("install")
    src = work / "gradwise-src"
    _ok(["git", "clone", "-q", str(ROOT), str(src)])
    _ok([sys.executable, "-m", "venv", str(work / "venv")])
    bin_ = work / "venv" / "bin"
    _ok([str(bin_ / "pip"), "install", "-q", TORCH])
    _ok([str(bin_ / "pip"), "install", "-q", str(src)])
    yield SimpleNamespace(work=work, src=src, bin=bin_)
    shutil.rmtree(work)  # over a GB: torch in the venv


def test_bare_install_holds_torch_and_no_extra(bare):
    listed = json.loads(_ok([str(bare.bin / "pip"), "list", "--format=json"]).stdout)
    names = {p["name"].lower() for p in listed}
    assert {"gradwise", "torch"} <= names and not names & EXTRA_DISTRIBUTIONS, names & EXTRA_DISTRIBUTIONS


def test_bare_install_imports_and_steps_every_recipe(bare):
    proc = _ok([str(bare.bin / "python"), "-c", STEP_EVERY_RECIPE], cwd=bare.work)
    assert int(proc.stdout.split()[0]) >= 19


def test_bare_cli_help_version_and_estimate(bare):
    assert _ok([str(bare.bin / "gradwise"), "--help"]).stdout.startswith("usage: gradwise")
    assert _ok([str(bare.bin / "gradwise"), "--version"]).stdout == f"gradwise {VERSION}\n"
    assert "total" in _ok([str(bare.bin / "gradwise"), "estimate", "--size", "tiny"]).stdout


@pytest.mark.parametrize("argv, command, extra", [
    (["list"], "gradwise list", "cli"),
    (["arena", "list"], "gradwise arena list", "arena"),
    (["arena", "run", "--suite", "quick"], "gradwise arena run", "arena"),
    (["arena", "report"], "gradwise arena report", "arena"),
])
def test_bare_commands_name_their_extra(bare, argv, command, extra):
    proc = _run([str(bare.bin / "gradwise"), *argv], cwd=bare.work)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{command} needs " in proc.stderr and f"pip install 'gradwise[{extra}]'" in proc.stderr, proc.stderr


NO_BENCHMARK = """
import importlib.metadata, importlib.util
files = [str(f) for f in importlib.metadata.files("gradwise")]
assert not [f for f in files if f.startswith("bench/") or f.startswith("gradwise/bench")], files
assert importlib.util.find_spec("bench") is None
print(len(files), "files installed")
"""


def test_bare_install_holds_no_benchmark(bare):
    assert int(_ok([str(bare.bin / "python"), "-c", NO_BENCHMARK], cwd=bare.work).stdout.split()[0]) > 50


def test_bare_install_holds_the_package_data(bare):
    """The committed workload targets, the example AlgoPerf submission's search space and every entry's shipped
    search space (all of the checkout's ``gradwise/arena/spaces``) are in the wheel."""
    probe = ("from importlib.resources import files; root = files('gradwise.arena'); "
             "print((root / 'targets.json').is_file(), "
             "(root / 'examples' / 'algoperf_adamw' / 'tuning_search_space.json').is_file(), "
             "','.join(sorted(f.name for f in (root / 'spaces').iterdir() if f.name.endswith('.json'))))")
    spaces = ",".join(sorted(p.name for p in (ROOT / "gradwise" / "arena" / "spaces").glob("*.json")))
    assert spaces.count(".json") > 20 and "AdamW.json" in spaces
    out = _ok([str(bare.bin / "python"), "-c", probe], cwd=bare.work).stdout.split()
    assert out == ["True", "True", spaces]


def test_bare_bench_says_where_the_benchmarks_are(bare):
    proc = _run([str(bare.bin / "gradwise"), "bench", "step", "--size", "tiny"], cwd=bare.work)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "the benchmarks are scripts in gradwise's source repository" in proc.stderr, proc.stderr
    assert re.search(r"looked for \S*site-packages/bench/step\.py", proc.stderr), proc.stderr


def test_readme_pip_lines_install_the_extras(bare):
    """The first block's ``pip install`` lines, with ``gradwise`` read as the clone, in the bare venv."""
    lines = [line.split("#")[0].strip() for line in install_blocks()[0].splitlines()]
    commands = [shlex.split(line) for line in lines if line]
    assert [c[:2] for c in commands] == [["pip", "install"]] * len(commands) and len(commands) == 4
    for command in commands:
        spec = command[2]
        assert spec.startswith("gradwise"), command
        _ok([str(bare.bin / "pip"), "install", "-q", str(bare.src) + spec.removeprefix("gradwise")])
    assert "AdamW" in _ok([str(bare.bin / "gradwise"), "list"], cwd=bare.work).stdout
    assert "digits_cnn" in _ok([str(bare.bin / "gradwise"), "arena", "list"], cwd=bare.work).stdout
    _ok([str(bare.bin / "python"), "-c", "import psycopg"])


def test_readme_clone_block_runs_as_written(bare, tmp_path):
    """The second block, as one bash script, in an empty folder, REPO naming this repository."""
    script = install_blocks()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(sys.prefix))
    env["REPO"] = str(ROOT)
    try:
        proc = _ok(["bash", "-e", "-c", script], cwd=tmp_path, env=env)
        assert f"gradwise {VERSION}" in proc.stdout and "digits_cnn" in proc.stdout and "AdamW" in proc.stdout
        assert (tmp_path / "gradwise" / ".venv" / "bin" / "gradwise").exists()
        bench = _ok([str(tmp_path / "gradwise" / ".venv" / "bin" / "gradwise"), "bench", "step", "--size", "tiny",
                     "--steps", "1", "--recipes", "AdamW", "--paths", "eager"], cwd=tmp_path, env=env)
        assert "x fused" in bench.stdout and "torch AdamW" in bench.stdout, bench.stdout[-2000:]
    finally:
        shutil.rmtree(tmp_path / "gradwise", ignore_errors=True)  # its venv holds torch
