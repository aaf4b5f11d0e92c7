"""`warmd start`, `warmd stop`, `warmd status` and `warmd wait-ready`: the daemon on Ray."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import time

import click

from warmd.cli.render import wrapped
from warmd.cli.status_view import (
    render_start_summary,
    render_status,
    render_stopped,
    start_seconds,
)
from warmd.cluster.state import WARM_STATES, NodeStatus
from warmd.cluster.status import StatusSnapshot
from warmd.config.load import load_config


class _Seconds(click.ParamType):
    """A finite number of seconds, at least `minimum` (NaN or a negative wait never ends well,
    a zero refresh interval is a busy loop)."""

    name = "seconds"

    def __init__(self, minimum: float = 0.0) -> None:
        self.minimum = minimum

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds < self.minimum:
            self.fail(f"{value!r} must be a finite number >= {self.minimum:g}", param, ctx)
        return seconds


_SECONDS = _Seconds()
MIN_WATCH_INTERVAL = 0.5

ADDRESS_HELP = ("Ray cluster address (HOST:PORT, or 'auto' for the running local one; "
                "default: RAY_ADDRESS, else the cluster this state dir's `warmd start` "
                "started, else the one `ray start` recorded here).")


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

@click.command(short_help="Start warmd on a Ray cluster: an agent warms every GPU node.")
@_config_options
@click.option("--address", metavar="ADDR",
              help="Ray cluster to run on (HOST:PORT, or 'auto': the running local one). "
                   "Default: RAY_ADDRESS, else the cluster this state dir's `warmd start` "
                   "started, else the one `ray start` recorded here, else a new local one "
                   "started here.")
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
    Exit codes: 0 every selected node warm (READY or DEGRADED), 1 a node FAILED,
    the wait timed out or the config selects no node, 2 bad input (config,
    address).
    """
    from warmd.cluster import client
    from warmd.cluster.command_store import config_store

    config = _load(config_path, redis_url, namespace, metrics_port)
    began = time.monotonic()

    def say(what: str) -> None:  # on a terminal: a refused change stays one line in logs
        if not as_json and sys.stderr.isatty():
            click.echo(f"warmd: {what}...", err=True)

    started = client.start(config, address, say)
    for warning in started.warnings:
        click.echo(f"warmd: warning: {warning}", err=True)
    summary = {"ray_address": started.address, "started_local_ray": started.started_local_ray,
               "controller": "created" if started.created else "updated",
               "config_hash": started.config_hash, "redis": started.redis,
               "embedded_redis": started.embedded_redis, "config": config.source,
               "no_node": started.no_node}
    if not as_json:
        verb = "started" if started.created else "already running; configuration applied"
        local = " (local cluster started)" if started.started_local_ray else ""
        for line in wrapped(f"warmd controller {verb} on Ray {started.address}{local}; "
                            f"config {started.config_hash} from {config.source}; "
                            f"shared cache {started.redis or 'off'}"):
            click.echo(line)
    code = 0
    waited = time.monotonic()
    if started.no_node:
        click.echo(f"warmd: {started.no_node}", err=True)
        code = 1
    elif wait:
        say(f"waiting for the selected nodes to be warm (at most {timeout:.0f} s)")
        snap, code = _wait_for_nodes(None, config_store(config), timeout,
                                     started.address, interval=0.25,
                                     progress=None if as_json else _node_progress())
        if code == 0 and not snap.nodes:  # the current config selects no node after all
            code = 1
            summary["no_node"] = snap.no_node or "the config selects no node"
        if as_json:
            summary["status"] = snap.to_json()
            summary["seconds"] = start_seconds(started.seconds, time.monotonic() - waited,
                                               time.monotonic() - began, snap)
        else:
            click.echo(render_start_summary(snap, time.monotonic() - began, code))
            if summary["no_node"]:
                click.echo(f"warmd: {summary['no_node']}", err=True)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    sys.exit(code)


def _node_progress():
    """A line on stderr per node whenever its state or task count changes (what `warmd
    start` shows until the nodes are warm)."""
    shown: dict[str, str] = {}
    began = time.monotonic()

    def show(snap: StatusSnapshot) -> None:
        for node in snap.nodes:
            tasks = (f" {node.progress_done}/{node.progress_total} tasks"
                     if node.progress_total else "")
            now = ", building " + ", ".join(sorted(node.building)) if node.building else ""
            line = f"{node.name or node.node_id[:8]}: {node.state}{tasks}{now}"
            if shown.get(node.node_id) != line:
                shown[node.node_id] = line
                for part in wrapped(f"warmd: [{time.monotonic() - began:5.1f} s] node {line}"):
                    click.echo(part, err=True)

    return show


def _wait_for_nodes(node_id, store, timeout: float, address, interval: float = 1.0,
                    progress=None) -> tuple[StatusSnapshot, int]:
    """Poll until the target nodes settle; (last snapshot, exit code). ``progress`` sees
    every snapshot."""
    from warmd.cluster import client

    deadline = time.monotonic() + timeout
    while True:
        snap = client.snapshot(address, store)
        if progress is not None:
            progress(snap)
        settled = snap.settled(node_id)
        if settled is not None:
            return snap, 0 if settled else 1
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
@click.option("--interval", type=_Seconds(MIN_WATCH_INTERVAL), default=2.0, show_default=True,
              metavar="S", help=f"Refresh interval with --watch (at least {MIN_WATCH_INTERVAL}s).")
