"""The ``trainwatch`` command: a thin dispatcher over `trainwatch.commands`.

The subcommands and their flags are a stable contract (docs/cli.md) that scripts
outside this repository rely on.  Exit codes: 0 = ok / no violation, 1 = violations
found, 2 = bad usage or unreadable input (with a one-line reason); ``collect`` passes
the training command's own exit code through.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from trainwatch_version import version

SUBCOMMANDS: dict[str, str] = {
    "collect": "run a training command under instrumentation, writing traces and/or streaming events",
    "infer": "infer invariants from traces of healthy runs",
    "check": "check traces against invariants (the shipped default set without -i)",
    "report": "check traces and draw the verdict as a self-contained HTML page",
    "serve": "run a streaming checker worker on a Kafka cluster",
    "watch": "run a training command and check it live on one machine",
}

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on bad usage already; keep its message to one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainwatch", description="Catch silent errors in PyTorch training while the job runs.")
    parser.add_argument("--version", action="version", version=f"trainwatch {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, help_text in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(f"trainwatch.commands.{name}")
        module.add_arguments(sub_parser)
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Everything after the first ``--`` is the user's command, passed on untouched."""
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1 :]
    return argv, None


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    own, command = _split_command(args_list)
    parser = build_parser()
    if not args_list:  # a first try: show what there is to run rather than an error
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(own)
    args.cmd = command
    module = importlib.import_module(f"trainwatch.commands.{args.command}")
    try:
        return int(module.run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
