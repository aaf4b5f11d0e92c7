"""What every `warmd cache` command shares: the options saying which shared cache it talks to
(--config, --redis) and --json, the store they open (exit 1 with one line when there is none
or it fails), and the small renderings of their output."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

import click

from warmd.stats import format_seconds

if TYPE_CHECKING:
    from warmd.cluster.command_store import CommandStore
    from warmd.context import NodeContext
    from warmd.store import SharedCache

STORE_HELP = ("Shared cache URL: redis://[user:password@]host:port/db, rediss:// for TLS, "
              "redis+cluster:// (or ?cluster=true) for Redis Cluster, sqlite:///path for one "
              "SQLite file. Default: the store of "
              "--config, else WARMD_REDIS_URL, else WARMD_CONFIG's, else the one the running "
              "daemon (`warmd start`) uses, else the embedded server if it runs (never "
              "started by this command).")
NOT_RUNNING = 3  # the LSB init-script status code for "not running"
CONFIG_HELP = ("warmd.yaml whose store (redis.url, redis.namespace, signing_key_file) to use "
               "(default: WARMD_CONFIG, else the running daemon's).")


def fail(message: str) -> NoReturn:
    click.echo(f"warmd: error: {message}", err=True)
    sys.exit(1)


def store_options(func):
    """--config and --redis: which shared cache a command talks to (command_store)."""
    func = click.option("--redis", "redis_url", metavar="URL", help=STORE_HELP)(func)
    return click.option("--config", "-c", "config_path", metavar="PATH",
                        help=CONFIG_HELP)(func)


def json_option(func):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)


def opened_store(config_path: str | None, redis_url: str | None
                 ) -> contextlib.AbstractContextManager[SharedCache]:
    """The daemon's shared cache (warmd.cluster.command_store: never started here),
    open, with the daemon's namespace and signing key. Exit 1 with one line when there is
    none, when it is unreachable, or when a store command fails."""
    from warmd.cluster.command_store import command_store

    return opened(command_store(config_path, redis_url))


@contextlib.contextmanager
def opened(store: CommandStore) -> Iterator[SharedCache]:
    from warmd.store import StoreFailed

    if store.url is None:
        fail(store.problem or "no shared cache")
    cache = _open(store.url, store.context())
    try:
        yield cache
    except StoreFailed as failed:
        fail(f"shared cache {cache.display_url}: {failed}")
    finally:
        cache.close()


def _open(url: str, context: NodeContext) -> SharedCache:
    from warmd.store import open_shared_cache

    # An admin command reports an unreachable store itself, as its one error line; the
    # store's degrade-and-continue warning (meant for warmups) would say it twice.
    store_log = logging.getLogger("warmd.store")
    level = store_log.level
    store_log.setLevel(logging.ERROR)
    try:
        cache = open_shared_cache(url, context)
    finally:
        store_log.setLevel(level)
    if cache.disabled_reason:
        cache.close()
        fail(f"no shared cache: {cache.disabled_reason}")
    if not cache.reachable:
        cache.close()
        fail(f"shared cache {cache.display_url} unreachable: {cache.last_error}")
    return cache


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def ago(when: float | None) -> str:
    if not when:
        return "-"
    return format_seconds(max(0.0, time.time() - when)) + " ago"
