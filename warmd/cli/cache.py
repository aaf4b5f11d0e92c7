"""`warmd cache ...`: the shared compiled-kernel cache (fingerprints, stats, maintenance)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click
from rich.console import RenderableType

from warmd import knobs
from warmd.cli.render import Col, console_width, fitted_table, fold, make_console, wrapped
from warmd.errors import WarmdInputError
from warmd.stats import (
    CounterFlag,
    Counters,
    format_bytes,
    format_seconds,
    format_value,
    hit_rate,
    render_details,
    select,
)

if TYPE_CHECKING:
    from warmd.cluster.client import CommandStore
    from warmd.store import SharedCache

STORE_HELP = ("Shared cache URL: redis://[user:password@]host:port/db, rediss:// for TLS, "
              "redis+cluster:// (or ?cluster=true) for Redis Cluster. Default: the store of "
              "--config, else WARMD_REDIS_URL, else WARMD_CONFIG's, else the one the running "
              "daemon (`warmd start`) uses, else the embedded server if it runs (never "
              "started by this command).")
NOT_RUNNING = 3  # the LSB init-script status code for "not running"
CONFIG_HELP = ("warmd.yaml whose store (redis.url, redis.namespace, signing_key_file) to use "
               "(default: WARMD_CONFIG, else the running daemon's).")


def _fail(message: str) -> NoReturn:
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
    """The daemon's shared cache (warmd.cluster.client.command_store: never started here),
    open, with the daemon's namespace and signing key. Exit 1 with one line when there is
    none, when it is unreachable, or when a store command fails."""
    from warmd.cluster.client import command_store

    return _opened(command_store(config_path, redis_url))


@contextlib.contextmanager
def _opened(store: CommandStore) -> Iterator[SharedCache]:
    from warmd.store import StoreFailed

    if store.url is None:
        _fail(store.problem or "no shared cache")
    with knobs.scoped_env(store.env()):
        cache = _open(store.url)
        try:
            yield cache
        except StoreFailed as failed:
            _fail(f"shared cache {cache.display_url}: {failed}")
        finally:
            cache.close()


def _open(url: str) -> SharedCache:
    from warmd.store import open_shared_cache

    # An admin command reports an unreachable store itself, as its one error line; the
    # store's degrade-and-continue warning (meant for warmups) would say it twice.
    store_log = logging.getLogger("warmd.store")
    level = store_log.level
    store_log.setLevel(logging.ERROR)
    try:
        cache = open_shared_cache(url)
    finally:
        store_log.setLevel(level)
    if cache.disabled_reason:
        cache.close()
        _fail(f"no shared cache: {cache.disabled_reason}")
    if not cache.reachable:
        cache.close()
        _fail(f"shared cache {cache.display_url} unreachable: {cache.last_error}")
    return cache


def _echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def _ago(when: float | None) -> str:
    if not when:
        return "-"
    return format_seconds(max(0.0, time.time() - when)) + " ago"


@click.group()
def cache() -> None:
    """Inspect and maintain the shared compiled-kernel cache (Redis).

    Every node warming a plan installs what the cluster already compiled and publishes what
    it compiles. See docs/redis.md for deployment (maxmemory, ACL users, TLS).
    """


# ----------------------------------------------------------------------------- fingerprint

def _adapters(libraries: tuple[str, ...], target):
    from warmd.libraries import LIBRARIES, check_library_name

    for name in libraries or LIBRARIES:
        library = check_library_name(name)
        if library not in LIBRARIES:
            raise WarmdInputError(f"{library} has no shared cache; libraries with one: "
                                  f"{', '.join(LIBRARIES)}")
        registered = LIBRARIES[library]
        yield library, registered.make_adapter(registered.root.default(), target.arch)


@cache.command()
@click.option("--library", "libraries", multiple=True, metavar="LIB",
              help="A library with a cache (repeatable; default: every one).")
@click.option("--target", "-t", metavar="PRESET", help="GPU preset instead of the local GPU.")
@click.option("--capability", metavar="X.Y", help="Compute capability instead of the local GPU.")
@click.option("--sms", type=int, help="SM count of the target.")
@click.option("--config", "-c", "config_path", metavar="PATH",
              help="warmd.yaml whose redis.namespace to use (default: WARMD_CONFIG, else the "
                   "running daemon's).")
@click.option("--explain", is_flag=True,
              help="Say why each input is in (what the library's own key depends on) and "
                   "what is deliberately left out.")
@json_option
def fingerprint(libraries, target, capability, sms, config_path, explain, as_json) -> None:
    """Show the compatibility fingerprint of each library's cache on this node.

    Shared entries are kept per fingerprint: library version and install path, target arch
    and SM count, CUDA toolkit and driver major version, compiler and the namespace (the
    daemon's redis.namespace, WARMD_NAMESPACE overriding it). Nodes with equal fingerprints
    share entries.
    """
    from warmd.cluster.client import command_store
    from warmd.store import compute_fingerprint
    from warmd.store.fingerprint import COMMON_INPUTS
    from warmd.targets import resolve_target

    resolved = resolve_target(target, capability, sms)
    results = []
    with knobs.scoped_env(command_store(config_path).env()):
        for library, adapter in _adapters(tuple(libraries), resolved):
            if adapter is None:
                results.append({"library": library, "digest": None, "inputs": {},
                                "error": f"{library} is not installed here"})
                continue
            item = compute_fingerprint(adapter, resolved).to_json()
            if explain:
                reasons = {**COMMON_INPUTS, **adapter.input_reasons}
                item["why"] = {k: reasons.get(k, ("-", "-"))[0] for k in item["inputs"]}
                item["not_inputs"] = dict(adapter.not_inputs)
            results.append(item)
    if as_json:
        _echo_json(results)
        return
    for item in results:
        if item["digest"] is None:
            click.echo(f"{item['library']}: {item['error']}")
            continue
        click.echo(f"{item['library']}  {item['digest']}")
        for key, value in sorted(item["inputs"].items()):
            shown = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
            for line in fold(f"  {key:<18} {shown}", console_width(), " " * 21):
                click.echo(line)
            if explain:
                for line in wrapped(f"why: {item['why'][key]}", indent=" " * 21):
                    click.echo(line)
        for key, reason in sorted(item.get("not_inputs", {}).items()):
            for line in wrapped(f"not an input: {key}: {reason}", indent="  "):
                click.echo(line)


@cache.command("why")
@click.argument("name")
@click.option("--library", metavar="LIB",
              help="The library of NAME (default: the task key's first part, else every "
                   "library with a cache).")
@click.option("--target", "-t", metavar="PRESET", help="GPU preset instead of the local GPU.")
@click.option("--capability", metavar="X.Y", help="Compute capability instead of the local GPU.")
@click.option("--sms", type=int, help="SM count of the target.")
@store_options
@json_option
def why_cmd(name, library, target, capability, sms, config_path, redis_url, as_json) -> None:
    """Why this node misses NAME (a task key as `warmd plan` lists it, or an entry name).

    Finds the fingerprints NAME is published under and compares each one's inputs with
    this node's: the inputs that differ, why the library's key depends on each, and what
    to change.
    """
    from warmd.libraries import LIBRARIES
    from warmd.store import compute_fingerprint
    from warmd.store.admin.why import why
    from warmd.targets import resolve_target

    resolved = resolve_target(target, capability, sms)
    head = name.split("/", 1)[0]
    names = (library,) if library else (head,) if head in LIBRARIES else tuple(LIBRARIES)
    answers = []
    with opened_store(config_path, redis_url) as store:
        for _library, adapter in _adapters(names, resolved):
            if adapter is not None:
                mine = compute_fingerprint(adapter, resolved)
                answers.append(why(store, mine, name, adapter.input_reasons))
    found = [a for a in answers if a.hit or a.elsewhere] or answers[:1]
    if as_json:
        _echo_json([a.to_json() for a in found])
        return
    if not found:
        _fail(f"no library with a cache is installed here for {name}")
    for answer in found:
        for line in _why_lines(answer):
            body = line.lstrip(" ")
            for part in wrapped(body, indent=line[:len(line) - len(body)]):
                click.echo(part)


def _why_lines(answer) -> list[str]:
    head = f"{answer.name} ({answer.library}, this node's fingerprint {answer.here})"
    if answer.hit:
        return [f"{head}: published under this node's fingerprint; a fetch here finds it "
                "(`warmd cache verify` checks the entry itself)"]
    if not answer.elsewhere:
        return [f"{head}: not published under any {answer.library} fingerprint: no node "
                "built it yet, or it was evicted or pruned"]
    lines = [f"{head}: published only under another fingerprint"]
    for fp, diffs in answer.elsewhere.items():
        lines.append(f"  under {fp}, which differs in {', '.join(d.input for d in diffs)}:")
        for d in diffs:
            lines.append(f"    {d.input}: here {_shown(d.here)}, there {_shown(d.there)}")
            lines.append(f"      why: {d.why}")
            lines.append(f"      change: {d.change}")
    return lines


def _shown(value) -> str:
    if value is None:
        return "(none)"
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else str(value)


# ----------------------------------------------------------------------------- stats

@cache.command()
@store_options
@json_option
def stats(config_path, redis_url, as_json) -> None:
    """Cluster-wide counters, per node and per fingerprint (sccache style): every warmup
    that used the store, summed per machine since the store began (`warmd status` sums
    each selected node's last warmup instead), and the store's size and capacity."""
    from warmd.cli.status_view import store_lines
    from warmd.cluster.client import command_store, store_size
    from warmd.store import admin

    target = command_store(config_path, redis_url)
    with _opened(target) as store:
        data = admin.read_stats(store)
    size = store_size(target)
    data["store_size"] = size.to_json() if size else None
    if as_json:
        _echo_json(data)
        return
    totals = data["totals"]
    summary = Counters.from_json(totals)
    click.echo(f"Shared cache {data['store']}: {len(data['nodes'])} machine(s), "
               f"{len(data['fingerprints'])} fingerprint(s)")
    click.echo(summary.render_text("Totals (every warmup since the store began)"))
    for line in render_details(totals):
        click.echo(line)
    for line in store_lines(size):
        click.echo(line)
    click.echo(f"Key proof: {data['key_proof']['describe']}")
    console = make_console()
    if data["nodes"]:
        console.print(_node_table(data["nodes"]))
    if data["fingerprints"]:
        console.print(_fp_table(data["fingerprints"]))


def _counter_columns(column: CounterFlag) -> list[tuple[str, Callable[[dict], str]]]:
    """(header, cell of a counter dict) for a stats table's counter columns (the counters
    flagged `column`), with the hit rate after the kernel outcomes when all are shown."""
    out: list[tuple[str, Callable[[dict], str]]] = []
    every_outcome = select(column | CounterFlag.KERNEL) == select(CounterFlag.KERNEL)
    for stat in select(column):
        out.append((stat.column or stat.id,
                    lambda c, stat=stat: format_value(stat, c.get(stat.id, 0))))
        if every_outcome and stat == select(CounterFlag.KERNEL)[-1]:
            out.append(("hit rate", _rate))
    return out


def _rate(counters: dict) -> str:
    rate = hit_rate(counters)
    return "-" if rate is None else f"{100 * rate:.1f} %"


def _node_table(nodes: dict) -> RenderableType:
    counter_cols = _counter_columns(CounterFlag.NODE_COLUMN)
    columns = [Col("node", "id"), *(Col(h, justify="right", dropped=h != "hit rate")
                                    for h, _ in counter_cols),
               Col("last seen", justify="right", dropped=True)]
    rows = []
    for node, c in sorted(nodes.items()):
        counters = Counters.from_json(c).to_json()
        rows.append([node, *(cell(counters) for _h, cell in counter_cols),
                     _ago(c.get("last_seen"))])
    return fitted_table("Per node", columns, rows)


def _fp_table(fps: dict) -> RenderableType:
    counter_cols = _counter_columns(CounterFlag.FP_COLUMN)
    columns = [Col("fingerprint", "id"), Col("library"),
               Col("namespace", "id", dropped=True), Col("entries", justify="right"),
               *(Col(h, justify="right", dropped=True) for h, _ in counter_cols)]
    rows = [[fp, info["library"], str(info["namespace"] or "-"), str(info["entries"]),
             *(cell(info["counters"]) for _h, cell in counter_cols)]
            for fp, info in sorted(fps.items())]
    return fitted_table("Per fingerprint", columns, rows)


# ----------------------------------------------------------------------------- ls

@cache.command(name="ls")
@click.option("--fingerprint", "fingerprint_", metavar="FP",
              help="List this fingerprint's entries instead of the fingerprints.")
@click.option("--learned", is_flag=True,
              help="List learned entries: what nodes compiled after READY that no plan named, "
                   "per plan, with the planner rule that missed each.")
@click.option("--plan", "plan_key", metavar="KEY", help="With --learned: only this plan.")
@store_options
@json_option
def ls_cmd(fingerprint_, learned, plan_key, config_path, redis_url, as_json) -> None:
    """List fingerprints (entries, bytes, last use), the entries of one fingerprint, or the
    learned entries (--learned)."""
    from warmd.store import admin

    if plan_key and not learned:
        raise click.UsageError("--plan goes with --learned")
    with opened_store(config_path, redis_url) as store:
        where = store.display_url
        if learned:
            indexes = admin.learned_indexes(store, plan_key)
        elif fingerprint_:
            found = admin.entries(store, fingerprint_)
        else:
            rows = admin.listing(store)
    if learned:
        show_learned(indexes, as_json, f"Learned entries in {where}")
        return
    if fingerprint_:
        items = [admin.entry_json(i) for i in found]
        if as_json:
            _echo_json(items)
            return
        columns = [Col("name", "id"), Col("size", justify="right"), Col("producer", "id"),
                   Col("compile", justify="right"), Col("created", dropped=True),
                   Col("last used", dropped=True), Col("state")]
        rows = [[i["name"], format_bytes(i.get("size", 0)), i.get("producer", "-"),
                 format_seconds(i.get("compile_seconds", 0.0)), _ago(i.get("created")),
                 _ago(i["last_used"]), i["state"]] for i in items]
        make_console().print(fitted_table(f"Entries of {fingerprint_}", columns, rows))
        return
    if as_json:
        _echo_json(rows)
        return
    columns = [Col("fingerprint", "id"), Col("library"), Col("version", "id"),
               Col("arch", dropped=True), Col("sms", dropped=True),
               Col("namespace", "id", dropped=True), Col("entries", justify="right"),
               Col("bytes", justify="right"), Col("last used", dropped=True)]
    cells = []
    for r in rows:
        inputs = r["inputs"]
        version = inputs.get("version") or inputs.get("flashinfer") or "-"
        cells.append([r["fingerprint"], r["library"], str(version), str(inputs.get("arch", "-")),
                      str(inputs.get("sms", "-")), str(inputs.get("namespace", "-")),
                      str(r["entries"]), format_bytes(r["bytes"]), _ago(r["last_used"])])
    make_console().print(fitted_table(f"Fingerprints in {store.display_url}", columns, cells))


def show_learned(indexes: list[dict], as_json: bool, title: str) -> None:
    """Learned entries (store.admin.learned_indexes) as a table, or JSON rows."""
    from warmd.capture import learned_rows

    rows = learned_rows(indexes)
    if as_json:
        _echo_json(rows)
        return
    columns = [Col("plan", "id"), Col("library"), Col("entry", "id"),
               Col("missed by", "text")]
    make_console().print(fitted_table(f"{title} ({len(rows)})", columns, [
        [r["plan"], r["library"], r["entry"], r["missed_by"]] for r in rows]))


# ----------------------------------------------------------------------------- verify

@cache.command()
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
        _echo_json(report.to_json())
    else:
        for bad in report.bad:
            click.echo(f"BAD {bad['fingerprint']} {bad['name']}: {bad['reason']}")
        click.echo(f"{report.checked} entries checked: {report.ok} ok, {len(report.bad)} bad"
                   + (f", {report.quarantined} quarantined" if quarantine else ""))
    if report.bad:
        sys.exit(1)


# ----------------------------------------------------------------------------- prune

@cache.command()
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
        _echo_json(report.to_json())
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb}: {report.entries_removed} entries ({format_bytes(report.bytes_removed)}), "
               f"{report.task_records_removed} task records, {report.fingerprints_removed} "
               f"fingerprints, {report.orphan_blobs_removed} unreferenced blobs, "
               f"{report.stale_index} stale index members")


# ----------------------------------------------------------------------------- export/import

@cache.command(name="export")
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
        _echo_json(counts)
    else:
        click.echo(f"exported {counts['entries']} entries ({format_bytes(counts['bytes'])}), "
                   f"{counts['tasks']} task records, {counts['fingerprints']} fingerprints "
                   f"to {path}" + (f"; skipped {counts['skipped']} bad entries"
                                   if counts["skipped"] else ""))


@cache.command(name="import")
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
        _echo_json(counts)
    else:
        refused = sum(counts[s.id] for s in select(CounterFlag.REFUSAL | CounterFlag.ERROR))
        click.echo(f"imported {counts['imported']} entries ({counts['already_present']} "
                   f"already present), {counts['tasks']} task records; refused {refused}")


# ----------------------------------------------------------------------------- server

@cache.group()
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
    _echo_json(_server_json(found)) if as_json else _print_server(found)
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
        _fail(str(exc))
    _echo_json(_server_json(found)) if as_json else _print_server(found)


@server.command(name="stop")
def server_stop() -> None:
    """Stop the embedded server cleanly (its data stays in the state dir)."""
    from warmd.store import stop_embedded

    click.echo("embedded server stopped" if stop_embedded() else
               "embedded server: not running")


def register(main: click.Group) -> None:
    main.add_command(cache)
