"""`trainwatch check` (not yet wired)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    print("trainwatch check: not available in this build", file=sys.stderr)
    return 2
