"""The jbkv command line: thin commands that parse, call the library and render."""

from __future__ import annotations

import os

import typer
from typer.core import TyperGroup

from jbkv_cli import __version__
from jbkv_cli.utils import distributed, library_output, lifecycle
from jbkv_cli.utils.console import error, out, reader_gone
from jbkv_cli.utils.errors import JbkvError


def _click_classes() -> tuple[type[Exception], type[Exception]]:
    """click's ``UsageError`` and ``ClickException`` as the installed Typer raises them.

    Typer 0.12–0.1x re-exports click's classes; newer Typer vendors its own copy of click, whose
    classes are not ``click``'s. Both raise ``typer.BadParameter``, so take them from its MRO.
    """
    mro = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
    return mro["UsageError"], mro["ClickException"]


_CLICK_USAGE, _CLICK_ERROR = _click_classes()
library_output.install()  # transformers' and diffusers' logs and bars through jbkv's stderr


def exit_code_for(exc: BaseException) -> int:
    """Print ``exc`` as one line on stderr and return its exit code.

    Usage errors 2, known failures 1, Ctrl-C 130, SIGTERM 143, SIGHUP 129 (the handler of
    :mod:`jbkv_cli.utils.lifecycle` raises them as ``KeyboardInterrupt``), a reader of stdout that
    left early 0 and nothing printed (``jbkv … | head``); anything unexpected is one line with
    its type (``JBKV_DEBUG=1`` re-raises it for the traceback).
    """
    if isinstance(exc, BrokenPipeError) and reader_gone():  # `jbkv … | head`: not a failure
        return 0
    if isinstance(exc, KeyboardInterrupt):
        # every write goes through jbkv_cli.utils.atomic, whose temp file is removed on the way out
        error(f"{lifecycle.describe(exc)}; completed files are kept, no partial file is left")
        return lifecycle.exit_code_of(exc)
    if isinstance(exc, JbkvError):
        if not getattr(exc, "quiet", False):  # another rank already printed it
            error(str(exc))
        return exc.exit_code
    if isinstance(exc, _CLICK_USAGE):
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        # newer Typer words a bad choice "…: Value error, 'x' is not one of …"
        message = exc.format_message().replace(": Value error, ", ": ", 1)
        error(f"{message}{hint}")
        return 2
    if isinstance(exc, _CLICK_ERROR):
        error(exc.format_message())
        return exc.exit_code
    if isinstance(exc, typer.Abort):
        error("aborted")
        return 1
    if isinstance(exc, OSError) and exc.filename and not os.environ.get("JBKV_DEBUG"):
        error(f"cannot access {exc.filename}: {exc.strerror or exc}")
        return 1
    if os.environ.get("JBKV_DEBUG"):
        raise exc
    error(f"{lifecycle.one_line(exc)} (set JBKV_DEBUG=1 for the traceback)")
    return 1


def _passes_through(exc: BaseException) -> bool:
    """``typer.Exit`` (``--help``, explicit exit codes) and no-arguments help go on unchanged."""
    return isinstance(exc, typer.Exit) or type(exc).__name__ == "NoArgsIsHelpError"


class _Group(TyperGroup):
    """Maps every failure to one line on stderr and an exit code (also under ``CliRunner``)."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:
            if _passes_through(exc):
                raise
            raise typer.Exit(exit_code_for(exc)) from None

    def invoke(self, ctx):
        try:
            with lifecycle.command():  # SIGINT, SIGTERM and SIGHUP raise from here on
                result = super().invoke(ctx)
        except (Exception, KeyboardInterrupt) as exc:
            if _passes_through(exc):
                lifecycle.finished(getattr(exc, "exit_code", 0))
                raise
            code = exit_code_for(exc)
            lifecycle.finished(code)  # a later signal only makes the exit immediate
            distributed.abort(exc)  # under torchrun: tell the other ranks, then exit
            raise typer.Exit(code) from None
        lifecycle.finished(0)
        return result


app = typer.Typer(
    cls=_Group,
    name="jbkv",
    help="KV-cache quantization and Jensen-bias correction for chunk-wise AR video diffusion.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"jbkv {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """jbkv: measure what INT2/INT4 KV caches cost a video model, and what the correction wins back."""


def _register_commands() -> None:
    from jbkv_cli.cli.commands import (
        calibrate,
        convert,
        demo,
        experiment,
        fidelity,
        llm,
        plan,
        profile,
        vbench,
        weights,
    )

    experiment.register(app)
    profile.register(app)
    fidelity.register(app)
    vbench.register(app)
    weights.register(app)
    convert.register(app)
    llm.register(app)
    demo.register(app)
    plan.register(app)
    calibrate.register(app)


_register_commands()


def main() -> None:
    """Run the CLI (see :mod:`jbkv_cli.cli.entry` for the console script)."""
    app(prog_name="jbkv")
