"""What the `warmd start|stop|status|wait-ready` commands do, from any process.

Ray addresses are checked with a plain TCP connect before `ray.init` (which otherwise waits
minutes on a dead address). Without a running cluster, `warmd start` starts a local head
(`ray start --head --block` in its own session, so `warmd stop` can end exactly what it
started) and the embedded Redis; what it started, and the shared cache it runs with, are
recorded in <state dir>/daemon.json (mode 0600: the store's URL may hold a password).
One daemon per state dir: `start` and `stop` hold <state dir>/daemon.lock, so a second
`start` waits for the first and then joins the cluster it recorded.

Commands that only read or maintain the shared cache (`warmd cache ...`, `status` without a
controller) find it with command_store(): never by starting a server.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from warmd import settings
from warmd.cluster.exposure import is_loopback
from warmd.cluster.state import node_records
from warmd.cluster.status import ControllerView, KeyProofView, StatusSnapshot, StoreSize
from warmd.config import WarmdConfig, expand_path, redact_url
from warmd.config.load import load_config
from warmd.errors import WarmdInputError
from warmd.processes import pid_alive

CONNECT_TIMEOUT = 3.0
LOCAL_HEAD_TIMEOUT = 120.0
SERVICES_FILE = "daemon.json"
LOCK_FILE = "daemon.lock"
STORE_RECORD = "store"  # in daemon.json: the shared cache the running daemon uses
_STARTED_LINE = "Ray runtime started."  # what `ray start --head` logs once it is up


# --- Ray connection -----------------------------------------------------------------------

def _ray_api():
    """warmd.cluster.ray_api (every Ray call goes through it); bad input when Ray is not
    installed here."""
    if importlib.util.find_spec("ray") is None:
        raise WarmdInputError("the daemon runs on Ray, which is not installed here: "
                              "pip install 'warmd[cluster]'")
    from warmd.cluster import ray_api

    return ray_api


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


def _own_cluster() -> str | None:
    """The local cluster that this state dir's `warmd start` started, if it still runs."""
    ray_info = read_services().get("ray") or {}
    address = ray_info.get("address")
    if address and pid_alive(int(ray_info.get("pid", 0))) and reachable(address, 1.0) is None:
        return address
    return None


def _recorded_cluster() -> str | None:
    """The cluster a `ray start` on this machine recorded in Ray's temp dir (RAY_TMPDIR),
    if it is reachable. Running Ray processes are not searched: a cluster another warmd
    state dir started is that daemon's, not this one's."""
    if importlib.util.find_spec("ray") is None:
        return None
    address = _ray_api().recorded_address()
    if address and reachable(address, timeout=1.0) is None:
        return address
    return None


def resolve_address(address: str | None) -> str | None:
    """The address of a live cluster: explicit (checked; unreachable is bad input), or for
    None/"auto" RAY_ADDRESS, else the one this state dir's daemon started, else the one
    `ray start` recorded on this machine; None when there is none."""
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
    with contextlib.suppress(WarmdInputError):
        return _own_cluster() or _recorded_cluster()
    return None


# --- local services (what `warmd start` started on this machine) ---------------------------

def connect(ray_api, address: str) -> None:
    """Join the cluster at address: a head on a loopback address is joined on loopback
    (whoever started it: another state dir's `warmd start`, or `ray start` recorded in
    Ray's temp dir; joined otherwise, Ray's driver waits without end on the machine's own
    address), and one this state dir's `warmd start` started with Ray's token
    authentication with its token."""
    ray_info = read_services().get("ray") or {}
    ours = ray_info.get("address") == address
    ray_api.connect(address, loopback_head=is_loopback(address.rsplit(":", 1)[0]),
                    token_path=ray_info.get("auth_token_path") if ours else None)


def _services_path() -> Path:
    return settings.state_dir() / SERVICES_FILE


