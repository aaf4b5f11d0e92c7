"""Talking to Redis: one lazily built client, its Lua scripts, the circuit breaker, and the
one wrapper (`op`) every store call goes through, which turns store errors into StoreFailed."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from warmd.store.api import StoreFailed
from warmd.store.breaker import CircuitBreaker
from warmd.store.connection import STORE_ERRORS, StoreURL, classify, make_client, scrub

log = logging.getLogger("warmd.store")

SCRIPTS = {
    # A task record other than the stale one means published; else take the lease or say who
    # holds it.
    "claim": """
local rec = false
if redis.call('TYPE', KEYS[1])['ok'] == 'string' then rec = redis.call('GET', KEYS[1]) end
if rec and rec ~= ARGV[3] then return {2, ''} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, ''} end
return {0, redis.call('GET', KEYS[2]) or ''}
""",
    "renew": """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
""",
    "release": """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""",
    # Move a manifest aside only if it is still the one found bad ('' for a key of another
    # Redis type, which GET cannot read).
    "quarantine": """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return 0 end
if kind == 'string' then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
elseif ARGV[1] ~= '' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[4])
return 1
""",
    # Compare and set: write ARGV[2] only if the key still holds ARGV[1] (ARGV[4] == '1':
    # only if it is absent; ARGV[1] == '': a key of another Redis type).
    "replace": """
local kind = redis.call('TYPE', KEYS[1])['ok']
if ARGV[4] == '1' then
  if kind ~= 'none' then return 0 end
elseif kind == 'string' then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
elseif kind == 'none' or ARGV[1] ~= '' then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
""",
}


class RedisTransport:
    """store_url=None: every op raises StoreFailed("disabled") with disabled_reason."""

    def __init__(self, store_url: StoreURL | None, *, connect_timeout: float,
                 socket_timeout: float, breaker: CircuitBreaker | None,
                 disabled_reason: str | None, count: Callable[[str], None]) -> None:
        self.store_url = store_url
        self.connect_timeout = connect_timeout
        self.socket_timeout = socket_timeout
        self.breaker = breaker or CircuitBreaker()
        self.disabled_reason = disabled_reason if store_url else (disabled_reason or "disabled")
        self.last_error: str | None = None
        self._count = count  # the store's counters (store_skipped, store_errors)
        self._client = None
        self._scripts: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def display_url(self) -> str:
        return self.store_url.display if self.store_url else "(none)"

    def _get_client(self):
        with self._lock:
            if self._client is None:
                self._client = make_client(self.store_url, self.connect_timeout,
                                           self.socket_timeout)
                self._scripts = {name: self._client.register_script(src)
                                 for name, src in SCRIPTS.items()}
            return self._client

    def op(self, fn: Callable[[Any], Any], what: str) -> Any:
        """fn(client) through the circuit breaker; a store error raises StoreFailed."""
        if self.disabled_reason:
            self._count("store_skipped")
            raise StoreFailed("disabled", self.disabled_reason)
        if not self.breaker.allow():
            self._count("store_skipped")
            raise StoreFailed("open", "circuit breaker open")
        try:
            result = fn(self._get_client())
        except STORE_ERRORS as exc:
            raise self.failure(exc, what) from None
        self.breaker.success()
        return result

    def script(self, name: str, client, keys: list, args: list) -> Any:
        """Run one of SCRIPTS (inside an op's fn, with its client)."""
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
                log.warning("shared cache %s unavailable during %s (%s); continuing with local "
                            "compiles", self.display_url, what, message)
            if self.store_url.cluster:
                with self._lock:
                    self._client = None  # rebuild the slot map when the cluster is back
        else:
            self.breaker.success()
            log.debug("shared cache %s: %s failed: %s", self.display_url, what, message)
        return StoreFailed(kind, message)

    def checked(self, value: Any, what: str) -> Any:
        """A pipeline result, or StoreFailed when it is an error."""
        if isinstance(value, Exception):
            raise self.failure(value, what)
        return value

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                with contextlib.suppress(*STORE_ERRORS):
                    self._client.close()
                self._client = None
