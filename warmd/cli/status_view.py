"""What `warmd status` and `warmd start` print: the daemon's StatusSnapshot as text, tables
through warmd.cli.render (the terminal's or $COLUMNS' width, identifiers never cut while a
column can be left out instead, reasons wrapped whole)."""

from __future__ import annotations

import time

from warmd.cli.render import Col, console_width, table_lines, wrapped
from warmd.cluster.state import NodeState, NodeStatus
from warmd.cluster.status import StatusSnapshot, StoreSize
from warmd.coordination import BootReport
from warmd.stats import BY_ID, CounterFlag, counter_line, format_bytes, ids

# What status sums (the nodes' records) differs from what `warmd cache stats` sums (every
# warmup the store counted, per machine, since it began): each says which.
TOTALS_TITLE = "Cluster totals (each selected node's last warmup)"
NODE_COLUMNS = (Col("NODE", "id"), Col("RAY ID"), Col("IP"), Col("GPUS", dropped=True),
                Col("STATE"), Col("PROGRESS", dropped=True), Col("KERNELS", dropped=True),
                Col("HIT RATE", dropped=True), Col("LAST WARM", dropped=True))


def render_status(snap: StatusSnapshot, width: int | None = None) -> str:
    width = width or console_width()
    lines = [f"======== warmd status: {time.strftime('%Y-%m-%d %H:%M:%S')} ========"]
    ctl = snap.controller
    if snap.running and ctl is not None:
        up = time.time() - (ctl.started_at or time.time())
        lines += wrapped(f"Controller: running on node {ctl.node_id[:8]} for {up / 60:.0f} "
                         f"min; config {ctl.config_hash or '?'}; Ray {snap.ray_address}", width)
        lines += wrapped(f"Shared cache: {ctl.redis or 'off'} (namespace "
                         f"{ctl.namespace or '?'})", width)
    else:
        where = f"Ray {snap.ray_address}" if snap.ray_address else "no Ray cluster"
        lines += wrapped(f"Controller: not running ({where}); node records from Redis "
                         f"{snap.redis or '(none)'}"
                         + (f": {snap.redis_error}" if snap.redis_error else ""), width)
    no_node = ctl.no_node if ctl else None
    lines += ["", *_node_table(snap.nodes, width, no_node), ""]
    lines.append(snap.totals().render_text(TOTALS_TITLE))
    lines.append(counter_line(BY_ID['runtime_jit'].description, str(snap.runtime_jit)))
    lines += store_lines(snap.store_size)
    return "\n".join(lines + _rederivation(width) + _key_proof_alarm(snap, width))


def _rederivation(width: int | None) -> list[str]:
    """How a trusted producer re-derives each library's captured kernels, or that it
    does not (then they stay on the node that built them)."""
    from warmd.libraries import LIBRARIES
    from warmd.rederive import rederivation_lines

    lines = ["Captured kernels, re-derived by trusted producers:"]
    for line in rederivation_lines(sorted(LIBRARIES)):
        lines += wrapped(line, width, "  ")
    return lines


def _key_proof_alarm(snap: StatusSnapshot, width: int | None = None) -> list[str]:
    if snap.key_proof is None or not snap.key_proof.alarm:
        return []
    return wrapped(f"Key proof: {snap.key_proof.describe}", width)


def render_stopped(snap: StatusSnapshot) -> str:
    """`warmd status` with no controller and no node records: two lines, not a table of
    zeros. Says where the kernel cache's own statistics are."""
    where = (f"no warmd controller on Ray {snap.ray_address}" if snap.ray_address
             else "no Ray cluster found")
    lines = [f"warmd is not running ({where}); start it with `warmd start`"]
    size, url = snap.store_size, snap.redis
    if url and size:
        limit = f" of {format_bytes(size.maxmemory)}" if size.maxmemory else ""
        lines.append(f"shared cache {url}: {size.keys} keys, {format_bytes(size.used_memory)}"
                     f"{limit}; its counters: `warmd cache stats`")
    elif snap.embedded_dir:
        lines.append(f"the embedded shared cache is stopped; its data is kept in "
                     f"{snap.embedded_dir} (`warmd cache server start`, then "
                     "`warmd cache stats`)")
    elif url:
        lines.append(f"shared cache {url} is unreachable"
                     + (f": {snap.redis_error}" if snap.redis_error else ""))
    else:
        lines.append("no shared cache is configured or kept on this machine")
    return "\n".join(lines + _key_proof_alarm(snap))


def render_start_summary(snap: StatusSnapshot, seconds: float, code: int) -> str:
    """What `warmd start` says once the nodes settle: a short summary (the full view is
    `warmd status`)."""
    kernels = snap.totals()
    verdict = "warm" if code == 0 else "not warm"
    lines = wrapped(f"{len(snap.nodes)} node(s) {verdict} after {seconds:.0f}s "
                    f"({_state_counts(snap.nodes) or 'no node'}); "
                    f"{kernels.kernels} kernel(s): {kernels.compiled} compiled, "
                    f"{kernels.remote_hits} from the shared cache, {kernels.local_hits} "
                    "already here")
    for n in snap.nodes:
        if n.state != NodeStatus.READY and n.reason:
            lines += wrapped(f"{_label(n)} {n.state}: {n.reason}", indent="  ")
    lines.append("details: warmd status")
    return "\n".join(lines)