def read_services() -> dict:
    try:
        return json.loads(_services_path().read_text())
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def daemon_lock():
    """Held by `start` and `stop`: one daemon per state dir, and daemon.json written by one
    process at a time. A second holder waits."""
    path = settings.state_dir() / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _write_services(data: dict) -> None:
    path = _services_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the URL's password
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


@dataclass(frozen=True)
class HeadLaunch:
    """How `warmd start` starts a local Ray head: its command and environment."""

    cmd: list[str]
    env: dict[str, str]
    auth_token_path: str | None  # Ray's token authentication is on, with this token
    warnings: list[str]


def head_launch(host: str, ports: list[int], environ: dict[str, str],
                auth_mode: str = "") -> HeadLaunch:
    """The head's command for a config's ray.host. On loopback (the default) every Ray
    process binds 127.0.0.1 (Ray then takes the node to be alone, as on a laptop: its gRPC
    servers, client server and agents listen on loopback only). On another address the head
    is for other machines to join: Ray's token authentication is turned on (RAY_AUTH_MODE=
    token) with a token kept in the state dir (0600), unless auth_mode (RAY_AUTH_MODE) says
    otherwise; on loopback too when auth_mode is token."""
    gcs, client_server, agent = ports
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
           f"--port={gcs}", f"--ray-client-server-port={client_server}",
           f"--dashboard-agent-listen-port={agent}", "--include-dashboard=false",
           "--disable-usage-stats", f"--node-ip-address={host}"]
    env = {k: v for k, v in environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_ADDRESS")}
    mode = auth_mode
    if is_loopback(host):
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # node IP stays 127.0.0.1
        if mode != "token":  # this machine alone: token authentication only when asked
            return HeadLaunch(cmd, env, None, [])
    elif mode and mode != "token":
        return HeadLaunch(cmd, env, None, [
            f"the Ray head listens on {host} without authentication (RAY_AUTH_MODE={mode}): "
            "anyone who reaches it can run code as this daemon"])
    token = ray_auth_token()
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)})
    return HeadLaunch(cmd, env, str(token), [])


def ray_auth_token() -> Path:
    """The token of Ray's authentication for the head this state dir starts: created once,
    mode 0600 (nodes joining need the same token: docs/daemon.md)."""
    import secrets

    path = settings.state_dir() / "ray-auth-token"
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    return path


def start_local_head(host: str = "127.0.0.1") -> tuple[str, list[str]]:
    """Start a Ray cluster on this machine that outlives this process, bound to host;
    returns its address and warnings."""
    from warmd.store import free_port

    log_path = settings.state_dir() / "ray-head.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    ports = [free_port(), free_port(), free_port()]
    launch = head_launch(host, ports, dict(os.environ), settings.ray_auth_mode())
    address = f"[{host}]:{ports[0]}" if ":" in host else f"{host}:{ports[0]}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(launch.cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=launch.env)
    deadline = time.monotonic() + LOCAL_HEAD_TIMEOUT
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        if _STARTED_LINE in text and reachable(address, timeout=1.0) is None:
            _write_services({**read_services(), "ray": {
                "pid": proc.pid, "address": address,
                "auth_token_path": launch.auth_token_path}})
            return address, launch.warnings
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
    """Stop the local Ray head and embedded Redis that `warmd start` started (or, for the
    Redis, took over from a warmup), if it did."""
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


# --- the shared cache a command talks to ---------------------------------------------------

@dataclass(frozen=True)
class CommandStore:
    """The shared cache a command reads or maintains, and what chose it. url None: there is
    none to talk to (problem says why: the embedded server is not running)."""

    url: str | None
    namespace: str
    signing_key_file: str | None
    chosen_by: str
    problem: str | None = None
    embedded_dir: str | None = None  # the stopped embedded server's data, when kept

    def env(self) -> dict[str, str]:
        """The variables that make this process see the store as the daemon does: the
        namespace (part of every fingerprint) and the signing key file."""
        env = {"WARMD_NAMESPACE": self.namespace}
        if self.signing_key_file:
            env["WARMD_SIGNING_KEY_FILE"] = expand_path(self.signing_key_file)
        return env


