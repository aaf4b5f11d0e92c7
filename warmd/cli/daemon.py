"""`warmd start`, `warmd stop`, `warmd status` and `warmd wait-ready`: the daemon on Ray."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import sys
import time

import click

from warmd.config import load_config
from warmd.stats import CounterFlag, format_bytes, ids


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

@click.command()
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
    Exit codes: 0 every selected node warm (READY or DEGRADED), 1 a node FAILED, the
    wait timed out or the config selects no node, 2 bad input (config, address).
    """
    from warmd.cluster import client

    config = _load(config_path, redis_url, namespace, metrics_port)
    began = time.monotonic()
    started = client.start(config, address)
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
        click.echo(f"warmd controller {verb} on Ray {started.address}{local}; "
                   f"config {started.config_hash} from {config.source}; "
                   f"shared cache {started.redis or 'off'}")
    code = 0
    waited = time.monotonic()
    if started.no_node:
        click.echo(f"warmd: {started.no_node}", err=True)
        code = 1
    elif wait:
        snap, code = _wait_for_nodes(None, config, timeout, started.address, interval=0.25)
        if as_json:
            summary["status"] = status_json(snap)
            summary["seconds"] = start_seconds(started.seconds, time.monotonic() - waited,
                                               time.monotonic() - began, snap)
        else:
            click.echo(render_start_summary(snap, time.monotonic() - began, code))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    sys.exit(code)


def start_seconds(started: dict, waited: float, total: float, snap: dict) -> dict:
    """Where a `start` spent its time: starting or joining Ray, creating the controller,
    waiting for the nodes, and each node's own warmup, split by its seconds counters
    (warmd.stats, TIME: compile, fetch from the store, install, verify on disk)."""
    nodes = {n["node_id"]: {"warm": n.get("warm_seconds"), "state": n.get("state"),
                            "remote_hits": (n.get("kernels") or {}).get("remote_hits"),
                            "compiled": (n.get("kernels") or {}).get("compiled"),
                            "bytes_fetched": (n.get("counters") or {}).get("bytes_fetched"),
                            **{i: (n.get("counters") or {}).get(i)
                               for i in ids(CounterFlag.RUN | CounterFlag.TIME)}}
             for n in snap.get("nodes", [])}
    return {**started, "wait_nodes": round(waited, 3), "total": round(total, 3),
            "nodes": nodes}


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
    config = _load(config_path, redis_url, namespace)
    if not watch:
        code = _show_status(address, config, as_json, watch=False,
                            fail_on_runtime_jit=fail_on_runtime_jit)
        sys.exit(code)
    with _stop_on_signals() as rearm:
        while True:
            _show_status(address, config, as_json, watch=True)
            rearm()  # connecting to Ray installs Ray's own handlers
            time.sleep(interval)


def _show_status(address, config, as_json: bool, watch: bool,
                 fail_on_runtime_jit: bool = False) -> int:
    """Print one status; returns its exit code."""
    from warmd.cluster import client

    snap = client.snapshot(address, config)
    no_node = (snap.get("controller") or {}).get("no_node") if snap["running"] else None
    if as_json:
        click.echo(json.dumps(status_json(snap), indent=None if watch else 2))
    elif not snap["running"] and not snap["nodes"]:
        click.echo(render_stopped(snap))
    else:
        if watch:
            click.clear()
        click.echo(render_status(snap))
    if no_node and not watch:
        click.echo(f"warmd: {no_node}", err=True)
    jit = runtime_jit_total(snap["nodes"])
    if fail_on_runtime_jit and jit and not watch:
        click.echo(f"warmd: {jit} kernel(s) compiled after READY (runtime JIT)", err=True)
    return status_code(snap, no_node, fail_on_runtime_jit)


def status_code(snap: dict, no_node: str | None, fail_on_runtime_jit: bool) -> int:
    """0 when every selected node is READY (and, when asked, none compiled after READY)."""
    if fail_on_runtime_jit and runtime_jit_total(snap["nodes"]):
        return 1
    return 0 if _ready(snap) and not no_node else 1


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


def _ready(snap: dict) -> bool:
    from warmd.cluster.state import READY

    return snap["running"] and all(n["state"] == READY for n in snap["nodes"])


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
    elif code == 0:  # nothing selected: a probe must not pass on a cluster warming nothing
        no_node = (snap.get("controller") or {}).get("no_node") or "the config selects no node"
        click.echo(f"not ready: {no_node}", err=True)
        code = 1
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


