"""What the `warmd start|stop|status|wait-ready` commands do, from any process: start or
update the controller (joining the cluster, warmd.cluster.address, or starting a local head,
warmd.cluster.local_head), stop it, and read the daemon's status. What `start` started is
recorded by warmd.cluster.services; the store a command reads, warmd.cluster.command_store.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from warmd import settings
from warmd.cluster.address import connect, load_ray_api, own_cluster, resolve_address
from warmd.cluster.command_store import CommandStore, record_store
from warmd.cluster.local_head import start_local_head, stop_local_services
from warmd.cluster.services import STORE_RECORD, daemon_lock, read_services, write_services
from warmd.cluster.state import node_records
from warmd.cluster.status import ControllerView, KeyProofView, StatusSnapshot, StoreSize
from warmd.config import WarmdConfig, redact_url
from warmd.errors import WarmdInputError

# --- the controller -----------------------------------------------------------------------

def effective_redis_url(config: WarmdConfig) -> tuple[str | None, bool]:
    """(URL the agents use, whether it is the embedded server). The embedded server is
    this daemon's to stop (`warmd stop`) unless `warmd cache server start` started it."""
    if config.redis.url:
        return config.redis.url, False
    from warmd.store import EmbeddedServerError, StartedBy, ensure_embedded

    try:
        server = ensure_embedded(started_by=StartedBy.DAEMON)
    except EmbeddedServerError as exc:
        raise WarmdInputError(f"no Redis URL configured and no embedded Redis: {exc}") from None
    if server.started_by != StartedBy.SERVER_COMMAND:
        write_services({**read_services(), "embedded_redis": True})
    return server.url, True


@dataclass
class Started:
    address: str
    started_local_ray: bool
    created: bool
    config_hash: str
    redis: str | None
    embedded_redis: bool
    warnings: list
    no_node: str | None = None  # why the config selects no node of the cluster
    seconds: dict = field(default_factory=dict)  # "ray" (start/connect), "controller"


def start(config: WarmdConfig, address: str | None,
          say: Callable[[str], None] | None = None) -> Started:
    """Connect (or start a local cluster), then create or update the controller; one
    `start` at a time per state dir. ``say`` hears of each step as it begins."""
    ray_api = load_ray_api()
    with daemon_lock():
        return _start(ray_api, config, address, say or (lambda _what: None))


def _start(ray_api, config: WarmdConfig, address: str | None,
           say: Callable[[str], None]) -> Started:
    from warmd.cluster.nodes import selection_problem

    resolved = resolve_address(address)
    if resolved is None and address == "auto":
        raise WarmdInputError("no running Ray cluster found (--address auto); start one "
                              "with `ray start --head`, or leave out --address")
    warnings = []
    this_machine = resolved is None or resolved == own_cluster()
    if this_machine:  # this machine is the cluster
        check_models_here(config)  # a missing model path is bad input, before Ray starts
    else:
        warnings += models_missing_here(config)
    if not config.redis.url:
        say("starting the embedded Redis (or finding it running)")
    url, embedded = effective_redis_url(config)  # before starting anything else
    started_local = resolved is None
    began = time.monotonic()
    if started_local:
        say("starting a local Ray cluster")
        resolved, head_warnings = start_local_head(config.ray.host)
        warnings += head_warnings
    say(f"connecting to Ray at {resolved}")
    connect(ray_api, resolved)
    ray_seconds = time.monotonic() - began
    nodes = ray_api.list_nodes()
    warnings += _start_warnings(config, url, embedded, nodes)
    info = {"ray_address": resolved, "embedded_redis": embedded, "started": time.time()}
    controller = ray_api.get_controller()
    created = controller is None
    if created:
        from warmd.cluster.controller import Controller

        say("creating the warmd controller")
        controller = ray_api.create_controller(Controller, config.to_json(), url, info)
        config_hash = _call(lambda: controller.ping(120.0), "start")
    else:
        from warmd.cluster.change import check_change

        say("checking the new configuration (models, shared cache, key proof)")
        # validate, then apply: a bad change leaves it running
        check_change(config, url, here_only=not this_machine)
        say("handing it to the running controller")
        config_hash = _call(lambda: controller.apply(config.to_json(), url, info, 120.0),
                            "update")["config_hash"]
    record_store(config, url, embedded)
    seconds = {"ray": round(ray_seconds, 3),
               "controller": round(time.monotonic() - began - ray_seconds, 3)}
    return Started(resolved, started_local, created, config_hash, redact_url(url), embedded,
                   warnings, selection_problem(nodes, config), seconds)


