"""The command line as a newcomer meets it: ``--version``, help text for every option of every subcommand,
every recipe in ``gradwise list``, errors in the terms the user typed, and the bf16 case in ``estimate``."""
from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import pytest

import gradwise
from gradwise import cli

ROOT = Path(__file__).resolve().parents[1]


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """Every (argv prefix, parser) pair below ``parser``, itself included."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, (*prefix, name))


SUBCOMMANDS = list(_subcommands(cli._parser()))


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"gradwise {version}\n"
    assert gradwise.__version__ == version


@pytest.mark.parametrize("argv, parser", SUBCOMMANDS, ids=[" ".join(("gradwise", *argv)) for argv, _ in SUBCOMMANDS])
def test_every_option_has_help_and_help_exits_zero(argv, parser, capsys):
    for action in parser._actions:
        assert action.help, (argv, action.option_strings or action.dest)
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and out.startswith("usage: gradwise")
    formatter = parser._get_formatter()
    for action in parser._actions:  # a default worth showing is shown
        if action.option_strings and action.default is not None and action.default is not False \
                and action.default != argparse.SUPPRESS:
            assert "%(default)" in formatter._get_help_string(action), (argv, action.option_strings)


def test_subcommands_cover_the_arena():
    names = {" ".join(argv) for argv, _ in SUBCOMMANDS}
    assert {"list", "estimate", "bench step", "arena run", "arena set-targets", "arena list"} <= names


def test_list_shows_every_recipe_and_the_wrappers(capsys):
    from gradwise.by_name import recipe_names

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert len(recipe_names()) >= 19
    for name in [*recipe_names(), "Lookahead", "schedule_free"]:
        assert f"│ {name} " in out, name
    assert out.count("wrapper:") == 2


@pytest.mark.parametrize("typed", ["adamw", "ADAMW", "AdamW"])
def test_estimate_recipe_in_any_case(typed, capsys):
    assert cli.main(["estimate", "--size", "tiny", "--recipe", typed]) == 0
    assert capsys.readouterr().out.startswith("AdamW optimizer state on the tiny")


def test_estimate_unknown_recipe_names_the_option_and_only_recipes(capsys):
    assert cli.main(["estimate", "--recipe", "Nope"]) == 2
    err = capsys.readouterr().err
    assert "invalid --recipe='Nope'" in err and "AdamW" in err and "GaLoreAdamW" in err
    assert "optimizer_or_recipe" not in err and "Lookahead" not in err and "schedule_free" not in err


def test_estimate_bf16_parameters_keep_float32_moments(capsys):
    assert cli.main(["estimate", "--size", "tiny", "--param-dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16 parameters" in out and "8.00 bytes per parameter, 4.0x" in out and "--state bf16" in out
    assert cli.main(["estimate", "--size", "tiny", "--param-dtype", "bf16", "--state", "bf16"]) == 0
    total = [line for line in capsys.readouterr().out.splitlines() if line.startswith("total")]
    assert float(total[0].split()[2]) < 4.1  # bf16 moments: torch's memory for a bf16 model


def test_extras_name_what_pyproject_installs():
    from gradwise.extras import DISTRIBUTIONS, EXTRAS

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        names = {re.split(r"[\[<>=]", requirement)[0] for requirement in declared[extra]}
        assert names == {DISTRIBUTIONS.get(m, m) for m in modules}, extra
