"""`warmd cache verify`, `prune`, `export` and `import`: the shared cache's maintenance, every
entry checked as a fetch would check it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from warmd.cli.cache.options import echo_json, json_option, opened_store, store_options
from warmd.errors import WarmdInputError
from warmd.stats import CounterFlag, format_bytes, select


@click.command()
@click.option("--fingerprint", "fingerprints", multiple=True, metavar="FP",
              help="Only these fingerprints (repeatable; default: all).")
@click.option("--quarantine", is_flag=True,
              help="Quarantine corrupt entries (never ones that are only unsigned).")
@store_options
@json_option
def verify(fingerprints, quarantine, config_path, redis_url, as_json) -> None:
    """Check every entry as a fetch would: manifest, signature, chunks, digest, archive
    safety. Exits 1 when any entry is bad."""
    from warmd.store import admin

    with opened_store(config_path, redis_url) as store:
        report = admin.verify(store, fingerprints, quarantine)
    if as_json:
        echo_json(report.to_json())
    else:
        for bad in report.bad:
            click.echo(f"BAD {bad['fingerprint']} {bad['name']}: {bad['reason']}")
        click.echo(f"{report.checked} entries checked: {report.ok} ok, {len(report.bad)} bad"
                   + (f", {report.quarantined} quarantined" if quarantine else ""))
    if report.bad:
        sys.exit(1)


@click.command()
@click.option("--older-than", type=float, metavar="DAYS",
              help="Remove entries not used for this many days.")
@click.option("--fingerprint", "fingerprints", multiple=True, metavar="FP",
              help="Only these fingerprints (repeatable).")
@click.option("--namespace", "namespaces", multiple=True, metavar="NS",
              help="Only fingerprints of this namespace (repeatable).")
@click.option("--all", "everything", is_flag=True,
              help="Remove every entry of the selected fingerprints (needs --fingerprint or "
                   "--namespace).")
@click.option("--dry-run", is_flag=True, help="Report what would go; change nothing.")
@store_options
@json_option
def prune(older_than, fingerprints, namespaces, everything, dry_run, config_path, redis_url,
          as_json) -> None:
    """Remove old or disowned entries, stale index members and unreferenced blobs."""
    from warmd.store import admin

    if older_than is not None and older_than < 0:
        raise WarmdInputError("--older-than must be a number of days >= 0")
    if everything and not (fingerprints or namespaces):
        raise WarmdInputError("--all needs --fingerprint or --namespace")
    with opened_store(config_path, redis_url) as store:
        selected = admin.select_fingerprints(store, fingerprints, namespaces)
        if (fingerprints or namespaces) and not selected:
            raise WarmdInputError("no fingerprint matches the given --fingerprint/--namespace")
        report = admin.prune(store, older_than=None if older_than is None
                             else older_than * 86400, selected=selected,
                             everything=everything, dry_run=dry_run)
    if as_json:
        echo_json(report.to_json())
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb}: {report.entries_removed} entries ({format_bytes(report.bytes_removed)}), "
               f"{report.task_records_removed} task records, {report.fingerprints_removed} "
               f"fingerprints, {report.orphan_blobs_removed} unreferenced blobs, "
               f"{report.stale_index} stale index members")


@click.command(name="export")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--fingerprint", "fingerprints", multiple=True, metavar="FP",
              help="Only these fingerprints (repeatable; default: all).")
@store_options
@json_option
def export_cmd(path, fingerprints, config_path, redis_url, as_json) -> None:
    """Write verified entries to a tar archive (for air-gapped clusters)."""
    from warmd.store import admin

    if not path.parent.is_dir():
        raise WarmdInputError(f"directory {path.parent} does not exist")
    with opened_store(config_path, redis_url) as store:
        counts = admin.export_archive(store, path, fingerprints)
    if as_json:
        echo_json(counts)
    else:
        click.echo(f"exported {counts['entries']} entries ({format_bytes(counts['bytes'])}), "
                   f"{counts['tasks']} task records, {counts['fingerprints']} fingerprints "
                   f"to {path}" + (f"; skipped {counts['skipped']} bad entries"
                                   if counts["skipped"] else ""))


@click.command(name="import")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@store_options
@json_option
def import_cmd(path, config_path, redis_url, as_json) -> None:
    """Import an archive made by `warmd cache export`, verifying every entry as a fetch
    does; refused entries are skipped and counted. An unsafe archive imports nothing."""
    from warmd.store import admin

    if not path.is_file():
        raise WarmdInputError(f"no such archive: {path}")
    with opened_store(config_path, redis_url) as store:
        try:
            counts = admin.import_archive(store, path)
        except admin.UnsafeArchive as exc:
            raise WarmdInputError(f"refusing {path}: {exc}") from None
    if as_json:
        echo_json(counts)
    else:
        refused = sum(counts[s.id] for s in select(CounterFlag.REFUSAL | CounterFlag.ERROR))
        click.echo(f"imported {counts['imported']} entries ({counts['already_present']} "
                   f"already present), {counts['tasks']} task records; refused {refused}")
