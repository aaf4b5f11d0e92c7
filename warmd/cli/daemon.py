"""`warmd start`, `warmd stop`, `warmd status` and `warmd wait-ready`: the daemon on Ray."""

from __future__ import annotations

import json
import math
import sys
import time

import click

from warmd.config import load_config
from warmd.stats import format_bytes


class _Seconds(click.ParamType):
    """A finite, non-negative number of seconds (NaN or a negative wait never ends well)."""

    name = "seconds"

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds < 0:
            self.fail(f"{value!r} must be a finite number >= 0", param, ctx)
        return seconds


_SECONDS = _Seconds()

ADDRESS_HELP = ("Ray cluster address (HOST:PORT, or 'auto' for the running local one; "
                "default: RAY_ADDRESS, else the running local cluster).")


def _config_options(func):
    options = [
        click.option("--config", "-c", "config_path", metavar="PATH",
                     help="warmd.yaml (default: WARMD_CONFIG, else the embedded example "
                          "that warms one small FlashInfer module)."),
        click.option("--redis", "redis_url", metavar="URL",
                     help="Shared cache URL (redis://, rediss://, unix://, "
                          "redis+cluster://); overrides redis.url and WARMD_REDIS_URL."),
        click.option("--namespace", metavar="NAME",
                     help="Cache namespace; overrides redis.namespace and WARMD_NAMESPACE."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _load(config_path, redis_url, namespace, metrics_port=None):
    return load_config(config_path, redis_url=redis_url, namespace=namespace,
                       metrics_port=metrics_port)


# --- warmd start ----------------------------------------------------------------------------

@click.command()
@_config_options
@click.option("--address", metavar="ADDR",
              help="Ray cluster to run on (HOST:PORT, or 'auto': the running local one). "
                   "Default: RAY_ADDRESS, else the running local cluster, else a new local "
                   "one started here.")
@click.option("--metrics-port", type=int, metavar="PORT",
              help="Port of each agent's Prometheus endpoint (0: any free port); overrides "
                   "agent.metrics_port and WARMD_METRICS_PORT.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Return once every selected node is warm (or failed), with the status.")
@click.option("--timeout", type=_SECONDS, default=900.0, show_default=True, metavar="S",
              help="With --wait: give up after S seconds (exit 1).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def start(config_path, redis_url, namespace, address, metrics_port, wait, timeout, as_json):
    """Start warmd on a Ray cluster: a controller that keeps every selected node warm.

    Connects to a running cluster, or starts a local one (and an embedded Redis when no
    Redis URL is configured). Idempotent: a second `start` finds the controller and hands it
    the new configuration; nodes re-warm when the work changed.

    \b
    Exit codes: 0 every selected node warm (READY or DEGRADED), 1 a node FAILED or the
    wait timed out, 2 bad input (config, address).
    """
    from warmd.cluster import client

    config = _load(config_path, redis_url, namespace, metrics_port)
    started = client.start(config, address)
    for warning in started.warnings:
        click.echo(f"warmd: warning: {warning}", err=True)
    summary = {"ray_address": started.address, "started_local_ray": started.started_local_ray,
               "controller": "created" if started.created else "updated",
               "config_hash": started.config_hash, "redis": started.redis,
               "embedded_redis": started.embedded_redis, "config": config.source}
    if not as_json:
        verb = "started" if started.created else "already running; configuration applied"
        local = " (local cluster started)" if started.started_local_ray else ""
        click.echo(f"warmd controller {verb} on Ray {started.address}{local}; "
                   f"config {started.config_hash} from {config.source}; "
                   f"shared cache {started.redis or 'off'}")
    code = 0
    if wait:
        snap, code = _wait_for_nodes(None, config, timeout, started.address)
        if as_json:
            summary["status"] = status_json(snap)
        else:
            click.echo(render_status(snap))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    sys.exit(code)


def _wait_for_nodes(node_id, config, timeout: float, address, interval: float = 1.0):
    """Poll until the target nodes settle; (last snapshot, exit code)."""
    from warmd.cluster import client
    from warmd.cluster.state import FAILED, WARM_STATES

    deadline = time.monotonic() + timeout
    while True:
        snap = client.snapshot(address, config)
        nodes = [n for n in snap["nodes"] if node_id is None or client.node_matches(n, node_id)]
        reconciled = (snap.get("controller") or {}).get("counters", {}).get("reconciles", 0)
        if node_id is None and snap["running"] and reconciled and not snap["nodes"]:
            return snap, 0  # nothing selected: nothing to wait for
        current = (snap.get("controller") or {}).get("config_hash")
        settled = [n for n in nodes if n["state"] in WARM_STATES | {FAILED}
                   and (not current or n.get("config_hash") == current)]
        if nodes and len(settled) == len(nodes):  # warm or failed for the current config
            return snap, 0 if all(n["state"] in WARM_STATES for n in nodes) else 1
        if time.monotonic() >= deadline:
            return snap, 1
        time.sleep(interval)


# --- warmd stop -----------------------------------------------------------------------------

@click.command()
@click.option("--address", metavar="ADDR", help=ADDRESS_HELP)
@click.option("--keep-services", is_flag=True,
              help="Leave the local Ray cluster and embedded Redis that `warmd start` "
                   "started running.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def stop(address, keep_services, as_json):
    """Remove the controller and every node agent. Kernel caches stay as they are.

    Also stops the local Ray cluster and the embedded Redis if `warmd start` started them
    (the Redis data is kept on disk), unless --keep-services.
    """
    from warmd.cluster import client

    result = client.stop(address, keep_services=keep_services)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    if result["controller"] or result["agents_stopped"]:
        click.echo(f"warmd stopped: controller removed, {result['agents_stopped']} agent(s) "
                   "stopped; kernel caches kept")
    else:
        click.echo("warmd was not running")
    for what in result["services_stopped"]:
        click.echo(f"stopped {what}")


# --- warmd status ---------------------------------------------------------------------------

@click.command()
@click.option("--address", metavar="ADDR", help=ADDRESS_HELP)
@_config_options
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", "-w", is_flag=True, help="Refresh until interrupted (Ctrl-C).")
@click.option("--interval", type=_SECONDS, default=2.0, show_default=True, metavar="S",
              help="Refresh interval with --watch.")
def status(address, config_path, redis_url, namespace, as_json, watch, interval):
    """Per-node warmup state and cluster-wide cache totals.

    Asks the controller over Ray; without a reachable cluster it reads the node records
    that the agents keep in Redis. Exit code 0 when every selected node is READY, 1 when
    one is not (or warmd is not running).
    """
    from warmd.cluster import client

    config = _load(config_path, redis_url, namespace)
    while True:
        snap = client.snapshot(address, config)
        if as_json:
            click.echo(json.dumps(status_json(snap), indent=None if watch else 2))
        else:
            if watch:
                click.clear()
            click.echo(render_status(snap))
        if not watch:
            sys.exit(0 if _ready(snap) else 1)
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            sys.exit(0 if _ready(snap) else 1)


def _ready(snap: dict) -> bool:
    from warmd.cluster.state import READY

    return snap["running"] and all(n["state"] == READY for n in snap["nodes"])


# --- warmd wait-ready -----------------------------------------------------------------------

@click.command("wait-ready")
@click.option("--address", metavar="ADDR", help=ADDRESS_HELP)
@click.option("--node-id", metavar="ID",
              help="Wait for this node only: a node id, a unique prefix of one, or its IP.")
@click.option("--all", "all_nodes", is_flag=True,
              help="Wait for every selected node (the default).")
@click.option("--timeout", type=_SECONDS, default=600.0, show_default=True, metavar="S",
              help="Give up after S seconds.")
@_config_options
def wait_ready(address, node_id, all_nodes, timeout, config_path, redis_url, namespace):
    """Block until nodes are warm: for readiness probes and scripts.

    Warm means READY, or DEGRADED (every kernel is compiled, but the shared cache was not
    reachable). Exit code 0 when warm, 1 when a node FAILED or the time ran out.
    """
    from warmd.cluster.state import WARM_STATES
    from warmd.errors import WarmdInputError

    if node_id and all_nodes:
        raise WarmdInputError("use either --node-id or --all, not both")
    config = _load(config_path, redis_url, namespace)
    snap, code = _wait_for_nodes(node_id, config, timeout, address, interval=0.5)
    from warmd.cluster import client

    nodes = [n for n in snap["nodes"] if node_id is None or client.node_matches(n, node_id)]
    if code == 0 and nodes:
        degraded = [n for n in nodes if n["state"] != "READY"]
        click.echo(f"ready: {len(nodes)} node(s) warm"
                   + (f" ({len(degraded)} DEGRADED)" if degraded else ""))
    elif code == 0:
        click.echo("ready: no nodes are selected by the configuration")
    elif not snap["running"]:
        click.echo("not ready: warmd is not running", err=True)
    elif not nodes:
        click.echo(f"not ready: no node {node_id!r} (yet)", err=True)
    else:
        for n in nodes:
            if n["state"] not in WARM_STATES:
                reason = f": {n['reason']}" if n.get("reason") else ""
                click.echo(f"not ready: node {n['node_id'][:8]} {n['state']}{reason}", err=True)
    sys.exit(code)


# --- rendering ------------------------------------------------------------------------------

def totals(nodes: list[dict]):
    from warmd.stats import Counters

    total = Counters()
    for node in nodes:
        total.add(node.get("counters") or {})
    return total


def status_json(snap: dict) -> dict:
    counters = totals(snap["nodes"])
    summary = counters.to_json()
    summary["kernels"] = counters.kernels
    summary["hit_rate"] = round(counters.hit_rate, 4)
    summary["store_size"] = snap.get("store_size")
    return {"running": snap["running"], "source": snap["source"],
            "ray_address": snap.get("ray_address"), "ready": _ready(snap),
            "controller": snap.get("controller"), "nodes": snap["nodes"], "totals": summary}


def _when(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "-"


def _gpus(node: dict) -> str:
    if node.get("gpus"):
        return f"{node['gpus']}x {node.get('gpu_type') or 'GPU'}"
    return "builder" if node.get("role") == "builder" else "-"


def render_status(snap: dict) -> str:
    lines = [f"======== warmd status: {time.strftime('%Y-%m-%d %H:%M:%S')} ========"]
    ctl = snap.get("controller") or {}
    if snap["running"]:
        up = time.time() - ctl.get("started_at", time.time())
        lines.append(f"Controller: running on node {ctl.get('node_id', '?')[:8]} for "
                     f"{up / 60:.0f} min; config {ctl.get('config_hash', '?')}; "
                     f"Ray {snap.get('ray_address')}")
        lines.append(f"Shared cache: {ctl.get('redis') or 'off'} "
                     f"(namespace {ctl.get('config', {}).get('redis', {}).get('namespace')})")
    else:
        where = f"Ray {snap['ray_address']}" if snap.get("ray_address") else "no Ray cluster"
        lines.append(f"Controller: not running ({where}); node records from Redis "
                     f"{snap.get('redis') or '(none)'}"
                     + (f": {snap['redis_error']}" if snap.get("redis_error") else ""))
    lines += ["", *_node_table(snap["nodes"]), ""]
    counters = totals(snap["nodes"])
    lines.append(counters.render_text("Cluster totals"))
    size = snap.get("store_size")
    label_width = len("Corrupt entries rejected") + 2
    if size:
        value = f"{format_bytes(int(size.get('used_memory') or 0))}, {size.get('keys', 0)} keys"
        lines.append(f"{'Store size':<{label_width}}{value:>12}")
    else:
        lines.append(f"{'Store size':<{label_width}}{'unknown':>12}")
    return "\n".join(lines)


def _node_table(nodes: list[dict]) -> list[str]:
    from warmd.cluster.state import READY

    counts: dict[str, int] = {}
    for n in nodes:
        counts[n["state"]] = counts.get(n["state"], 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none selected"
    out = [f"Nodes ({len(nodes)}: {summary})"]
    if not nodes:
        return out
    head = ("NODE", "IP", "GPUS", "STATE", "PROGRESS", "KERNELS", "HIT RATE", "LAST WARM")
    rows = []
    for n in nodes:
        progress = (f"{n.get('progress_done', 0)}/{n['progress_total']}"
                    if n.get("progress_total") else "-")
        kernels = n.get("kernels") or {}
        total = kernels.get("total", 0)
        rate = f"{100 * n.get('hit_rate', 0):.1f}%" if total else "-"
        last = (f"{_when(n.get('warmed_at'))} ({n.get('warm_seconds', 0):.1f}s)"
                if n.get("warmed_at") else "-")
        rows.append((n["node_id"][:8], n.get("ip") or "-", _gpus(n), n["state"], progress,
                     str(total), rate, last))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        out.append(" " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    now = time.time()
    for n in nodes:
        notes = []
        if n["state"] != READY and n.get("reason"):
            notes.append(n["reason"])
        beat = n.get("heartbeat") or 0
        if beat and now - beat > 60:
            notes.append(f"no heartbeat for {now - beat:.0f}s")
        for note in notes:
            out.append(f"  {n['node_id'][:8]} {n['state']}: {note}")
    return out


def register(main: click.Group) -> None:
    for command in (start, stop, status, wait_ready):
        main.add_command(command)
