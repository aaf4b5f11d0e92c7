"""The narrow store interface: bytes values under str keys, in the style of ccache's remote
storage. Manifests, records, signing, quarantine and claims sit above it and do not know
which store holds their keys; a backend (warmd.store.redis_backend over Redis,
warmd.store.sqlite_backend over one SQLite file) implements only these operations.

Failures are typed: a store failure raises warmd.store.api.StoreFailed and nothing else, its
`kind` one of "down", "auth", "denied", "readonly", "oom", "disabled", "open", "error". An
argument out of range (a TTL under 1 ms) is the caller's bug and raises ValueError.

A key that holds something this interface cannot read (on Redis, a key of another type,
e.g. planted) reads as None but is there: `put(if_absent=True)` and `compare_and_set` never
match it, a plain `put` replaces it, `delete` removes it, `expire` and `ttl_ms` see it.

Beside its keys a backend says how it is (`display_url`, `disabled_reason`, `last_error`,
`reachable`, `ping`): what the shared cache and the commands show and decide on. The defaults
suit a backend with no breaker and nothing to say; `server_size` and `client_op` are Redis's
extras (the daemon's status, the operator commands), which another backend answers with
None and a StoreFailed saying it has none. `StoreBackends` is what a shared cache runs over.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from warmd.store.api import StoreFailed
from warmd.store.wakeups import WakeUps

NO_EXPIRY = -1  # what ttl_ms says of a key that lives until it is deleted
PING_KEY = "warmd:v1:ping"  # read (never written) by the default ping


@dataclass(frozen=True)
class Put:
    """One value for put_many: key, value, its time to live (None: none), and whether it is
    stored only where the key is absent."""

    key: str
    value: bytes
    ttl_ms: int | None = None
    if_absent: bool = False


class KeyValueBackend(ABC):
    """Bytes values under str keys, each with an optional time to live in milliseconds."""

    @abstractmethod
    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """The values at keys, in their order, in one round trip (None: absent or expired)."""

    def get(self, key: str) -> bytes | None:
        """The value at key (None: absent or expired)."""
        return self.get_many([key])[0]

    @abstractmethod
    def get_prefixes(self, reads: list[tuple[str, int]]) -> list[bytes]:
        """For each (key, n), at most the first n bytes of its value, all in one round trip;
        b"" where the key is absent, expired or unreadable. What a reader gets back is
        bounded by what it asked for, whatever a writer stored (get reads a whole value)."""

    def put(self, key: str, value: bytes, ttl_ms: int | None = None, *,
            if_absent: bool = False) -> bool:
        """Store value (ttl_ms None: no expiry); False only when if_absent and key exists."""
        return self.put_many([Put(key, value, ttl_ms, if_absent)])[0]

    @abstractmethod
    def put_many(self, puts: list[Put]) -> list[bool]:
        """Each put as ``put`` does it, all in one round trip: each one atomic, not all of
        them together, and in no order among them that a reader could rely on (a value
        that must be visible only after another is put by a later call). Raises
        StoreFailed when any one fails."""

    @abstractmethod
    def increment(self, key: str, ttl_ms: int | None = None) -> int | None:
        """Atomically add one to the count at key (decimal text; absent: 0) and let it live
        ttl_ms from now: the new count; None when the key holds what is not a count."""

    @abstractmethod
    def compare_and_set(self, key: str, expected: bytes | None, value: bytes | None,
                        ttl_ms: int | None = None) -> bool:
        """Atomically, if key holds expected (None: is absent), store value (None: delete
        it); False when it does not."""

    def expire(self, key: str, ttl_ms: int) -> bool:
        """Let key live ttl_ms from now; False when the key is gone."""
        return self.expire_many([key], ttl_ms)[0]

    @abstractmethod
    def expire_many(self, keys: list[str], ttl_ms: int) -> list[bool]:
        """``expire`` of each key, in one round trip."""

    @abstractmethod
    def ttl_ms(self, key: str) -> int | None:
        """Milliseconds key has left: None when it is gone, NO_EXPIRY when it has no TTL."""

    @abstractmethod
    def delete(self, keys: list[str]) -> int:
        """Remove keys; how many of them were there."""

    @abstractmethod
    def scan(self, prefix: str) -> Iterator[str]:
        """Every key that starts with prefix, each once, in no particular order."""

    @abstractmethod
    def close(self) -> None:
        """Let go of the store's connections and files."""

    # -- how the store is: what messages show and the shared cache decides on ----------------

    @property
    def display_url(self) -> str:
        """Where the store is, with no secret in it."""
        return type(self).__name__

    @property
    def disabled_reason(self) -> str | None:
        """Why every call fails as "disabled" (None: the backend is on)."""
        return None

    @property
    def last_error(self) -> str | None:
        """The last failure, secrets scrubbed (None: none yet)."""
        return None

    @property
    def reachable(self) -> bool:
        """False while calls are held back (a breaker open after the store went down)."""
        return True

    def ping(self) -> bool:
        """Whether the store answers now (one read)."""
        try:
            self.ttl_ms(PING_KEY)
        except StoreFailed:
            return False
        return True

    # -- Redis's extras: another backend has none ---------------------------------------------

    def server_size(self) -> dict | None:
        """What the server says of its size (warmd.store.redis_backend); None: unknown."""
        return None

    def client_op(self, fn: Callable[[Any], Any], what: str) -> Any:
        """fn(client) on the store's own client, for the operator commands written for Redis
        (warmd.store.admin); a backend without one raises StoreFailed saying so."""
        raise StoreFailed("error", f"{what} works on a Redis store only")


