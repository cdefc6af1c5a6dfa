"""The `or1` command line: each command is a thin call into the module that does the work.

This package holds the Typer app, its groups and what every command shares (the help's look, the examples epilog,
one-line user errors, renamed flags); the commands live one module per job: `inputs` (init-model, prepare-data),
`training` (train, plan, config show), `evaluation` (score, eval, report), `machine` (doctor, sandbox check).
"""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from or1.errors import UserError
from or1.stop import Interrupted


class _PlainHelp:
    """--help without a type placeholder beside it (Typer shows `<bool>` for a flag)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


class Command(_PlainHelp, TyperCommand):
    pass


class Group(_PlainHelp, TyperGroup):
    pass


def examples(*lines: str) -> str:
    """A command's help epilog: its example command lines (tests/test_cli.py runs each with --help appended)."""
    return "Examples:\n\n" + "\n\n".join(lines)


app = typer.Typer(
    cls=Group,
    help="or1: Skywork-OR1 reasoning RL end to end: prepare data, train in stages, score, evaluate.",
    epilog=examples("or1 doctor", "or1 train --recipe stages/tiny.yaml --stage all"),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(
    cls=Group,
    help="Inspect recipes.",
    epilog=examples("or1 config show --recipe stages/tiny.yaml --stage 2"),
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")
sandbox_app = typer.Typer(
    cls=Group, help="The code-execution sandbox.", epilog=examples("or1 sandbox check"), no_args_is_help=True
)
app.add_typer(sandbox_app, name="sandbox")
err_console = Console(stderr=True)
Flag = functools.partial(typer.Option, metavar="")  # an on/off option: no `<bool>` placeholder in the help


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a UserError into one red line and exit code 2, and a stop on Ctrl-C / SIGTERM into one line saying how
    to resume and exit code 130 / 143; bugs keep their traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            # escape: a message may quote text in brackets, such as pip install 'or1[vllm]'
            err_console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except Interrupted as stop:
            err_console.print(
                f"[yellow]{escape(stop.what)}[/yellow]; to resume, run: {escape(rerun_command())}",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(stop.exit_code) from None
        except KeyboardInterrupt:
            # commands without a graceful stop write their output files whole or not at all (or1.atomic)
            err_console.print(
                "interrupted: finished output files are whole (each is written aside, then renamed); to start "
                f"again, run: {escape(rerun_command())}",
                style="yellow",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(130) from None

    return wrapper


def rerun_command() -> str:
    """This command line as typed, minus what would discard the saved work (--resume never, --overwrite, --fresh)."""
    args, out = sys.argv[1:], []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in ("--overwrite", "--fresh", "--resume=never"):
            continue
        elif arg == "--resume" and i + 1 < len(args) and args[i + 1] == "never":
            skip = True
        else:
            out.append(arg)
    return shlex.join(["or1", *out])


def renamed(old: str, new: str, value: Any) -> Any:
    """The value given under a flag's old name, with a one-line note naming the new one (None / False: not given)."""
    if value is not None and value is not False:
        err_console.print(f"note: {old} is now {new}", style="yellow", highlight=False, markup=False)
    return value


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"or1 {version('or1')}")
        except PackageNotFoundError:
            typer.echo("or1 (not installed as a package)")
        raise typer.Exit()


@app.callback()
def main_options(
    show_version: Annotated[
        bool,
        Flag("--version", callback=_version, is_eager=True, help="Print or1's version and exit."),
    ] = False,
) -> None:
    """or1: Skywork-OR1 reasoning RL end to end: prepare data, train in stages, score, evaluate."""


OverwriteOpt = functools.partial(Flag, "--overwrite")


def main() -> None:
    app()


# The commands register themselves on `app` (and its groups) when their modules load, in the order `or1 --help`
# lists them.
from or1.cli import inputs, training, evaluation, machine  # noqa: E402, F401, I001
