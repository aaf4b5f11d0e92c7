"""The cluster's store: the compiled-kernel cache and the daemon's node records, over one
of the store backends (warmd.store.backend), chosen by the URL's scheme: redis://,
rediss://, unix:// and the Redis Cluster URLs (see docs/redis.md), or sqlite:///path (one
SQLite file shared by the processes of one machine). What callers may use is declared in
warmd.store.api and exported here; everything else in the package is the store's own
business.

    cache = open_shared_cache(url, target=plan.env.target)   # None: WARMD_REDIS_URL or embedded
    names = cache.entries.fetch_task(adapter, task.key)  # or cache.entries.prefetch(...)
    with cache.claims.single_flight(task.key, timeout=600) as mine:
        ...compile when mine, else entries.fetch_task again...
    cache.entries.publish_task(adapter, task.key, entries, seconds)
    cache.stats.record_outcomes({"compiled": 1, "flashinfer.compiled": 1})
    cache.close()
"""

from __future__ import annotations

import logging
from pathlib import Path

from warmd import settings
from warmd.context import NodeContext
from warmd.errors import WarmdInputError
from warmd.store.api import NodeRecords, SharedCache, StoreFailed
from warmd.store.backend import KeyValueBackend, NoStore, StoreBackends
from warmd.store.breaker import CircuitBreaker, JoinBudget
from warmd.store.connection import (
    CONNECT_TIMEOUT,
    SOCKET_TIMEOUT,
    StoreURL,
    parse_store_url,
    redact,
)
from warmd.store.counters import StoreStats
from warmd.store.credentials import protect_environment
from warmd.store.embedded import (
    EmbeddedServerError,
    ServerProcess,
    StartedBy,
    embedded_dir,
    embedded_status,
    ensure_embedded,
    free_port,
    start_server,
    stop_embedded,
)
from warmd.store.fingerprint import Fingerprint, compute_fingerprint, digest_of
from warmd.store.nodes import StoreNodeRecords
from warmd.store.redis_backend import RedisBackend, open_redis
from warmd.store.shared import StoreSharedCache
from warmd.store.sqlite_backend import (
    SqliteBackend,
    is_sqlite_url,
    open_sqlite,
    sqlite_path,
    usable_sqlite_path,
)
from warmd.store.transport import RedisTransport

log = logging.getLogger("warmd.store")

__all__ = ["EmbeddedServerError", "Fingerprint", "NodeRecords", "ServerProcess", "SharedCache",
           "StartedBy", "StoreFailed", "check_store_url", "compute_fingerprint", "digest_of",
           "embedded_dir", "embedded_status", "ensure_embedded", "free_port",
           "open_node_records", "open_shared_cache", "parse_store_url", "redact",
           "resolve_store_url", "start_server", "stop_embedded"]
# What open_shared_cache hands the store's connection rather than the cache.
_CONNECTION_ARGS = ("connect_timeout", "socket_timeout", "breaker", "join_budget")


def check_store_url(url: str) -> None:
    """WarmdInputError, with one clear line, for a malformed store URL of any scheme."""
    if is_sqlite_url(url):
        sqlite_path(url)
    else:
        parse_store_url(url)


def resolve_store_url(url: str | None = None, state_dir: Path | None = None
                      ) -> tuple[StoreURL | None, object]:
    """(store URL, embedded server or None): an explicit URL, else WARMD_REDIS_URL, else the
    embedded server of state_dir (default: this process's; started if needed). 'off' gives
    (None, None). Raises WarmdInputError for a malformed URL (a sqlite:/// URL is no Redis
    URL: open_shared_cache opens it) and EmbeddedServerError when no embedded server can
    run."""
    protect_environment()
    url = url or settings.redis_url()
    if settings.store_is_off(url):
        return None, None
    if url:
        return parse_store_url(url), None
    server = ensure_embedded(state_dir)
    return parse_store_url(server.url), server


