"""`warmd cache ...`: the shared compiled-kernel cache (fingerprints, stats, maintenance),
one module per command group; what they share is warmd.cli.cache.options."""

from __future__ import annotations

import click

from warmd.cli.cache.fingerprint import fingerprint, why_cmd
from warmd.cli.cache.ls import ls_cmd
from warmd.cli.cache.maintain import export_cmd, import_cmd, prune, verify
from warmd.cli.cache.server import server
from warmd.cli.cache.stats import stats


@click.group()
def cache() -> None:
    """Inspect and maintain the shared compiled-kernel cache (Redis).

    Every node warming a plan installs what the cluster already compiled and publishes what
    it compiles. See docs/redis.md for deployment (maxmemory, ACL users, TLS).
    """


for command in (fingerprint, why_cmd, stats, ls_cmd, verify, prune, export_cmd, import_cmd,
                server):
    cache.add_command(command)


def register(main: click.Group) -> None:
    main.add_command(cache)