@click.option("--fail-on-runtime-jit", is_flag=True,
              help="Exit 1 when any node compiled a kernel after READY (canaries, CI).")
def status(address, config_path, redis_url, namespace, as_json, watch, interval,
           fail_on_runtime_jit):
    """Per-node warmup state and cluster-wide cache totals.

    Asks the controller over Ray; without a reachable cluster it reads the node records
    that the agents keep in Redis. Exit code 0 when every selected node is READY, 1 when
    one is not, when the config selects no node, or when warmd is not running (and, with
    --fail-on-runtime-jit, when a node compiled a kernel after READY: a warm miss, which
    `runtime JIT` shows per node). --watch ends on Ctrl-C (exit 130) or SIGTERM (exit 143).
    """
    from warmd.cluster.command_store import command_store

    store = command_store(config_path, redis_url, namespace)
    if not watch:
        code = _show_status(address, store, as_json, watch=False,
                            fail_on_runtime_jit=fail_on_runtime_jit)
        sys.exit(code)
    with _stop_on_signals() as rearm:
        while True:
            _show_status(address, store, as_json, watch=True)
            rearm()  # connecting to Ray installs Ray's own handlers
            time.sleep(interval)


def _show_status(address, store, as_json: bool, watch: bool,
                 fail_on_runtime_jit: bool = False) -> int:
    """Print one status; returns its exit code."""
    from warmd.cluster import client

    snap = client.snapshot(address, store)
    if as_json:
        click.echo(json.dumps(snap.to_json(), indent=None if watch else 2))
    elif not snap.running and not snap.nodes:
        click.echo(render_stopped(snap))
    else:
        if watch:
            click.clear()
        click.echo(render_status(snap))
    if snap.no_node and not watch:
        click.echo(f"warmd: {snap.no_node}", err=True)
    if not watch:
        from warmd.cluster.exposure import exposure_warnings

        for warning in exposure_warnings(snap, store.url):
            click.echo(f"warmd: warning: {warning}", err=True)
    if fail_on_runtime_jit and snap.runtime_jit and not watch:
        click.echo(f"warmd: {snap.runtime_jit} kernel(s) compiled after READY (runtime JIT)",
                   err=True)
    return status_code(snap, fail_on_runtime_jit)


def status_code(snap: StatusSnapshot, fail_on_runtime_jit: bool) -> int:
    """0 when every selected node is READY (and, when asked, none compiled after READY)."""
    if fail_on_runtime_jit and snap.runtime_jit:
        return 1
    return 0 if snap.ready and not snap.no_node else 1


class _WatchStopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.code = 128 + signum


def _raise_stopped(signum, _frame) -> None:
    raise _WatchStopped(signum)


def _arm_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _raise_stopped)


@contextlib.contextmanager
def _stop_on_signals():
    """SIGINT and SIGTERM end a --watch loop quietly (no "Aborted!", no Ray signal dump),
    with the shell's exit code 128 + signal. Yields the function that re-arms them."""
    _arm_signals()
    try:
        yield _arm_signals
    except _WatchStopped as stopped:
        sys.stdout.flush()
        sys.exit(stopped.code)


# --- warmd wait-ready -----------------------------------------------------------------------

@click.command("wait-ready")
@click.option("--address", metavar="ADDR", help=ADDRESS_HELP)
@click.option("--node-id", metavar="ID",
              help="Wait for this node only: a Ray node id, a unique prefix of one, its IP "
                   "or its stable name.")
@click.option("--all", "all_nodes", is_flag=True,
              help="Wait for every selected node (the default).")
@click.option("--timeout", type=_SECONDS, default=600.0, show_default=True, metavar="S",
              help="Give up after S seconds.")
@_config_options
def wait_ready(address, node_id, all_nodes, timeout, config_path, redis_url, namespace):
    """Block until nodes are warm: for readiness probes and scripts.

    Warm means READY, or DEGRADED (every kernel is compiled, but the shared cache was not
    reachable). Exit code 0 when warm, 1 when a node FAILED, the config selects no node or
    the time ran out.
    """
    from warmd.cluster.command_store import command_store
    from warmd.errors import WarmdInputError

    if node_id and all_nodes:
        raise WarmdInputError("use either --node-id or --all, not both")
    store = command_store(config_path, redis_url, namespace)
    snap, code = _wait_for_nodes(node_id, store, timeout, address, interval=0.5)
    nodes = snap.matching(node_id)
    if code == 0 and nodes:
        degraded = [n for n in nodes if n.state != NodeStatus.READY]
        click.echo(f"ready: {len(nodes)} node(s) warm"
                   + (f" ({len(degraded)} DEGRADED)" if degraded else ""))
    elif code == 0:  # nothing selected: a probe must not pass on a cluster warming nothing
        no_node = (snap.controller.no_node if snap.controller else None) or \
            "the config selects no node"
        click.echo(f"not ready: {no_node}", err=True)
        code = 1
    elif not snap.running:
        click.echo("not ready: warmd is not running", err=True)
    elif not nodes:
        click.echo(f"not ready: no node {node_id!r} (yet)", err=True)
    else:
        for n in nodes:
            if n.state not in WARM_STATES:
                reason = f": {n.reason}" if n.reason else ""
                for line in wrapped(f"not ready: node {n.name or n.node_id[:8]} {n.state}"
                                    f"{reason}"):
                    click.echo(line, err=True)
    sys.exit(code)


def register(main: click.Group) -> None:
    for command in (start, stop, status, wait_ready):
        main.add_command(command)
