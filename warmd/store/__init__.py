"""The cluster's store: the compiled-kernel cache and the daemon's node records, in Redis
(see docs/redis.md). What callers may use is declared in warmd.store.api and exported here;
everything else in the package is the Redis backend's own business.

    cache = open_shared_cache(url, target=plan.env.target)   # None: WARMD_REDIS_URL or embedded
    names = cache.fetch_task(adapter, task.key)               # or cache.prefetch(adapter, keys)
    with cache.single_flight(task.key, timeout=600) as mine:
        ...compile when mine, else fetch_task again...
    cache.publish_task(adapter, task.key, entries, seconds)
    cache.record_outcomes({"local_hits": 3, "compiled": 1, "flashinfer.compiled": 1})
    cache.close()
"""

from __future__ import annotations

import logging
from pathlib import Path

from warmd import settings
from warmd.context import NodeContext
from warmd.errors import WarmdInputError
from warmd.store.api import NodeRecords, SharedCache, StoreFailed
from warmd.store.breaker import CircuitBreaker, JoinBudget
from warmd.store.connection import (
    CONNECT_TIMEOUT,
    SOCKET_TIMEOUT,
    StoreURL,
    parse_store_url,
    redact,
)
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
from warmd.store.redis_backend import RedisBackend
from warmd.store.redis_store import RedisSharedCache
from warmd.store.transport import RedisTransport

log = logging.getLogger("warmd.store")

__all__ = ["EmbeddedServerError", "Fingerprint", "NodeRecords", "ServerProcess", "SharedCache",
           "StartedBy", "StoreFailed", "compute_fingerprint", "digest_of", "embedded_dir",
           "embedded_status", "ensure_embedded", "free_port", "open_node_records",
           "open_shared_cache", "parse_store_url", "redact", "resolve_store_url", "start_server",
           "stop_embedded"]


def resolve_store_url(url: str | None = None, state_dir: Path | None = None
                      ) -> tuple[StoreURL | None, object]:
    """(store URL, embedded server or None): an explicit URL, else WARMD_REDIS_URL, else the
    embedded server of state_dir (default: this process's; started if needed). 'off' gives
    (None, None). Raises WarmdInputError for a malformed URL and EmbeddedServerError when no
    embedded server can run."""
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
    store (it then degrades to misses), only for bad input (a malformed URL, an unreadable
    key file). A second backend is chosen here, by the URL's scheme.

    ``context``: the node's settings (namespace, signing key, node name, bounds; default:
    this process's environment). Keyword arguments go to the backend: target (the plan's
    Target, part of every fingerprint), node, lease_seconds, poll_interval, socket_timeout,
    ttl_seconds...
    """
    context = context or NodeContext.of()
    kw["context"] = context
    key = kw.pop("signing_key", None) or signing_key(context)
    try:
        store_url, server = resolve_store_url(url, context.state_dir)
    except EmbeddedServerError as exc:
        log.warning("shared cache disabled: %s", exc)
        return RedisSharedCache(None, signing_key=key, disabled_reason=str(exc), **kw)
    if store_url is None:
        return RedisSharedCache(None, signing_key=key, disabled_reason="disabled by 'off'", **kw)
    cache = RedisSharedCache(store_url, signing_key=key, embedded=server, **kw)
    cache.ping()  # learn now whether the store is there; a failure opens the breaker
    return cache


def open_node_records(url: str | None, namespace: str, ttl: float = 120.0,
                      decode=dict) -> NodeRecords:
    """The daemon's node records of one namespace at url (None or 'off': none kept);
    `decode` turns each stored record (a dict) back into the caller's type."""
    protect_environment()
    if url is None or settings.store_is_off(url):
        return StoreNodeRecords(None, None, namespace, ttl, decode)
    backend = _records_backend(url)
    return StoreNodeRecords(backend, url, namespace, ttl, decode, size=backend.server_size)


def _records_backend(url: str) -> RedisBackend:
    """A RedisBackend for the daemon's records: every call tried once, none held back by a
    breaker, nothing logged (each failure is counted and said by the records)."""
    return RedisBackend(RedisTransport(
        parse_store_url(url), connect_timeout=CONNECT_TIMEOUT, socket_timeout=SOCKET_TIMEOUT,
        breaker=CircuitBreaker(cooldown=0.0, max_cooldown=0.0), disabled_reason=None,
        count=lambda _name: None, budget=JoinBudget(0.0), quiet=True))
