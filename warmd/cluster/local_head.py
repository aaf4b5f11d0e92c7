"""The local Ray head `warmd start` starts when no cluster runs (`ray start --head --block`
in its own session, so `warmd stop` can end exactly what it started), and stopping what this
state dir's `warmd start` started: that head and the embedded Redis."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from warmd import settings
from warmd.cluster.address import reachable
from warmd.cluster.exposure import is_loopback
from warmd.cluster.services import read_services, write_services
from warmd.errors import WarmdInputError
from warmd.processes import pid_alive

LOCAL_HEAD_TIMEOUT = 120.0
_STARTED_LINE = "Ray runtime started."  # what `ray start --head` logs once it is up
# What Ray says of a port another process took between warmd's probe and Ray's bind: its
# GCS's own words (fatal: said at once, while `ray start` waits tens of seconds to exit),
# and, once `ray start` has exited, the socket error of another of its servers
GCS_PORT_TAKEN = "Failed to start the grpc server"
PORT_TAKEN = (GCS_PORT_TAKEN, "ddress already in use")
HEAD_ATTEMPTS = 3


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
    returns its address and warnings. Ports are picked free; one another process takes
    before Ray binds it (a busy machine) is picked again, HEAD_ATTEMPTS times in all."""
    log_path = settings.state_dir() / "ray-head.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for _attempt in range(HEAD_ATTEMPTS):
        started = _launch_head(host, log_path)
        if not isinstance(started, str):
            return started
        if not any(words in started for words in PORT_TAKEN):
            break
    raise WarmdInputError(f"could not start a local Ray cluster: {started[:400]}")


def _launch_head(host: str, log_path: Path) -> tuple[str, list[str]] | str:
    """One try: the head's address and warnings once it is up, or the tail of its log when
    it exited."""
    from warmd.store import free_port

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
            write_services({**read_services(), "ray": {
                "pid": proc.pid, "address": address,
                "auth_token_path": launch.auth_token_path}})
            return address, launch.warnings
        if proc.poll() is not None or GCS_PORT_TAKEN in text:
            _stop_pid_group(proc.pid, grace=5.0)  # whatever of its session did start
            return " | ".join(text.strip().splitlines()[-3:])
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
    write_services(services)
    return stopped
