"""KeyValueBackend over Redis (or Redis Cluster): every call goes through the shared cache's
RedisTransport, so the join budget, retries, circuit breaker, cluster and replica handling
are the transport's, and its store errors arrive as StoreFailed.

A key of another Redis type (planted: a hash, a list, ...) is never read as a value: get
gives None for it, SET NX and the "cas" script (warmd.store.transport.SCRIPTS) see it as
present and never matching, a plain put (SET) replaces it and delete removes it.

`open_redis` builds what a shared cache runs over (warmd.store.backend.StoreBackends): one
transport, a backend per use, pub/sub wake-ups."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import redis

from warmd.store.api import StoreFailed
from warmd.store.backend import (
    NO_EXPIRY,
    KeyValueBackend,
    Put,
    StoreBackends,
    check_prefix_reads,
    check_ttl,
)
from warmd.store.breaker import CircuitBreaker, JoinBudget
from warmd.store.connection import StoreURL, classify
from warmd.store.redis_wakeups import RedisWakeUps
from warmd.store.transport import RedisTransport

SCAN_COUNT = 1000  # keys per SCAN step
_GLOB = re.compile(r"([*?\[\]\\])")


# What Redis answers an INCR of a value that is no count (another type, text, too large)
_NOT_A_COUNT = re.compile(r"WRONGTYPE|not an integer|out of range")

class RedisBackend(KeyValueBackend):
    """what: the name every call goes through transport.op under (None: each its own, e.g.
    "fetch", "put"); one of transport.NOT_RETRIED, e.g. "stats", for best-effort users.
    replicas: reads (get_many, get_prefixes) may be answered by replicas, when the URL asks
    for it (transport.replica_reads); they may lag."""

    def __init__(self, transport: RedisTransport, what: str | None = None,
                 replicas: bool = False) -> None:
        self.transport = transport
        self.what = what
        self.replicas = replicas

    def _as(self, name: str) -> str:
        return self.what or name

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        what = self._as("fetch")
        replies = self._pipelined([("get", (key,), {}) for key in keys], what, read=True)
        return [self._value(reply, what) for reply in replies]

    def get_prefixes(self, reads: list[tuple[str, int]]) -> list[bytes]:
        """GETRANGE: an absent key reads b"" (as Redis answers), one of another type too."""
        check_prefix_reads(reads)
        what = self._as("fetch")
        replies = self._pipelined([("getrange", (key, 0, size - 1), {}) for key, size in reads],
                                  what, read=True)
        return [self._value(reply, what) or b"" for reply in replies]

    def _pipelined(self, commands: list[tuple[str, tuple, dict]], what: str,
                   read: bool = False) -> list:
        """One round trip of commands (name, args, keyword args), each reply or error in
        place; reads go to replicas when this backend's do, writes never."""
        def run(client):
            pipe = client.pipeline(transaction=False)
            for name, args, kwargs in commands:
                getattr(pipe, name)(*args, **kwargs)
            replies = pipe.execute(raise_on_error=False)
            # a cluster pipeline hands a lost connection back as a reply: raised, so that
            # op's retry policy (and its failover handling) applies as to any one command
            lost = next((r for r in replies if isinstance(r, Exception)
                         and classify(r) == "down"), None)
            if lost is not None:
                raise lost
            return replies

        if not commands:
            return []
        return self.transport.op(run, what, replicas=read and self.replicas)

    def _reply(self, reply: object, what: str) -> object:
        """A pipelined write's reply; its error as StoreFailed."""
        if isinstance(reply, Exception):
            raise self.transport.failure(reply, what)
        return reply

    def _value(self, reply: object, what: str) -> bytes | None:
        if isinstance(reply, Exception):
            if str(reply).startswith("WRONGTYPE"):
                return None  # a key of another Redis type holds no value of ours
            raise self.transport.failure(reply, what)
        return reply  # type: ignore[return-value]

    def put_many(self, puts: list[Put]) -> list[bool]:
        """SETs (PX, NX) in one pipeline; never retried when one is if_absent (a retry of a
        SET NX that landed would read as refused). On a Redis Cluster, puts if absent go one
        by one: its pipeline sends a command whose reply was lost again by itself, whatever
        the client's retry settings."""
        for put in puts:
            check_ttl(put.ttl_ms)
        if_absent = any(p.if_absent for p in puts)
        what = self._as("put-if-absent" if if_absent else "put")
        if if_absent and self.transport.clustered:
            return self.transport.op(lambda c: [c.set(p.key, p.value, px=p.ttl_ms,
                                                      nx=p.if_absent) is not None
                                                for p in puts], what)
        replies = self._pipelined([("set", (p.key, p.value), {"px": p.ttl_ms, "nx": p.if_absent})
                                   for p in puts], what)
        return [self._reply(reply, what) is not None for reply in replies]

    def increment(self, key: str, ttl_ms: int | None = None) -> int | None:
        check_ttl(ttl_ms)

        expiry = [("pexpire", (key, ttl_ms), {})] if ttl_ms is not None else []
        reply = self._pipelined([("incr", (key,), {}), *expiry],  # count and TTL, one trip
                                self._as("increment"))[0]
        if isinstance(reply, redis.ResponseError) and _NOT_A_COUNT.search(str(reply)):
            return None  # not a count of ours: nothing counted
        if isinstance(reply, Exception):
            raise self.transport.failure(reply, "increment")
        return int(reply)

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes | None,
                        ttl_ms: int | None = None) -> bool:
        check_ttl(ttl_ms)
        args = ["0" if expected is None else "1", expected or b"",
                "0" if value is None else "1", value or b"", str(ttl_ms or 0)]
        return bool(self.transport.op(
            lambda c: self.transport.script("cas", c, [key], args), self._as("compare-and-set")))

    def expire_many(self, keys: list[str], ttl_ms: int) -> list[bool]:
        check_ttl(ttl_ms)
        what = self._as("expire")
        replies = self._pipelined([("pexpire", (key, ttl_ms), {}) for key in keys], what)
        return [bool(self._reply(reply, what)) for reply in replies]

    def ttl_ms(self, key: str) -> int | None:
        left = int(self.transport.op(lambda c: c.pttl(key), self._as("ttl")))
        if left == -2:
            return None
        return NO_EXPIRY if left == -1 else left

    def delete(self, keys: list[str]) -> int:
        if not keys:
            return 0
        return int(self.transport.op(lambda c: c.delete(*keys), self._as("delete")))

    def scan(self, prefix: str) -> Iterator[str]:
        """The keys found in one pass (SCAN over every primary of a cluster); a key that is
        not UTF-8 cannot be named through this interface and is left out."""
        pattern = _GLOB.sub(r"\\\1", prefix) + "*"
        found = self.transport.op(
            lambda c: list(c.scan_iter(match=pattern, count=SCAN_COUNT)), self._as("scan"))
        for raw in dict.fromkeys(found):
            try:
                yield raw.decode() if isinstance(raw, bytes) else str(raw)
            except UnicodeDecodeError:
                continue

    def server_size(self) -> dict | None:
        """What the Redis server says of its size (not part of the interface: the daemon's
        status shows it): {"used_memory", "keys", "maxmemory" (0: no limit),
        "maxmemory_policy"}; None from a Redis Cluster, which answers per node."""
        def measure(c) -> dict:
            memory = c.info("memory")
            return {"used_memory": int(memory.get("used_memory", 0)), "keys": int(c.dbsize()),
                    "maxmemory": int(memory.get("maxmemory", 0)),
                    "maxmemory_policy": str(memory.get("maxmemory_policy", ""))}

        try:
            return self.transport.op(measure, self._as("size"))
        except (AttributeError, TypeError, ValueError):
            return None

    def close(self) -> None:
        self.transport.close()

    @property
    def display_url(self) -> str:
        return self.transport.display_url

    @property
    def disabled_reason(self) -> str | None:
        return self.transport.disabled_reason

    @property
    def last_error(self) -> str | None:
        return self.transport.last_error

    @property
    def reachable(self) -> bool:
        return not self.transport.breaker.is_open

    def ping(self) -> bool:
        try:
            return bool(self.transport.op(lambda c: c.ping(), "connect"))
        except StoreFailed:
            return False

    def client_op(self, fn: Callable[[Any], Any], what: str) -> Any:
        """fn(client) through the transport (budget, breaker, failures as StoreFailed)."""
        return self.transport.op(fn, what)


def open_redis(store_url: StoreURL, *, count: Callable[[str], None], connect_timeout: float,
               socket_timeout: float, join_budget: float,
               breaker: CircuitBreaker | None = None) -> StoreBackends:
    """A shared cache's store on Redis: one transport (counting its failures with `count`),
    a backend per use with its retry policy, replica reads when the URL asks for them, and
    Redis pub/sub wake-ups."""
    transport = RedisTransport(store_url, connect_timeout=connect_timeout,
                               socket_timeout=socket_timeout, breaker=breaker,
                               disabled_reason=None, count=count,
                               budget=JoinBudget(join_budget))
    replicas = RedisBackend(transport, replicas=True) if transport.replica_reads else None
    return StoreBackends(main=RedisBackend(transport),
                         claims=RedisBackend(transport, what="lease"),
                         stats=RedisBackend(transport, what="stats"), replicas=replicas,
                         wakeups=RedisWakeUps(transport))