def command_store(config_path: str | None = None, redis_url: str | None = None,
                  namespace: str | None = None) -> CommandStore:
    """The shared cache of a command that only reads or maintains it, never started here:
    --redis, else the config (--config, WARMD_REDIS_URL, WARMD_CONFIG), else the one the
    daemon that this state dir's `warmd start` runs uses, else the embedded default: the
    embedded server of this state dir, when it runs."""
    explicit = config_path or redis_url or settings.redis_url() or settings.config_path()
    recorded = None if explicit else read_services().get(STORE_RECORD)
    if not recorded:
        config = load_config(config_path, redis_url=redis_url, namespace=namespace)
        return config_store(config, "--redis" if redis_url else "WARMD_REDIS_URL"
                            if settings.redis_url() else f"config {config.source}")
    ns = namespace or settings.namespace_override() or recorded.get("namespace") or \
        settings.namespace()
    key_file = settings.signing_key_file() or recorded.get("signing_key_file")
    return _store(recorded.get("url"), ns, key_file,
                  f"the running daemon's config ({recorded.get('config', '?')})")


def config_store(config: WarmdConfig, chosen_by: str | None = None) -> CommandStore:
    """The shared cache of a loaded config (its embedded server found, not started)."""
    return _store(config.redis.url, config.redis.namespace, config.signing_key_file,
                  chosen_by or f"config {config.source}")


def _store(url: str | None, ns: str, key_file: str | None, chosen_by: str) -> CommandStore:
    if settings.store_is_off(url):
        return CommandStore(None, ns, key_file, chosen_by,
                            f"the shared cache is off ({chosen_by})")
    if url:
        return CommandStore(url, ns, key_file, chosen_by)
    return _embedded_store(ns, key_file)


def _embedded_store(namespace: str, key_file: str | None) -> CommandStore:
    """The embedded server of this state dir, found, not started."""
    from warmd.store import embedded_dir, embedded_status

    server = embedded_status()
    chosen_by = f"the embedded server of {settings.state_dir()}"
    if server is not None:
        return CommandStore(server.url, namespace, key_file, chosen_by)
    kept = str(embedded_dir()) if embedded_dir().is_dir() else None
    where = f" (data kept in {kept})" if kept else ""
    return CommandStore(None, namespace, key_file, chosen_by,
                        f"no shared cache is running: the embedded server is stopped{where}; "
                        "start it with `warmd cache server start` or `warmd start`, or name "
                        "a store with --redis or --config", kept)


def store_size(store: CommandStore) -> StoreSize | None:
    """The store's size and capacity (None when unknown or unreachable)."""
    records = node_records(store.url, store.namespace)
    try:
        return StoreSize.from_json(records.server_size())
    finally:
        records.close()


def _record_store(config: WarmdConfig, url: str | None, embedded: bool) -> None:
    """What the daemon runs with, for the commands that read its store (command_store)."""
    record = {"url": None if embedded else url, "namespace": config.redis.namespace,
              "signing_key_file": config.signing_key_file, "config": config.source}
    _write_services({**read_services(), STORE_RECORD: record})


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
    no_node: str | None = None  # why the config selects no node of the cluster
    seconds: dict = field(default_factory=dict)  # "ray" (start/connect), "controller"


def start(config: WarmdConfig, address: str | None,
          say: Callable[[str], None] | None = None) -> Started:
    """Connect (or start a local cluster), then create or update the controller; one
    `start` at a time per state dir. ``say`` hears of each step as it begins."""
    ray_api = _ray_api()
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
    this_machine = resolved is None or resolved == _own_cluster()
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
    _record_store(config, url, embedded)
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
    ray_api = _ray_api()
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
    _write_services({k: v for k, v in read_services().items() if k != STORE_RECORD})
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
        ray_api = _ray_api()
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
