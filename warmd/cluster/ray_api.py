"""The one place the controller and the agents call Ray, in the manner of Ray Serve's
ActorReplicaWrapper: they decide in plain code (warmd.cluster.decisions) and act through
these functions and the AgentHandle wrapper, so their logic is tested without a cluster.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from warmd.cluster import CONTROLLER_NAME, RAY_NAMESPACE, agent_name
from warmd.cluster.decisions import BUSY, DEAD, HEALTHY, UNAVAILABLE, Health
from warmd.cluster.nodes import RayNode
from warmd.errors import WarmdInputError

# --- the connection (the CLI's processes) ---------------------------------------------------

def connect(address: str, loopback_head: bool = False, token_path: str | None = None) -> None:
    """Join the cluster at address as a driver (once per process); a failure is one line.
    loopback_head: the cluster is a head `warmd start` bound to loopback; token_path: its
    Ray authentication token (the head runs with RAY_AUTH_MODE=token)."""
    if ray.is_initialized():
        return
    if loopback_head:
        _stay_on_loopback()
    if token_path:
        _use_token(token_path)
    try:
        with _stderr_captured():
            ray.init(address=address, namespace=RAY_NAMESPACE, logging_level=logging.ERROR,
                     log_to_driver=False)
    except Exception as exc:  # a version mismatch, a non-Ray server at that port...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = "" if address in first else f": {first[:300]}"
        raise WarmdInputError(f"cannot connect to the Ray cluster at {address}{detail}"
                              ) from None


def _use_token(path: str) -> None:
    """Ray's token authentication for this process, with the token in path: the variables
    Ray reads, and its config read again (Ray read it at import: its own token setup
    does the same)."""
    from ray._private.authentication.authentication_token_setup import _enable_token_auth

    os.environ["RAY_AUTH_TOKEN_PATH"] = path
    _enable_token_auth()


def _stay_on_loopback() -> None:
    """A driver of a cluster bound to loopback (warmd start's default head) keeps its own
    address on loopback too: Ray otherwise swaps 127.0.0.1 for the machine's address, where
    that cluster does not listen. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is how Ray's own
    one-machine mode says so; Ray read it at import, so its constant is set here too."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def disconnect() -> None:
    ray.shutdown()


def recorded_address() -> str | None:
    """The address a `ray start` on this machine recorded in Ray's temp dir, if any."""
    with contextlib.suppress(Exception):
        from ray._private.utils import read_ray_address

        return read_ray_address() or None
    return None


@contextlib.contextmanager
def _stderr_captured() -> Iterator[None]:
    """Ray's C++ core writes its connection retries straight to fd 2; keep them out of a
    command's output (a failed connect is reported in one line instead)."""
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


def list_nodes() -> list[RayNode]:
    """Every node Ray knows, alive or dead."""
    return [RayNode.from_ray(info) for info in ray.nodes()]


def current_node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def current_node_ip() -> str:
    return ray.util.get_node_ip_address()


def current_actor_id() -> str:
    return ray.get_runtime_context().get_actor_id() or ""


def _pinned(node_id: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


@functools.cache
def _actor_class(cls: type):
    return ray.remote(cls)


class AgentHandle:
    """One node agent's actor, as the controller uses it."""

    def __init__(self, actor) -> None:
        self.actor = actor

    @classmethod
    def spawn(cls, agent: type, node: RayNode, config_json: dict, redis_url: str | None
              ) -> AgentHandle:
        """The node's detached, named agent (an instance of `agent`, the NodeAgent class)
        pinned to it (an alive one of that name is reused, so a restarted controller never
        starts twins)."""
        actor = _actor_class(agent).options(
            name=agent_name(node.node_id), namespace=RAY_NAMESPACE, lifetime="detached",
            get_if_exists=True, num_cpus=0, num_gpus=0, max_restarts=0,
            scheduling_strategy=_pinned(node.node_id),
        ).remote(node.to_json(), config_json, redis_url)
        return cls(actor)

    def set_config(self, config_json: dict, redis_url: str | None) -> None:
        self.actor.set_config.remote(config_json, redis_url)  # answered by a health record

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)


def poll_health(agents: dict[str, AgentHandle], timeout: float) -> dict[str, Health]:
    """Ask every agent for its record at once; wait at most `timeout` seconds in all."""
    refs = {handle.actor.health.remote(): node_id for node_id, handle in agents.items()}
    if refs:
        ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    return {node_id: _health(ref) for ref, node_id in refs.items()}


def _health(ref) -> Health:
    try:
        return Health(HEALTHY, ray.get(ref, timeout=0))
    except GetTimeoutError:
        return Health(BUSY)
    except ActorDiedError as exc:
        return Health(DEAD, detail=str(exc).splitlines()[0][:200])
    except Exception as exc:  # a node restarting, a network hiccup
        return Health(UNAVAILABLE, detail=f"{type(exc).__name__}: {exc}"[:200])


def shutdown_agents(agents: dict[str, AgentHandle], timeout: float) -> None:
    """Ask every agent to stop (at most `timeout` seconds in all), then kill it."""
    stops = [handle.actor.shutdown.remote() for handle in agents.values()]
    if stops:
        ray.wait(stops, num_returns=len(stops), timeout=timeout)
    for handle in agents.values():
        handle.kill()


class ControllerHandle:
    """The controller's actor, as the CLI uses it: each call waits at most `timeout`."""

    def __init__(self, actor) -> None:
        self.actor = actor

    def ping(self, timeout: float) -> str:
        return ray.get(self.actor.ping.remote(), timeout=timeout)

    def apply(self, config_json: dict, redis_url: str | None, info: dict,
              timeout: float) -> dict:
        return ray.get(self.actor.apply.remote(config_json, redis_url, info), timeout=timeout)

    def snapshot(self, timeout: float) -> dict:
        return ray.get(self.actor.snapshot.remote(), timeout=timeout)

    def shutdown(self, timeout: float) -> dict:
        return ray.get(self.actor.shutdown.remote(), timeout=timeout)

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)


