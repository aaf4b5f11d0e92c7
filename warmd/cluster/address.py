"""Which Ray cluster a daemon command talks to, and joining it. Addresses are checked with a
plain TCP connect before `ray.init` (which otherwise waits minutes on a dead address)."""

from __future__ import annotations

import contextlib
import importlib.util
import socket

from warmd import settings
from warmd.cluster.exposure import is_loopback
from warmd.cluster.services import read_services
from warmd.errors import WarmdInputError
from warmd.processes import pid_alive

CONNECT_TIMEOUT = 3.0


def load_ray_api():
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


def own_cluster() -> str | None:
    """The local cluster that this state dir's `warmd start` started, if it still runs."""
    ray_info = read_services().get("ray") or {}
    address = ray_info.get("address")
    if address and pid_alive(int(ray_info.get("pid", 0))) and reachable(address, 1.0) is None:
        return address
    return None


def recorded_cluster() -> str | None:
    """The cluster a `ray start` on this machine recorded in Ray's temp dir (RAY_TMPDIR),
    if it is reachable. Running Ray processes are not searched: a cluster another warmd
    state dir started is that daemon's, not this one's."""
    if importlib.util.find_spec("ray") is None:
        return None
    address = load_ray_api().recorded_address()
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
        return own_cluster() or recorded_cluster()
    return None


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