def _model_problem(config: WarmdConfig, index: int) -> str | None:
    """Why models[index] cannot be read on this machine (its path, or its serve command);
    None when it can."""
    from warmd.examples import resolve_model_path
    from warmd.models.config_json import load_config as load_model_config

    try:
        request = config.models[index].plan_request()
        load_model_config(resolve_model_path(request.model))
    except WarmdInputError as exc:
        return f"{config.source}: models[{index}]: {exc}"
    return None


def check_models_here(config: WarmdConfig) -> None:
    """Bad input (one line, exit 2) when a model of the config cannot be read here: on a
    cluster of this machine alone, every node would fail it."""
    for index in range(len(config.models)):
        problem = _model_problem(config, index)
        if problem:
            raise WarmdInputError(problem)


def models_missing_here(config: WarmdConfig) -> list[str]:
    """Warnings for models this machine cannot read, when the nodes are other machines
    (paths expand on each node: a node that lacks one shows FAILED)."""
    problems = (_model_problem(config, i) for i in range(len(config.models)))
    return [f"{p} (on this machine; nodes that lack it will be FAILED)" for p in problems if p]


def _call(ask, what: str):
    try:
        return ask()
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise WarmdInputError(f"could not {what} the warmd controller: {first[:300]}") from None


def _start_warnings(config: WarmdConfig, url: str | None, embedded: bool, nodes) -> list[str]:
    out = []
    alive = [n for n in nodes if n.alive]
    if embedded and len(alive) > 1:
        out.append("the embedded Redis listens on this machine's loopback only: the other "
                   f"{len(alive) - 1} node(s) cannot share kernels (set redis.url or "
                   "WARMD_REDIS_URL)")
    if url and not settings.store_is_off(url):
        store = node_records(url, config.redis.namespace)
        if not store.ping():
            out.append(f"shared cache {redact_url(url)} is unreachable ({store.last_error}); "
                       "nodes will warm with local compiles and show DEGRADED")
        store.close()
    return out


def stop(address: str | None, keep_services: bool = False) -> dict:
    """Remove the controller and every agent (the caches stay), then the local services
    this state dir's `warmd start` started, unless keep_services."""
    ray_api = load_ray_api()
    with daemon_lock():
        return _stop(ray_api, address, keep_services)


def _stop(ray_api, address: str | None, keep_services: bool) -> dict:
    result = {"controller": False, "agents_stopped": 0, "services_stopped": []}
    resolved = resolve_address(address)
    if resolved is not None:
        connect(ray_api, resolved)
        controller = ray_api.get_controller()
        if controller is not None:
            with contextlib.suppress(Exception):
                result["agents_stopped"] = controller.shutdown(60)["agents_stopped"]
            controller.kill()
            result["controller"] = True
        result["agents_stopped"] += ray_api.kill_orphan_agents()
        ray_api.disconnect()
    write_services({k: v for k, v in read_services().items() if k != STORE_RECORD})
    if not keep_services:
        result["services_stopped"] = stop_local_services()
    return result


# --- status ---------------------------------------------------------------------------------

def snapshot(address: str | None, store: CommandStore) -> StatusSnapshot:
    """The daemon's view: from the controller over Ray when there is one, else the node
    records in the shared cache that `store` names (command_store: never started here)."""
    if importlib.util.find_spec("ray") is None:  # a machine that only reaches Redis
        return _snapshot_from_redis(None, store)
    resolved = resolve_address(address)
    if resolved is not None:
        ray_api = load_ray_api()
        connect(ray_api, resolved)
        controller = ray_api.get_controller()
        if controller is not None:
            try:
                snap = controller.snapshot(30)
            except Exception as exc:
                raise WarmdInputError(f"the warmd controller did not answer: "
                                      f"{type(exc).__name__}: {exc}"[:300]) from None
            return StatusSnapshot.from_json({
                "source": "ray", "running": True, "ray_address": resolved,
                "controller": snap["controller"], "nodes": snap["nodes"],
                "store_size": snap["controller"].get("store_size"),
                "key_proof": snap["controller"].get("key_proof")})
    return _snapshot_from_redis(resolved, store)


def _snapshot_from_redis(resolved: str | None, store: CommandStore) -> StatusSnapshot:
    records_store = node_records(store.url, store.namespace)
    records = records_store.get_all()
    daemon = records_store.get_daemon()
    size = records_store.server_size()
    proof = records_store.key_proof(store.signing_key_file)
    records_store.close()
    return StatusSnapshot(
        running=False, source="redis" if records is not None else "none",
        nodes=tuple(records or ()), controller=ControllerView.from_json(daemon),
        ray_address=resolved, store_size=StoreSize.from_json(size),
        redis=redact_url(store.url), redis_error=records_store.last_error or None,
        embedded_dir=store.embedded_dir, key_proof=KeyProofView.from_json(proof),
        records=tuple(r.to_json() for r in records or ()))