def signing_key(context: NodeContext) -> bytes | None:
    try:
        return context.signing_key()
    except OSError as exc:
        raise WarmdInputError(f"cannot read WARMD_SIGNING_KEY_FILE: {exc.strerror}: "
                              f"{exc.filename}") from None


def open_shared_cache(url: str | None = None, context: NodeContext | None = None,
                      **kw) -> SharedCache:
    """The shared cache of a node (the one factory); never raises for an unreachable
    store (it then degrades to misses), only for bad input (a malformed URL, a SQLite file
    that cannot be written, an unreadable key file). The URL's scheme picks the backend.

    ``context``: the node's settings (namespace, signing key, node name, bounds; default:
    this process's environment). Keyword arguments: the store's connection
    (connect_timeout, socket_timeout, breaker, join_budget), the rest go to the cache
    (warmd.store.shared.StoreSharedCache): target (the plan's Target, part of every
    fingerprint), node, lease_seconds, poll_interval, ttl_seconds...
    """
    context = context or NodeContext.of()
    key = kw.pop("signing_key", None) or signing_key(context)
    stats = StoreStats(kw.pop("node", None) or context.node_name(), context.state_dir)
    connection = {name: kw.pop(name) for name in _CONNECTION_ARGS if name in kw}
    try:
        store, server = _open_store(url, context, stats, **connection)
    except EmbeddedServerError as exc:
        log.warning("shared cache disabled: %s", exc)
        store, server = StoreBackends.one(NoStore(str(exc), stats.count)), None
    cache = StoreSharedCache(store, stats, signing_key=key, embedded=server, context=context,
                             **kw)
    if not cache.disabled_reason:
        cache.ping()  # learn now whether the store is there; a failure opens the breaker
    return cache


def _open_store(url: str | None, context: NodeContext, stats: StoreStats, *,
                connect_timeout: float = CONNECT_TIMEOUT, socket_timeout: float | None = None,
                breaker: CircuitBreaker | None = None, join_budget: float | None = None
                ) -> tuple[StoreBackends, object]:
    """(the store at url, the embedded server it is or None), counting into stats."""
    protect_environment()
    timeout = socket_timeout or context.store.timeout
    url = url or settings.redis_url()
    if url and is_sqlite_url(url):
        return open_sqlite(url, count=stats.count, timeout=timeout, breaker=breaker), None
    store_url, server = resolve_store_url(url, context.state_dir)
    if store_url is None:
        return StoreBackends.one(NoStore("disabled by 'off'", stats.count)), None
    return open_redis(store_url, count=stats.count, connect_timeout=connect_timeout,
                      socket_timeout=timeout, breaker=breaker,
                      join_budget=join_budget or context.store.join_budget), server


def open_node_records(url: str | None, namespace: str, ttl: float = 120.0,
                      decode=dict, timeout: float = SOCKET_TIMEOUT) -> NodeRecords:
    """The daemon's node records of one namespace at url (None or 'off': none kept);
    `decode` turns each stored record (a dict) back into the caller's type; a call waits
    at most about `timeout` seconds for the store."""
    protect_environment()
    if url is None or settings.store_is_off(url):
        return StoreNodeRecords(None, None, namespace, ttl, decode)
    backend = _records_backend(url, timeout)
    return StoreNodeRecords(backend, url, namespace, ttl, decode, size=backend.server_size)


def _records_backend(url: str, timeout: float) -> KeyValueBackend:
    """A backend for the daemon's records: every call tried once, none held back by a
    breaker, nothing logged (each failure is counted and said by the records)."""
    never_open = CircuitBreaker(cooldown=0.0, max_cooldown=0.0)
    if is_sqlite_url(url):
        return SqliteBackend(usable_sqlite_path(url), timeout=timeout, breaker=never_open)
    return RedisBackend(RedisTransport(
        parse_store_url(url), connect_timeout=CONNECT_TIMEOUT, socket_timeout=timeout,
        breaker=never_open, disabled_reason=None, count=lambda _name: None,
        budget=JoinBudget(0.0), quiet=True))
