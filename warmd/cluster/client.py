"""What the `warmd start|stop|status|wait-ready` commands do, from any process.

Ray addresses are checked with a plain TCP connect before `ray.init` (which otherwise waits
minutes on a dead address). Without a running cluster, `warmd start` starts a local head
(`ray start --head --block` in its own session, so `warmd stop` can end exactly what it
started) and the embedded Redis; both are recorded in <state dir>/daemon.json.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from warmd import settings
from warmd.cluster import CONTROLLER_NAME, RAY_NAMESPACE, agent_name
from warmd.cluster.state import node_records
from warmd.config import WarmdConfig, redact_url
from warmd.errors import WarmdInputError
from warmd.processes import pid_alive

CONNECT_TIMEOUT = 3.0
LOCAL_HEAD_TIMEOUT = 120.0
SERVICES_FILE = "daemon.json"
_ADDRESS_LINE = re.compile(r"ray start --address='([^']+)'")


# --- Ray connection -----------------------------------------------------------------------

def _require_ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise WarmdInputError("the daemon runs on Ray, which is not installed here: "
                              "pip install 'warmd[cluster]'") from None
    return ray


def _host_port(address: str) -> tuple[str, int]:
    bare = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = bare.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise WarmdInputError(f"invalid Ray address {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def reachable(address: str, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None when something listens at address, else why not."""
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return "timed out"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def _local_candidates() -> list[str]:
    """Clusters on this machine: the last `ray start`'s address, then running GCS servers."""
    found: list[str] = []
    with contextlib.suppress(Exception):
        from ray._private.utils import read_ray_address

        address = read_ray_address()
        if address:
            found.append(address)
    with contextlib.suppress(Exception):
        from ray._private.services import find_gcs_addresses

        found.extend(sorted(find_gcs_addresses()))
    return list(dict.fromkeys(found))


def resolve_address(address: str | None) -> str | None:
    """The address of a live cluster: explicit (checked; unreachable is bad input), or for
    None/"auto" RAY_ADDRESS, else a live local one; None when there is none."""
    if address and address != "auto":
        why = reachable(address)
        if why:
            raise WarmdInputError(f"cannot reach a Ray cluster at {address}: {why}")
        return address
    env = settings.ray_address()
    if env and env != "auto":
        why = reachable(env)
        if why:
            raise WarmdInputError(f"cannot reach the Ray cluster at RAY_ADDRESS={env}: {why}")
        return env
    for candidate in _local_candidates():
        with contextlib.suppress(WarmdInputError):
            if reachable(candidate, timeout=1.0) is None:
                return candidate
    return None


@contextlib.contextmanager
def _stderr_captured():
    """Ray's C++ core writes its connection retries straight to fd 2; keep them out of a
    command's output (a failed connect is reported in one line instead)."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def ray_init(address: str) -> None:
    ray = _require_ray()

    if ray.is_initialized():
        return
    try:
        with _stderr_captured():
            ray.init(address=address, namespace=RAY_NAMESPACE, logging_level=logging.ERROR,
                     log_to_driver=False)
    except Exception as exc:  # a version mismatch, a non-Ray server at that port...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = "" if address in first else f": {first[:300]}"
        raise WarmdInputError(f"cannot connect to the Ray cluster at {address}{detail}"
                              ) from None


# --- local services (what `warmd start` started on this machine) ---------------------------

def _services_path() -> Path:
    return settings.state_dir() / SERVICES_FILE


def read_services() -> dict:
    try:
        return json.loads(_services_path().read_text())
    except (OSError, ValueError):
        return {}


def _write_services(data: dict) -> None:
    path = _services_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def start_local_head() -> str:
    """Start a one-machine Ray cluster that outlives this process; returns its address."""
    from warmd.store import free_port

    log_path = settings.state_dir() / "ray-head.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
           f"--port={free_port()}", f"--ray-client-server-port={free_port()}",
           f"--dashboard-agent-listen-port={free_port()}", "--include-dashboard=false",
           "--disable-usage-stats"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + LOCAL_HEAD_TIMEOUT
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        found = _ADDRESS_LINE.search(text)
        if found and reachable(found.group(1), timeout=1.0) is None:
            _write_services({**read_services(), "ray": {"pid": proc.pid,
                                                        "address": found.group(1)}})
            return found.group(1)
        if proc.poll() is not None:
            tail = " | ".join(text.strip().splitlines()[-3:])
            raise WarmdInputError(f"could not start a local Ray cluster: {tail[:400]}")
        time.sleep(0.2)
    _stop_pid_group(proc.pid)
    raise WarmdInputError(f"a local Ray cluster did not come up within "
                          f"{LOCAL_HEAD_TIMEOUT:.0f}s (log: {log_path})")


def _stop_pid_group(pid: int, grace: float = 45.0) -> None:
    """SIGTERM the `ray start --block` process (it drains and stops its node), then make
    sure nothing of its session is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def stop_local_services() -> list[str]:
    """Stop the local Ray head and embedded Redis that `warmd start` started, if it did."""
    stopped = []
    services = read_services()
    ray_info = services.pop("ray", None)
    if ray_info and pid_alive(int(ray_info["pid"])):
        _stop_pid_group(int(ray_info["pid"]))
        stopped.append(f"local Ray cluster at {ray_info['address']}")
    if services.pop("embedded_redis", False):
        from warmd.store import stop_embedded

        if stop_embedded():
            stopped.append("embedded Redis (data kept)")
    _write_services(services)
    return stopped


# --- the controller -----------------------------------------------------------------------