# --- the controller, as the CLI finds, creates and removes it -----------------------------

def get_controller() -> ControllerHandle | None:
    try:
        return ControllerHandle(ray.get_actor(CONTROLLER_NAME, namespace=RAY_NAMESPACE))
    except ValueError:
        return None


def create_controller(controller: type, config_json: dict, redis_url: str | None,
                      info: dict) -> ControllerHandle:
    """The detached, named controller (an instance of `controller`, the Controller class),
    preferably on the head node."""
    head = next((n.node_id for n in list_nodes() if n.is_head and n.alive), current_node_id())
    actor = _actor_class(controller).options(
        name=CONTROLLER_NAME, namespace=RAY_NAMESPACE, lifetime="detached",
        # No restarts: a restarted actor would get its first config back, not the last
        # one applied. A new `warmd start` recreates it; the agents keep running.
        get_if_exists=True, num_cpus=0, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=True))
    return ControllerHandle(actor.remote(config_json, redis_url, info))


def kill_orphan_agents() -> int:
    """Agents left without a controller (one killed by hand, say): stop and kill them."""
    killed = 0
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry.get("namespace") != RAY_NAMESPACE or not entry["name"].startswith(
                agent_name("")):
            continue
        try:
            handle = ray.get_actor(entry["name"], namespace=RAY_NAMESPACE)
            shutdown_agents({entry["name"]: AgentHandle(handle)}, timeout=10)
        except Exception:  # gone meanwhile, or its node with it
            continue
        killed += 1
    return killed


# --- the agent's warm workers ---------------------------------------------------------------

@functools.cache
def _remote_task(func: Callable):
    return ray.remote(max_calls=1)(func)  # each worker process exits: its GPU memory is freed


def run_pinned(func: Callable, node_id: str, calls: list[tuple], gpus_each: int, name: str,
               tick: float, on_tick: Callable[[], bool]) -> list[dict | Exception]:
    """Run func(*args) once per args tuple as Ray tasks on node_id, `gpus_each` GPUs each.
    on_tick() runs every `tick` seconds while they run; when it returns True the rest are
    cancelled. Returns each call's result, or the exception it ended with."""
    task = _remote_task(func)
    refs = [task.options(num_cpus=0, num_gpus=gpus_each, scheduling_strategy=_pinned(node_id),
                         name=f"{name}-{i}").remote(*args) for i, args in enumerate(calls)]
    pending = list(refs)
    while pending:
        _done, pending = ray.wait(pending, num_returns=len(pending), timeout=tick)
        if on_tick():
            for ref in pending:
                ray.cancel(ref, force=True)
            break
    results: list[dict | Exception] = []
    for ref in refs:
        try:
            results.append(ray.get(ref, timeout=0))
        except Exception as exc:  # the worker process died, was cancelled, ...
            results.append(exc)
    return results


def current_actor():
    """The handle of the actor this code runs in (workers report progress to it)."""
    return ray.get_runtime_context().current_actor


def call_later(method, *args) -> None:
    """Fire one actor method call without waiting for it."""
    method.remote(*args)


# --- fan-out between nodes (warmd.cluster.fanout) -------------------------------------------

PEER_DIRECTORY_NAME = "warmd-peers"


def peer_directory(directory: type):
    """The cluster's peer directory actor (an instance of `directory`, the PeerDirectory
    class), started by the first caller, preferably on the head node; detached, so it
    outlives the agent that started it (the controller's shutdown kills it)."""
    head = next((n.node_id for n in list_nodes() if n.is_head and n.alive), current_node_id())
    return _actor_class(directory).options(
        name=PEER_DIRECTORY_NAME, namespace=RAY_NAMESPACE, lifetime="detached",
        get_if_exists=True, num_cpus=0, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=True)).remote()


def kill_peer_directory() -> None:
    with contextlib.suppress(ValueError):  # none was started
        ray.kill(ray.get_actor(PEER_DIRECTORY_NAME, namespace=RAY_NAMESPACE),
                 no_restart=True)


def ask(method, *args, timeout: float):
    """One actor method call, waited for at most `timeout` seconds."""
    return ray.get(method.remote(*args), timeout=timeout)


def put_object(value):
    """Into this node's object store, owned by this process (kept while it holds the ref)."""
    return ray.put(value)


def get_objects(refs: list, timeout: float) -> list:
    """Each object's value, or the exception that stopped it (owner died, lost, not in
    time); Ray pulls each from any node that holds a copy. `timeout` in all."""
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=True)
    values: list = []
    for ref in refs:
        try:
            values.append(ray.get(ref, timeout=0))
        except Exception as exc:  # OwnerDiedError, ObjectLostError, GetTimeoutError...
            values.append(exc)
    return values
