"""The ``modelfleet`` command line: one sub-command per module of ``modelfleet.cli``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from modelfleet.cli import (
    apply,
    diff,
    drill,
    gate,
    keys,
    plan,
    render,
    status,
    up,
    usage,
    validate,
)

COMMANDS = (validate, diff, apply, up, status, plan, drill, gate, keys, usage, render)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog="modelfleet",
        description="Serve open models to many teams through one OpenAI-compatible API.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``modelfleet`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