class NoStore(KeyValueBackend):
    """No store at all (turned off, or none could start): every call fails as "disabled"
    with the reason, counted as skipped."""

    def __init__(self, reason: str, count: Callable[[str], None] = lambda _name: None
                 ) -> None:
        self.reason = reason
        self._count = count

    def _refuse(self, *_args, **_kw):
        self._count("store_skipped")
        raise StoreFailed("disabled", self.reason)

    get_many = get_prefixes = put_many = increment = compare_and_set = expire_many = ttl_ms = \
        delete = _refuse

    def scan(self, prefix: str) -> Iterator[str]:
        return self._refuse()

    def close(self) -> None:
        pass

    @property
    def display_url(self) -> str:
        return "(none)"

    @property
    def disabled_reason(self) -> str | None:
        return self.reason


@dataclass
class StoreBackends:
    """What a shared cache runs over: one store seen through backends for each use (on
    Redis each its own retry policy over one connection; elsewhere all may be one object),
    and the wake-ups its waiters get. Closing `main` lets go of the store."""

    main: KeyValueBackend
    claims: KeyValueBackend  # leases and claims on work: a call is never retried
    stats: KeyValueBackend  # the counters: best effort, never retried
    replicas: KeyValueBackend | None = None  # reads that replicas may answer (they may lag)
    wakeups: WakeUps = field(default_factory=WakeUps)

    @classmethod
    def one(cls, backend: KeyValueBackend, wakeups: WakeUps | None = None) -> StoreBackends:
        """A store whose one backend serves every use (waiters poll unless given wakeups)."""
        return cls(backend, backend, backend, None, wakeups or WakeUps())


def check_prefix_reads(reads: list[tuple[str, int]]) -> None:
    """Each read asks for at least one byte (else the caller's bug)."""
    for key, size in reads:
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"a prefix read of {key!r} must ask for 1 byte or more, "
                             f"not {size!r}")


def check_ttl(ttl_ms: int | None) -> None:
    """A TTL is None or a positive number of milliseconds (else the caller's bug)."""
    if ttl_ms is not None and (not isinstance(ttl_ms, int) or ttl_ms < 1):
        raise ValueError(f"ttl_ms must be None or a positive int, not {ttl_ms!r}")
