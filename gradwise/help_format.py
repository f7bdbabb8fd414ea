"""One help style for every ``gradwise`` command and bench script: defaults shown after each option's help."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``argparse``'s defaults formatter, silent where there is no default to show (``None``, a flag's
    ``False``), and keeping the description's line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)
