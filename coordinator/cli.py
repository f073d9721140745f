"""`coordinator` command line: one sub-command per job."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from coordinator.commands import demo, jaeger, kafka, serve, simulate


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


class _HelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default (the value the environment gave, if any), unless the text already
    names it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (action.default in (None, False, [], "", argparse.SUPPRESS) or "default" in text
                or action.option_strings == []):
            return action.help
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coordinator", description=__doc__, formatter_class=_HelpFormatter)
    parser.add_argument("--log-level", default=os.environ.get("COORDINATOR_LOG_LEVEL", "INFO"),
                        help="DEBUG, INFO, WARNING or ERROR (env COORDINATOR_LOG_LEVEL)")
    parser.add_argument("--event-loop", choices=["auto", "asyncio", "uvloop"],
                        default=os.environ.get("COORDINATOR_EVENT_LOOP", "auto"),
                        help="auto: uvloop when installed, else asyncio (env COORDINATOR_EVENT_LOOP)")
    commands = parser.add_subparsers(dest="command", required=True)
    from analytics.cli import add_analyze_command  # imports pyspark only when `analyze` runs
    from coordinator.telemetry.trace_command import add_trace_command

    for add_parser in (kafka.add_parser, jaeger.add_parser, serve.add_parser, simulate.add_parser, demo.add_parser,
                       add_trace_command, add_analyze_command):  # in the order --help lists them
        add_parser(commands)
    for command in commands.choices.values():
        command.formatter_class = _HelpFormatter
        for action in command._actions:  # argparse prints nothing for an option without help: not even its default
            if action.help is None and action.default not in (None, False, [], "", argparse.SUPPRESS):
                action.help = "default: %(default)s"
    return parser


def _run(coro: Any, event_loop: str) -> int:
    """uvloop when asked for or, with "auto", when installed (the `speed` extra): ~20% more requests per core.
    asyncio's loop takes a bounded number of ready connections a turn (coordinator/server/event_loop.py)."""
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise SystemExit("--event-loop uvloop: uvloop is not installed (pip install '.[speed]')")
        else:
            return uvloop.run(coro)
    from coordinator.server.event_loop import run as event_loop_run  # the server's modules: after --compiled

    return event_loop_run(coro)


def _sub_command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[command]


# the commands that run the service: from this tree's compiled build by default, where there is one
_COMPILED_BY_DEFAULT = frozenset({"serve", "demo"})


def _install_compiled(argv: list[str] | None) -> tuple[Any, str | None]:
    """Before anything imports the service's modules: the compiled modules whose sources still match
    (coordinator/compiled.py), as `--compiled [DIR]`, `--pure` or env COORDINATOR_COMPILED ask, and by default for
    `serve` and `demo` this tree's build when it exists. The decision (None: every module its source) and, when a
    command that would run compiled by default has no build, the line that says so."""
    from coordinator import compiled

    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--log-level")  # the global options that take a value, so that the command is found
    early.add_argument("--event-loop")
    early.add_argument("command", nargs="?")
    early.add_argument("--compiled", nargs="?", const="default", default=os.environ.get(compiled.ENVIRONMENT))
    early.add_argument("--pure", action="store_true")
    asked = early.parse_known_args(sys.argv[1:] if argv is None else argv)[0]
    if asked.pure:
        return None, None
    if asked.compiled is not None:
        directory = compiled.directory_asked(asked.compiled)
        return (None if directory is None else compiled.install(directory)), None
    if asked.command not in _COMPILED_BY_DEFAULT:
        return None, None
    directory = compiled.default_directory()
    if directory is None:
        return None, (f"compiled modules: none, no build in {compiled.DEFAULT_DIRECTORY}: every module runs its "
                      "source (scripts/setup.sh or scripts/build_compiled.py builds one; 0.7-0.8 of the CPU)")
    return compiled.install(directory), None


def main(argv: list[str] | None = None) -> int:
    decision, no_build = _install_compiled(argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "demo":  # said by the sub-command, whose usage lists its flags
        _sub_command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "demo":
        args.serve_args = _sub_command_parser(parser, "serve").parse_args(unknown)  # the service's own flags
    _configure_logging(args.log_level)
    if decision is not None:
        logging.getLogger("coordinator.compiled").log(logging.WARNING if decision.fell_back else logging.INFO,
                                                      decision.summary())
    elif no_build is not None:
        logging.getLogger("coordinator.compiled").info(no_build)
    return _run(args.run(args), args.event_loop)


if __name__ == "__main__":
    sys.exit(main())