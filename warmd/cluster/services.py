"""What `warmd start` started on this machine and the shared cache it runs with, recorded in
<state dir>/daemon.json (mode 0600: the store's URL may hold a password); and the lock that
makes it one daemon per state dir (`start` and `stop` hold <state dir>/daemon.lock, so a
second `start` waits for the first and then joins the cluster it recorded)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from warmd import settings

SERVICES_FILE = "daemon.json"
LOCK_FILE = "daemon.lock"
STORE_RECORD = "store"  # in daemon.json: the shared cache the running daemon uses


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


def write_services(data: dict) -> None:
    path = _services_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the URL's password
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)