def start_seconds(started: dict, waited: float, total: float, snap: StatusSnapshot) -> dict:
    """Where a `start` spent its time: starting or joining Ray, creating the controller,
    waiting for the nodes, and each node's own warmup, split by its seconds counters
    (warmd.stats, TIME: compile, fetch from the store, install, verify on disk)."""
    nodes = {n.node_id: {"warm": n.warm_seconds, "state": n.state,
                         "remote_hits": n.kernels.get("remote_hits"),
                         "compiled": n.kernels.get("compiled"),
                         "bytes_fetched": n.counters.get("bytes_fetched"),
                         "boot": n.boot.to_json() if n.boot is not None else {},
                         **{i: n.counters.get(i) for i in ids(CounterFlag.RUN |
                                                              CounterFlag.TIME)}}
             for n in snap.nodes}
    return {**started, "wait_nodes": round(waited, 3), "total": round(total, 3),
            "nodes": nodes}


def _state_counts(nodes: tuple[NodeState, ...]) -> str:
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n.state] = counts.get(n.state, 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


def _when(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "-"


def _gpus(node: NodeState) -> str:
    if node.gpus:
        return f"{node.gpus}x {node.gpu_type or 'GPU'}"
    return "builder" if node.role == "builder" else "-"


def _label(node: NodeState) -> str:
    return f"{node.name} {node.node_id[:8]}".strip()


def _row(n: NodeState) -> list[str]:
    progress = f"{n.progress_done}/{n.progress_total}" if n.progress_total else "-"
    total = n.kernels.get("total", 0)
    rate = f"{100 * n.hit_rate:.1f}%" if total else "-"
    last = f"{_when(n.warmed_at)} ({n.warm_seconds:.1f}s)" if n.warmed_at else "-"
    return [n.name or "-", n.node_id[:8], n.ip or "-", _gpus(n), n.state, progress,
            str(total), rate, last]


def _node_table(nodes: tuple[NodeState, ...], width: int,
                no_node: str | None = None) -> list[str]:
    out = wrapped(f"Nodes ({len(nodes)}: {_state_counts(nodes) or 'none selected'})"
                  + (f": {no_node}" if no_node else ""), width)
    if not nodes:
        return out
    out += table_lines(NODE_COLUMNS, [_row(n) for n in nodes], width)
    now = time.time()
    for n in nodes:
        notes = []
        if n.state != NodeStatus.READY and n.reason:
            notes.append(n.reason)
        if n.heartbeat and now - n.heartbeat > 60:
            notes.append(f"no heartbeat for {now - n.heartbeat:.0f}s")
        for label, since in sorted(n.building.items(), key=lambda item: item[1]):
            notes.append(f"building {label} for {max(0.0, now - since):.0f} s")
        jit = _runtime_jit_note(n)
        if jit:
            notes.append(jit)
        boot = boot_note(n.boot)
        if boot:
            notes.append(boot)
        for note in notes:
            out += wrapped(f"{_label(n)} {n.state}: {note}", width, "  ")
    return out


def boot_note(boot: BootReport | None) -> str | None:
    """'cluster: 12 compiled here, 40 from peers, 5 waited for (3.1 s)' for a warmup that
    shared work with other nodes."""
    if boot is None or not (boot.compiled or boot.installed or boot.waited):
        return None
    waited = f" ({boot.wait_seconds:.1f} s)" if boot.waited else ""
    took = f", {boot.took_over} taken over" if boot.took_over else ""
    return (f"cluster: {boot.compiled} compiled here, {boot.installed} from peers, "
            f"{boot.waited} waited for{waited}{took}")


def _runtime_jit_note(node: NodeState) -> str | None:
    """'runtime JIT: 2 (last: triton ABC... at 12:00:01)' for a node that had any; for a
    builder that serves nothing, that its caches are not watched."""
    count = node.runtime_jit_total
    if node.serves is False and not count:
        return "runtime JIT: not watched (a builder serves nothing; GPU nodes are watched)"
    if not count:
        return None
    events = node.runtime_jit_events
    last = (f" (last: {events[-1]['library']} {events[-1]['entry']} at "
            f"{_when(events[-1].get('at'))})" if events else "")
    return f"runtime JIT: {count}{last}"


def store_lines(size: StoreSize | None) -> list[str]:
    """The store's size and capacity, as `warmd status` and `warmd cache stats` show them."""
    if size is None:
        return [counter_line("Store size", "unknown")]
    lines = [counter_line("Store size", format_bytes(size.used_memory)).rstrip()
             + f", {size.keys} keys"]
    if size.maxmemory:
        used = 100 * size.used_memory / size.maxmemory
        policy = f" ({size.maxmemory_policy})" if size.maxmemory_policy else ""
        lines.append(counter_line("Store capacity", format_bytes(size.maxmemory),
                                  f"maxmemory, {used:.1f}% used{policy}"))
    else:
        lines.append(counter_line("Store capacity", "no limit", "(maxmemory 0)"))
    return lines
