"""The help formatter every ``tilecomm`` subcommand uses (its own module: the subcommands'
parsers live in their packages, and those must not import ``tilecomm.cli``, which imports
them)."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` only for a real default that the help text does not already
    explain (``--gpus ... (default: --nodes x node)`` used to get a second ``(default: None)``)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)