def get_controller():
    import ray

    try:
        return ray.get_actor(CONTROLLER_NAME, namespace=RAY_NAMESPACE)
    except ValueError:
        return None


def effective_redis_url(config: WarmdConfig) -> tuple[str | None, bool]:
    """(URL the agents use, whether it is the embedded server started/reused here)."""
    if config.redis.url:
        return config.redis.url, False
    from warmd.store import EmbeddedServerError, ensure_embedded

    try:
        server = ensure_embedded()
    except EmbeddedServerError as exc:
        raise WarmdInputError(f"no Redis URL configured and no embedded Redis: {exc}") from None
    _write_services({**read_services(), "embedded_redis": True})
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


def start(config: WarmdConfig, address: str | None) -> Started:
    """Connect (or start a local cluster), then create or update the controller."""
    ray = _require_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from warmd.cluster.controller import Controller
    from warmd.cluster.nodes import list_nodes

    resolved = resolve_address(address)
    if resolved is None and address == "auto":
        raise WarmdInputError("no running Ray cluster found (--address auto); start one "
                              "with `ray start --head`, or leave out --address")
    url, embedded = effective_redis_url(config)  # before starting anything else
    started_local = resolved is None
    if started_local:
        resolved = start_local_head()
    ray_init(resolved)
    warnings = _start_warnings(config, url, embedded, list_nodes())
    info = {"ray_address": resolved, "embedded_redis": embedded, "started": time.time()}
    controller = get_controller()
    created = controller is None
    if created:
        head = next((n.node_id for n in list_nodes() if n.is_head and n.alive),
                    ray.get_runtime_context().get_node_id())
        actor = ray.remote(Controller).options(
            name=CONTROLLER_NAME, namespace=RAY_NAMESPACE, lifetime="detached",
            # No restarts: a restarted actor would get its first config back, not the last
            # one applied. A new `warmd start` recreates it; the agents keep running.
            get_if_exists=True, num_cpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=True))
        controller = actor.remote(config.to_json(), url, info)
        config_hash = _call(controller.ping.remote(), "start")
    else:
        config_hash = _call(controller.apply.remote(config.to_json(), url, info),
                            "update")["config_hash"]
    return Started(resolved, started_local, created, config_hash, redact_url(url), embedded,
                   warnings)


def _call(ref, what: str, timeout: float = 120.0):
    import ray

    try:
        return ray.get(ref, timeout=timeout)
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
    `warmd start` started, unless keep_services."""
    ray = _require_ray()

    result = {"controller": False, "agents_stopped": 0, "services_stopped": []}
    resolved = resolve_address(address)
    if resolved is not None:
        ray_init(resolved)
        controller = get_controller()
        if controller is not None:
            with contextlib.suppress(Exception):
                done = ray.get(controller.shutdown.remote(), timeout=60)
                result["agents_stopped"] = done["agents_stopped"]
            ray.kill(controller, no_restart=True)
            result["controller"] = True
        result["agents_stopped"] += _kill_orphan_agents()
        ray.shutdown()
    if not keep_services:
        result["services_stopped"] = stop_local_services()
    return result


def _kill_orphan_agents() -> int:
    """Agents left without a controller (one killed by hand, say)."""
    import ray

    killed = 0
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry.get("namespace") != RAY_NAMESPACE or not entry["name"].startswith(
                agent_name("")):
            continue
        with contextlib.suppress(Exception):
            handle = ray.get_actor(entry["name"], namespace=RAY_NAMESPACE)
            with contextlib.suppress(Exception):
                ray.get(handle.shutdown.remote(), timeout=10)
            ray.kill(handle, no_restart=True)
            killed += 1
    return killed


# --- status ---------------------------------------------------------------------------------

def snapshot(address: str | None, config: WarmdConfig | None) -> dict:
    """The daemon's view: from the controller over Ray when there is one, else the node
    records in Redis. {"source", "running", "controller", "nodes", "store_size"}."""
    try:
        import ray
    except ModuleNotFoundError:  # a machine that only reaches Redis
        return _snapshot_from_redis(None, config)
    resolved = resolve_address(address)
    if resolved is not None:
        ray_init(resolved)
        controller = get_controller()
        if controller is not None:
            try:
                snap = ray.get(controller.snapshot.remote(), timeout=30)
            except Exception as exc:
                raise WarmdInputError(f"the warmd controller did not answer: "
                                      f"{type(exc).__name__}: {exc}"[:300]) from None
            return {"source": "ray", "running": True, "ray_address": resolved,
                    "controller": snap["controller"], "nodes": snap["nodes"],
                    "store_size": snap["controller"].get("store_size")}
    return _snapshot_from_redis(resolved, config)


def _snapshot_from_redis(resolved: str | None, config: WarmdConfig | None) -> dict:
    url = config.redis.url if config else None
    if not url:
        from warmd.store import embedded_status

        server = embedded_status()
        url = server.url if server else None
    namespace = config.redis.namespace if config else settings.namespace()
    store = node_records(url, namespace)
    records = store.get_all()
    daemon = store.get_daemon()
    size = store.server_size()
    store.close()
    return {"source": "redis" if records is not None else "none", "running": False,
            "ray_address": resolved, "controller": daemon, "nodes": [
                r.to_json() for r in records or []], "store_size": size,
            "redis": redact_url(url), "redis_error": store.last_error}


def node_matches(record: dict, wanted: str) -> bool:
    """--node-id takes a node id, a unique prefix of one, or the node's IP address."""
    return record["node_id"].startswith(wanted) or record.get("ip") == wanted
