"""The `xirang` command line. Each command group lives in its own module that exposes
`register(subparsers)`; this file only wires them together, so adding a command never
touches another's code."""

from __future__ import annotations

import argparse
import importlib
import sys

from xirang.errors import UserError, debugging, explain_failure  # noqa: F401  (UserError re-exported)

# Modules that register subcommands, in the order their help is listed.
COMMAND_MODULES = [
    "xirang.cmd_replay",
    "xirang.cmd_bench",
]
OPTIONAL_COMMAND_MODULES = [
    "xirang.cmd_live",
    "xirang.cmd_jobs",
    "xirang.cmd_sim",
    "xirang.cmd_sweep",
    "xirang.cmd_data",
    "xirang.cmd_security",
    "xirang.cmd_tuning",
    "xirang.cmd_chaos",
    "xirang.cmd_job",
]


class OneLineParser(argparse.ArgumentParser):
    """A bad argument is told in one line that says where to look, not a usage block."""

    def error(self, message: str):
        """Exit 2 with the problem in one line."""
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The `xirang` argument parser with every command registered."""
    parser = OneLineParser(
        prog="xirang", description="Event-sourced GPU job scheduler with safe, atomic, fair preemption."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for name in OPTIONAL_COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one `xirang` command; any failure is one line on stderr and a non-zero exit
    (XIRANG_DEBUG=1 shows tracebacks)."""
    from trust.connect import refuse_password_argument

    refused = refuse_password_argument(sys.argv[1:] if argv is None else argv)
    if refused:
        print(f"xirang: {refused}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except UserError as err:
        print(f"xirang: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM where a command stops on it
        return getattr(err, "exit_code", 130)
    except BrokenPipeError:  # `xirang history | head`: the reader has all it wanted
        return 0
    except Exception as err:  # noqa: BLE001 - every command ends in one line, never a traceback
        if debugging():
            raise
        failure = err.exceptions[0] if isinstance(err, BaseExceptionGroup) and err.exceptions else err
        print(f"xirang: {explain_failure(failure, getattr(args, 'nats', None))}", file=sys.stderr)
        return 3
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
