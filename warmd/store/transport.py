"""Talking to Redis: lazily built clients (one for the primaries, one whose reads may go to
replicas when the URL asks), their Lua scripts, the join budget and circuit breaker, and the
one wrapper (`op`) every store call goes through, which retries a slow store and turns store
errors into StoreFailed."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from warmd.store.api import StoreFailed
from warmd.store.breaker import CircuitBreaker, JoinBudget
from warmd.store.connection import (
    STORE_ERRORS,
    StoreURL,
    classify,
    is_refused,
    make_client,
    scrub,
)

log = logging.getLogger("warmd.store")

SCRIPTS = {
    # KeyValueBackend.compare_and_set: if the key holds ARGV[2] (ARGV[1] == '1'), or is
    # absent (ARGV[1] == '0'), set ARGV[4] with PX ARGV[5] ('0': none) when ARGV[3] == '1',
    # else delete it. A key of another Redis type never matches.
    "cas": """
local kind = redis.call('TYPE', KEYS[1])['ok']
if ARGV[1] == '1' then
  if kind ~= 'string' or redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
elseif kind ~= 'none' then return 0 end
if ARGV[3] ~= '1' then
  redis.call('DEL', KEYS[1])
elseif ARGV[5] == '0' then
  redis.call('SET', KEYS[1], ARGV[4])
else
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
end
return 1
""",
}


# Calls never retried: best effort ones (a TTL refresh, the backend's expire; counters, which
# are kept for later), the claims' (warmd.store.leases: a claim retried after a timeout that
# took the lease would find its own token and wait for itself) and, for the same reason, the
# backend's conditional writes (warmd.store.redis_backend: a retried one that had applied
# would answer False).
NOT_RETRIED = frozenset({"expire", "stats", "lease", "put-if-absent", "compare-and-set",
                         "increment"})


class RedisTransport:
    """store_url=None: every op raises StoreFailed("disabled") with disabled_reason. quiet:
    the store's failures are the caller's to report (logged at debug level only)."""

    def __init__(self, store_url: StoreURL | None, *, connect_timeout: float,
                 socket_timeout: float, breaker: CircuitBreaker | None,
                 disabled_reason: str | None, count: Callable[[str], None],
                 budget: JoinBudget | None = None, quiet: bool = False) -> None:
        self.store_url = store_url
        self.connect_timeout = connect_timeout
        self.socket_timeout = socket_timeout
        self.breaker = breaker or CircuitBreaker()
        self.budget = budget or JoinBudget(60.0)
        self.disabled_reason = disabled_reason if store_url else (disabled_reason or "disabled")
        self.last_error: str | None = None
        self._count = count  # the store's counters (store_skipped, store_errors, ...)
        self._warn = log.debug if quiet else log.warning
        self._clients: dict[bool, Any] = {}  # replicas? -> client
        self._scripts: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._reached = False  # whether the store ever answered this process
        self._gave_up = False  # whether the join budget ran out (counted once)

    @property
    def display_url(self) -> str:
        return self.store_url.display if self.store_url else "(none)"

    @property
    def replica_reads(self) -> bool:
        """Whether reads may be answered by replicas (then a refusal or a miss they gave is
        asked again of the primary before it counts)."""
        return bool(self.store_url and self.store_url.read_from)

    def _get_client(self, replicas: bool = False):
        replicas = replicas and self.replica_reads
        with self._lock:
            if replicas not in self._clients:
                client = make_client(self.store_url, self.connect_timeout, self.socket_timeout,
                                     replicas=replicas)
                if not replicas:
                    self._scripts = {name: client.register_script(src)
                                     for name, src in SCRIPTS.items()}
                self._clients[replicas] = client
            return self._clients[replicas]

    def op(self, fn: Callable[[Any], Any], what: str, replicas: bool = False) -> Any:
        """fn(client) through the join budget and the circuit breaker: a slow store (a
        timeout, a lost connection) is tried again after a backoff with jitter until the
        budget is spent; a store error that stays raises StoreFailed. With replicas, fn's
        reads may be answered by replicas (when the URL asks for it)."""
        if self.disabled_reason:
            self._count("store_skipped")
            raise StoreFailed("disabled", self.disabled_reason)
        attempt = 0
        while True:
            if not self.breaker.allow():
                self._count("store_skipped")
                raise StoreFailed("open", "circuit breaker open")
            try:
                result = fn(self._get_client(replicas))
            except STORE_ERRORS as exc:
                wait = self._retry_after(exc, what, attempt)
                if wait is None:
                    raise self.failure(exc, what) from None
                self._count("store_retries")
                time.sleep(wait)
                attempt += 1
                continue
            self._reached = True
            self.budget.succeeded()
            self.breaker.success()
            return result

    def _retry_after(self, exc: BaseException, what: str, attempt: int) -> float | None:
        """Seconds to wait before trying again; None: fail now. Only a store that is slow
        or lost a connection is retried: a refusal that is not about reachability (ACL, out
        of memory) stays, and a store that never answered and refuses connections is down."""
        if what in NOT_RETRIED or classify(exc) != "down":
            return None
        if is_refused(exc) and not self._reached:
            return None
        self._drop_clients()  # a cluster may have failed over: learn its slots again
        wait = self.budget.failed(attempt)
        if wait is None and not self._gave_up:
            self._gave_up = True
            self._count("store_unreachable")
            self._warn("shared cache %s did not answer within the join budget (%.0f s); "
                       "compiling locally what it would have given", self.display_url,
                       self.budget.seconds)
        return wait

    @property
    def clustered(self) -> bool:
        """Whether the store is a Redis Cluster."""
        return self.store_url is not None and self.store_url.cluster

    def _drop_clients(self) -> None:
        if self.clustered:
            with self._lock:
                self._clients.clear()

    def script(self, name: str, client, keys: list, args: list) -> Any:
        """Run one of SCRIPTS (inside an op's fn, with its client)."""
        if name not in self._scripts:
            self._get_client()
        return self._scripts[name](keys=keys, args=args, client=client)

    def failure(self, exc: BaseException, what: str) -> StoreFailed:
        """The StoreFailed for a store error; "down" and "auth" open the breaker."""
        kind = classify(exc)
        message = scrub(f"{type(exc).__name__}: {exc}", self.store_url.url)
        self.last_error = message
        if kind in ("down", "auth"):
            was_open = self.breaker.is_open
            self.breaker.failure()
            self._count("store_errors")
            if not was_open:
                self._warn("shared cache %s unavailable during %s (%s); continuing with local "
                           "compiles", self.display_url, what, message)
            self._drop_clients()  # rebuild a cluster's slot map when it is back
        else:
            self.breaker.success()
            log.debug("shared cache %s: %s failed: %s", self.display_url, what, message)
        return StoreFailed(kind, message)

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                with contextlib.suppress(*STORE_ERRORS):
                    client.close()
            self._clients.clear()
