"""`warmd cache server ...`: the embedded Redis-protocol server of this state dir."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from warmd.cli.cache.options import NOT_RUNNING, echo_json, fail, json_option


@click.group()
def server() -> None:
    """The embedded Redis-protocol server warmd runs when no Redis URL is configured."""


def _server_json(found) -> dict:
    from warmd.store import redact

    return {"running": found is not None,
            **({"url": redact(found.url), "pid": found.pid, "port": found.port,
                "data_dir": str(found.data_dir), "binary": found.binary,
                "started_by": found.started_by.value if found.started_by else None}
               if found else {})}


def _print_server(found) -> None:
    if found is None:
        click.echo("embedded server: not running")
    else:
        info = _server_json(found)
        started = f", started by {info['started_by']}" if info["started_by"] else ""
        click.echo(f"embedded server: {info['url']} (pid {info['pid']}, "
                   f"{Path(info['binary']).name}, data in {info['data_dir']}{started})")


@server.command(name="status")
@json_option
def server_status(as_json) -> None:
    """Whether the embedded server of this state dir (WARMD_STATE_DIR) is running.

    Exit codes (the LSB's for a service's status): 0 running, 3 not running.
    """
    from warmd.store import embedded_status

    found = embedded_status()
    echo_json(_server_json(found)) if as_json else _print_server(found)
    if found is None:
        sys.exit(NOT_RUNNING)


@server.command(name="start")
@json_option
def server_start(as_json) -> None:
    """Start the embedded server (or find the running one). It then stays up until `warmd
    cache server stop`: `warmd stop` leaves it running."""
    from warmd.store import EmbeddedServerError, StartedBy, ensure_embedded

    try:
        found = ensure_embedded(started_by=StartedBy.SERVER_COMMAND)
    except EmbeddedServerError as exc:
        fail(str(exc))
    echo_json(_server_json(found)) if as_json else _print_server(found)


@server.command(name="stop")
def server_stop() -> None:
    """Stop the embedded server cleanly (its data stays in the state dir)."""
    from warmd.store import stop_embedded

    click.echo("embedded server stopped" if stop_embedded() else
               "embedded server: not running")
