"""The command line: argv, exit codes and stdout live here and in ``commands/``, nowhere else."""

from __future__ import annotations

import importlib
import os
import sys
from gettext import gettext

import click
from click.utils import make_default_short_help

from nsysfrag import __version__, destinations
from nsysfrag.errors import EXIT_INPUT, NsysfragError
from nsysfrag.printable import printable

# Commands load on first use: `nsysfrag analyze` should not pay for importing the what-if
# models, the history store or the nsys runner (startup is part of every CI gate's time).
COMMANDS = {
    "analyze": "nsysfrag.commands.analyze:analyze_command",
    "compare": "nsysfrag.commands.compare:compare_command",
    "history": "nsysfrag.commands.history:history_command",
    "profile": "nsysfrag.commands.profile:profile_command",
    "record": "nsysfrag.commands.record:record_command",
    "whatif": "nsysfrag.commands.whatif:whatif_command",
}

# Each command's summary: the first paragraph of its help, which is all `nsysfrag --help` shows
# of it, so that listing the commands imports none of them (all six: 617 modules, 0.46 s).
# tests/test_cli.py holds each to its command's own help.
SUMMARIES = {
    "analyze": "Replay a trace's device allocations and report how fragmented memory got.",
    "compare": "Compare two runs: the state at peak memory, at worst fragmentation and at the"
    " end, side by side, and the allocation sites whose live, stranded and hole bytes changed"
    " most, with a verdict in words.",
    "history": "List the runs recorded with `analyze --record`, draw a metric's trend, or check"
    " the newest run for a regression.",
    "profile": "Run COMMAND under nsys with allocation tracking, export the report, and"
    " analyze it.",
    "record": "Run COMMAND with a recorder in each of its Python processes, then analyze what"
    " it wrote.",
    "whatif": "Replay a run's allocations through other allocators and recommend the fix.",
}


class _UserError(click.ClickException):
    """An NsysfragError as click sees it: one line, the error's own exit code."""

    def __init__(self, err: NsysfragError) -> None:
        super().__init__(str(err))
        # click declares exit_code per class; ours varies with the error (2 input, 3 nsys).
        self.exit_code = err.exit_code  # type: ignore[misc]

    def show(self, file: object = None) -> None:
        say_error(self.format_message())


def say_error(message: str) -> None:
    """The one line every failure ends with; a path's newline or escape code stays visible."""
    click.echo(f"nsysfrag: error: {printable(message)}", err=True)


def _usage_line(err: click.UsageError) -> str:
    """click's three-line usage error as one line that still says where to read more."""
    command = err.ctx.command_path if err.ctx is not None else "nsysfrag"
    return f"{err.format_message().rstrip('.')} (see '{command} --help')"


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute = COMMANDS[cmd_name].split(":")
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own listing (``Group.format_commands``), from :data:`SUMMARIES` rather than
        each command imported."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, make_default_short_help(SUMMARIES[name], limit)) for name in names]
        with formatter.section(gettext("Commands")):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except NsysfragError as err:
            raise _UserError(err) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nsysfrag")
def cli() -> None:
    """How fragmented is GPU device memory, how it got that way, and what to change."""



EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it

# click 8.2+ raises this for a group run without a command; 8.1 prints the help and exits 0.
_NO_ARGS: type[Exception] | tuple[()] = getattr(click.exceptions, "NoArgsIsHelpError", ())


def main(argv: list[str] | None = None) -> None:
    """Entry point: turn every expected failure into one line on stderr and an exit code."""
    try:
        _main(argv)
    except SystemExit as done:
        if done.code != EXIT_INTERRUPTED:  # a user who pressed Ctrl-C wants nothing more run
            _compile_later()
        raise


def _compile_later() -> None:
    """Kernels this run interpreted for want of a cached one: compiled after it, detached
    (nsysfrag.background_compile), so the next run loads them."""
    if "nsysfrag.interpreted" in sys.modules:  # no kernel ran otherwise: nothing to import
        from nsysfrag import background_compile

        background_compile.start()


def _main(argv: list[str] | None) -> None:
    destinations.begin_run()
    try:
        # Without standalone mode click returns a command's exit code instead of exiting.
        code = cli.main(args=argv, prog_name="nsysfrag", standalone_mode=False)
    except NsysfragError as err:  # raised outside a command, e.g. while parsing options
        _UserError(err).show()
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except _NO_ARGS as err:  # bare `nsysfrag`: what it can do (click 8.1 exits 0 by itself)
        context = getattr(err, "ctx", None)
        click.echo(context.get_help() if context is not None else str(err))
        sys.exit(0)
    except click.UsageError as err:  # a bad option or argument: still one line
        say_error(_usage_line(err))
        sys.exit(err.exit_code)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except (click.Abort, KeyboardInterrupt):
        click.echo("nsysfrag: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as err:  # a bug: still one line, with the way to see more
        if os.environ.get("NSYSFRAG_DEBUG"):
            raise
        click.echo(
            f"nsysfrag: internal error: {type(err).__name__}: {printable(str(err))} (set"
            " NSYSFRAG_DEBUG=1 for the traceback and please report it)",
            err=True,
        )
        sys.exit(EXIT_INPUT)
    sys.exit(code if isinstance(code, int) else 0)


def run() -> None:
    """The console script: :func:`main`, then leave without tearing the interpreter down.

    Freeing a large analysis object by object at exit takes a quarter of a second per couple
    of million events and serves no purpose: every report is written and closed by then.
    """
    try:
        main()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        for stream in (sys.stdout, sys.stderr):
            if stream is None:  # started with the stream closed (`>&-`): nothing to flush
                continue
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (`… --json - | head`): nothing to save
                pass
        os._exit(code)
