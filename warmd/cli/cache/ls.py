"""`warmd cache ls`: the fingerprints in the shared cache, the entries of one, or the learned
entries (kernels compiled after READY that no plan named)."""

from __future__ import annotations

import click

from warmd.cli.cache.options import ago, echo_json, json_option, opened_store, store_options
from warmd.cli.render import Col, fitted_table, make_console
from warmd.stats import format_bytes, format_seconds


@click.command(name="ls")
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
            echo_json(items)
            return
        columns = [Col("name", "id"), Col("size", justify="right"), Col("producer", "id"),
                   Col("compile", justify="right"), Col("created", dropped=True),
                   Col("last used", dropped=True), Col("state")]
        rows = [[i["name"], format_bytes(i.get("size", 0)), i.get("producer", "-"),
                 format_seconds(i.get("compile_seconds", 0.0)), ago(i.get("created")),
                 ago(i["last_used"]), i["state"]] for i in items]
        make_console().print(fitted_table(f"Entries of {fingerprint_}", columns, rows))
        return
    if as_json:
        echo_json(rows)
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
                      str(r["entries"]), format_bytes(r["bytes"]), ago(r["last_used"])])
    make_console().print(fitted_table(f"Fingerprints in {store.display_url}", columns, cells))


def show_learned(indexes: list[dict], as_json: bool, title: str) -> None:
    """Learned entries (store.admin.learned_indexes) as a table, or JSON rows."""
    from warmd.capture.sharing import learned_rows

    rows = learned_rows(indexes)
    if as_json:
        echo_json(rows)
        return
    columns = [Col("plan", "id"), Col("library"), Col("entry", "id"),
               Col("missed by", "text")]
    make_console().print(fitted_table(f"{title} ({len(rows)})", columns, [
        [r["plan"], r["library"], r["entry"], r["missed_by"]] for r in rows]))
