"""`warmd cache stats`: cluster-wide counters per node and per fingerprint, and the store's
size and capacity."""

from __future__ import annotations

from collections.abc import Callable

import click
from rich.console import RenderableType

from warmd.cli.cache.options import ago, echo_json, json_option, opened, store_options
from warmd.cli.render import Col, fitted_table, make_console
from warmd.stats import CounterFlag, Counters, format_value, hit_rate, render_details, select


@click.command()
@store_options
@json_option
def stats(config_path, redis_url, as_json) -> None:
    """Cluster-wide counters, per node and per fingerprint (sccache style): every warmup
    that used the store, summed per machine since the store began (`warmd status` sums
    each selected node's last warmup instead), and the store's size and capacity."""
    from warmd.cli.status_view import store_lines
    from warmd.cluster.command_store import command_store, store_size
    from warmd.store import admin

    target = command_store(config_path, redis_url)
    with opened(target) as store:
        data = admin.read_stats(store)
    size = store_size(target)
    data["store_size"] = size.to_json() if size else None
    if as_json:
        echo_json(data)
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
                     ago(c.get("last_seen"))])
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