def runtime_jit_total(nodes: list[dict]) -> int:
    return sum(int(v) for n in nodes for v in (n.get("runtime_jit") or {}).values())


def runtime_jit_events(nodes: list[dict]) -> list[dict]:
    """Every node's recorded runtime JIT events (library, entry, node, at), oldest first."""
    return sorted((e for n in nodes for e in n.get("runtime_jit_events") or []),
                  key=lambda e: e.get("at") or 0)


def status_json(snap: dict) -> dict:
    counters = totals(snap["nodes"])
    summary = counters.to_json()
    summary["kernels"] = counters.kernels
    summary["hit_rate"] = round(counters.hit_rate, 4)
    summary["runtime_jit"] = runtime_jit_total(snap["nodes"])
    summary["store_size"] = snap.get("store_size")
    return {"running": snap["running"], "source": snap["source"],
            "ray_address": snap.get("ray_address"), "ready": _ready(snap),
            "controller": snap.get("controller"), "nodes": snap["nodes"], "totals": summary,
            "runtime_jit": runtime_jit_events(snap["nodes"])}


def _when(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "-"


def _gpus(node: dict) -> str:
    if node.get("gpus"):
        return f"{node['gpus']}x {node.get('gpu_type') or 'GPU'}"
    return "builder" if node.get("role") == "builder" else "-"


def terminal_width() -> int:
    return shutil.get_terminal_size((100, 24)).columns


def clip(text: str, width: int) -> str:
    """text in at most width characters: cut with an ellipsis, never wrapped mid-word."""
    return text if len(text) <= width else text[:max(width - 1, 0)] + "…"


def render_status(snap: dict, width: int | None = None) -> str:
    width = width or terminal_width()
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
    lines += ["", *_node_table(snap["nodes"], width, ctl.get("no_node")), ""]
    counters = totals(snap["nodes"])
    lines.append(counters.render_text("Cluster totals"))
    lines.append(_runtime_jit_line(snap["nodes"]))
    lines.append(_store_size_line(snap.get("store_size")))
    return "\n".join(lines)


_LABEL_WIDTH = len("Corrupt entries rejected") + 2


def _runtime_jit_line(nodes: list[dict]) -> str:
    from warmd.stats import BY_ID

    return f"{BY_ID['runtime_jit'].description:<{_LABEL_WIDTH}}" \
        f"{runtime_jit_total(nodes):>12}"


def _runtime_jit_note(node: dict) -> str | None:
    """'runtime JIT: 2 (last: triton ABC... at 12:00:01)' for a node that had any."""
    count = runtime_jit_total([node])
    if not count:
        return None
    events = node.get("runtime_jit_events") or []
    last = (f" (last: {events[-1]['library']} {events[-1]['entry']} at "
            f"{_when(events[-1].get('at'))})" if events else "")
    return f"runtime JIT: {count}{last}"


def _store_size_line(size: dict | None) -> str:
    value = (f"{format_bytes(int(size.get('used_memory') or 0))}, {size.get('keys', 0)} keys"
             if size else "unknown")
    return f"{'Store size':<{_LABEL_WIDTH}}{value:>12}"


def render_stopped(snap: dict) -> str:
    """`warmd status` with no controller and no node records: two lines, not a table of
    zeros. Says where the kernel cache's own statistics are."""
    where = (f"no warmd controller on Ray {snap['ray_address']}" if snap.get("ray_address")
             else "no Ray cluster found")
    lines = [f"warmd is not running ({where}); start it with `warmd start`"]
    size, url = snap.get("store_size"), snap.get("redis")
    if url and size:
        lines.append(f"shared cache {url}: {size.get('keys', 0)} keys, "
                     f"{format_bytes(int(size.get('used_memory') or 0))}; "
                     "its counters: `warmd cache stats`")
    elif snap.get("embedded_dir"):
        lines.append(f"the embedded shared cache is stopped; its data is kept in "
                     f"{snap['embedded_dir']} (`warmd cache server start`, then "
                     "`warmd cache stats`)")
    elif url:
        lines.append(f"shared cache {url} is unreachable"
                     + (f": {snap['redis_error']}" if snap.get("redis_error") else ""))
    else:
        lines.append("no shared cache is configured or kept on this machine")
    return "\n".join(lines)


def render_start_summary(snap: dict, seconds: float, code: int) -> str:
    """What `warmd start` says once the nodes settle: a short summary (the full view is
    `warmd status`)."""
    nodes = snap["nodes"]
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n["state"]] = counts.get(n["state"], 0) + 1
    states = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no node"
    kernels = totals(nodes)
    verdict = "warm" if code == 0 else "not warm"
    lines = [f"{len(nodes)} node(s) {verdict} after {seconds:.0f}s ({states}); "
             f"{kernels.kernels} kernel(s): {kernels.compiled} compiled, "
             f"{kernels.remote_hits} from the shared cache, {kernels.local_hits} already here"]
    width = terminal_width()
    lines += [clip(f"  {_label(n)} {n['state']}: {n['reason']}", width)
              for n in nodes if n["state"] != "READY" and n.get("reason")]
    lines.append("details: warmd status")
    return "\n".join(lines)


