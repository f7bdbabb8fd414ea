"""The benchmarks are scripts of the source repository, not part of the package: what setuptools would install
holds no benchmark and imports none, ``gradwise bench`` runs the clone's ``bench/`` scripts, and a package
installed without them says where it looked instead of failing with a traceback."""
from __future__ import annotations

import argparse
import ast
import importlib.util
import shutil
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import read_configuration

from gradwise import cli, cli_bench

ROOT = Path(__file__).resolve().parents[1]


def installed_modules() -> dict[str, Path]:
    """Module name -> file of every module in the packages pyproject.toml's discovery finds (what a wheel holds)."""
    packages = read_configuration(ROOT / "pyproject.toml", expand=True)["tool"]["setuptools"]["packages"]
    return {f"{package}.{file.stem}": file for package in packages
            for file in (ROOT / package.replace(".", "/")).glob("*.py")}


def test_the_installed_packages_hold_no_benchmark_and_import_none():
    modules = installed_modules()
    assert {"gradwise.cli", "gradwise.core.optimizer"} <= set(modules)  # the discovery found the package
    assert not [m for m in modules if m.split(".")[0] == "bench" or m.split(".")[-1].startswith("bench")]
    for name, file in modules.items():
        for node in ast.walk(ast.parse(file.read_text())):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [i for i in imported if i.split(".")[0] == "bench"], (name, imported)


def test_bench_help_from_the_clone_lists_the_step_benchmark(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--help"])
    assert exit_info.value.code == 0 and "step" in capsys.readouterr().out
    assert cli_bench.script("step") == ROOT / "bench" / "step.py" and cli_bench.script("step").is_file()


def test_a_package_without_the_bench_folder_names_where_it_looked(tmp_path, capsys):
    """``cli_bench`` as a wheel installs it: ``site-packages/gradwise/cli_bench.py``, no ``bench/`` beside it."""
    copy = tmp_path / "gradwise" / "cli_bench.py"
    copy.parent.mkdir()
    shutil.copy(ROOT / "gradwise" / "cli_bench.py", copy)
    spec = importlib.util.spec_from_file_location("installed_cli_bench", copy)
    installed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(installed)
    assert installed.run(argparse.Namespace(benchmark="step")) == 2
    err = capsys.readouterr().err
    assert "gradwise bench step: the benchmarks are scripts in gradwise's source repository" in err
    assert f"looked for {tmp_path / 'bench' / 'step.py'}" in err
