"""The `warmd` command line."""

from __future__ import annotations

import sys

import click

from warmd import __version__
from warmd.errors import WarmdInputError


class WarmdGroup(click.Group):
    """Turns bad input into one line on stderr and exit code 2, never a traceback."""

    def invoke(self, ctx: click.Context):
        from warmd.store.credentials import protect_environment

        try:
            protect_environment()  # before any child starts: no secret in its environment
            return super().invoke(ctx)
        except WarmdInputError as exc:
            click.echo(f"warmd: error: {exc}", err=True)
            sys.exit(2)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx else "warmd"
            message = exc.format_message()
            if isinstance(exc, click.NoSuchOption):
                from warmd.engines.launch import engine_flag_hint

                hint = engine_flag_hint(exc.option_name, where)
                message = hint or message
            click.echo(f"warmd: error: {message} (see '{where} --help')", err=True)
            sys.exit(2)


@click.group(cls=WarmdGroup, context_settings={"help_option_names": ["-h", "--help"],
                                               "max_content_width": 100})
@click.version_option(__version__, prog_name="warmd")
def main() -> None:
    """warmd: decide, compile and share the GPU kernels an inference engine will need.

    \b
    Typical flow:
      warmd plan --model PATH --tp 8 --target h200  # what will be compiled, why
      warmd warmup --model PATH --tp 8              # compile it, share via Redis
      warmd start                                   # warm every GPU node (Ray)
    """


def _register() -> None:
    from warmd.cli import plan as plan_cmd

    main.add_command(plan_cmd.plan)
    for module in ("warmup", "verify", "cache", "daemon"):
        try:
            mod = __import__(f"warmd.cli.{module}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"warmd.cli.{module}":
                raise
            continue
        mod.register(main)


_register()
