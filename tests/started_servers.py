"""The Redis-protocol servers a test started (store_support.start_test_server), stopped when
the test ends (conftest.py), pass or fail: a test that fails before its own stop leaves none
running. A server a module- or session-scoped fixture starts is that fixture's to stop, and is
not recorded, even when a test's fixture asks for it first (request.getfixturevalue).

conftest.py imports this for every test, so it imports nothing heavy: warmd.store is only
imported by the tests that start a server."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warmd.store import ServerProcess

_setting_up: list[str] = []  # the scopes of the fixtures being set up, innermost last
_of_the_test: list[ServerProcess] = []


@contextlib.contextmanager
def fixture_setup(scope: str) -> Iterator[None]:
    """Around a fixture's setup: servers started in it belong to a fixture of this scope."""
    _setting_up.append(scope)
    try:
        yield
    finally:
        _setting_up.pop()


def started(server: ServerProcess) -> None:
    """Record a server just started, unless a fixture broader than a test's started it."""
    if not _setting_up or _setting_up[-1] == "function":
        _of_the_test.append(server)


def stop_the_tests() -> None:
    """Stop the servers the test that just ended started and left running."""
    while _of_the_test:
        server = _of_the_test.pop()
        if _runs(server):
            server.stop()


def _runs(server: ServerProcess) -> bool:
    """Whether the server's own process still runs: redis-server works in its data directory,
    so neither a pid reused since the test stopped it nor a zombie counts (and its port,
    which another test's server may have taken, is never asked)."""
    try:
        return Path(os.readlink(f"/proc/{server.pid}/cwd")) == Path(server.data_dir).resolve()
    except OSError:
        return False