def _label(node: dict) -> str:
    return f"{node.get('name') or ''} {node['node_id'][:8]}".strip()


def _node_table(nodes: list[dict], width: int, no_node: str | None = None) -> list[str]:
    from warmd.cluster.state import READY

    counts: dict[str, int] = {}
    for n in nodes:
        counts[n["state"]] = counts.get(n["state"], 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none selected"
    out = [clip(f"Nodes ({len(nodes)}: {summary})" + (f": {no_node}" if no_node else ""),
                width)]
    if not nodes:
        return out
    head = ("NODE", "RAY ID", "IP", "GPUS", "STATE", "PROGRESS", "KERNELS", "HIT RATE",
            "LAST WARM")
    rows = []
    for n in nodes:
        progress = (f"{n.get('progress_done', 0)}/{n['progress_total']}"
                    if n.get("progress_total") else "-")
        kernels = n.get("kernels") or {}
        total = kernels.get("total", 0)
        rate = f"{100 * n.get('hit_rate', 0):.1f}%" if total else "-"
        last = (f"{_when(n.get('warmed_at'))} ({n.get('warm_seconds', 0):.1f}s)"
                if n.get("warmed_at") else "-")
        rows.append((n.get("name") or "-", n["node_id"][:8], n.get("ip") or "-", _gpus(n),
                     n["state"], progress, str(total), rate, last))
    out += table_lines(head, rows, width, fixed=frozenset({1, 4}))  # ray id, state
    now = time.time()
    for n in nodes:
        notes = []
        if n["state"] != READY and n.get("reason"):
            notes.append(n["reason"])
        beat = n.get("heartbeat") or 0
        if beat and now - beat > 60:
            notes.append(f"no heartbeat for {now - beat:.0f}s")
        jit = _runtime_jit_note(n)
        if jit:
            notes.append(jit)
        out += [clip(f"  {_label(n)} {n['state']}: {note}", width) for note in notes]
    return out


def table_lines(head: tuple[str, ...], rows: list[tuple[str, ...]], width: int,
                fixed: frozenset[int] = frozenset()) -> list[str]:
    """Left-aligned columns that fit in width, never wrapped: the widest columns are cut
    first, with an ellipsis, down to their header's width (columns in `fixed`, ids, never);
    when that is not enough, the last columns are left out (--json has every value)."""
    shown = len(head)
    while True:
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(shown)]
        floor = [w if i in fixed else min(w, max(len(head[i]), 4)) for i, w in enumerate(widths)]
        while _line_width(widths) > width:
            i = max(range(shown), key=lambda c: widths[c] - floor[c])
            if widths[i] <= floor[i]:
                break
            widths[i] -= 1
        if _line_width(widths) <= width or shown <= 1:
            break
        shown -= 1
    return [" " + "  ".join(clip(c, w).ljust(w) for c, w in zip(row[:shown], widths, strict=True)
                            ).rstrip() for row in [head, *rows]]


def _line_width(widths: list[int]) -> int:
    return 1 + sum(widths) + 2 * (len(widths) - 1)


def register(main: click.Group) -> None:
    for command in (start, stop, status, wait_ready):
        main.add_command(command)
