"""KeyValueBackend over one SQLite file (stdlib sqlite3, WAL): a store shared by the processes
of one machine, and the proof that warmd.store.backend needs no Redis. URL:
``sqlite:///path/to/file.db``.

One table, key -> (value, expiry in wall-clock milliseconds or NULL). An expired row is
absent to every read and write, and rows past their expiry are deleted now and then. Every
write runs in an IMMEDIATE transaction (the file's write lock taken first), so a
compare-and-set is atomic across threads and processes; a busy file is waited on for
`timeout` seconds, then it is "down". A file that is down opens the circuit breaker (calls
fail as "open" at once until a probe answers), counted like the Redis transport's failures
(store_errors, store_skipped). No pub/sub: a shared cache over it polls (open_sqlite)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

from warmd.errors import WarmdInputError
from warmd.store.api import StoreFailed
from warmd.store.backend import (
    NO_EXPIRY,
    KeyValueBackend,
    Put,
    StoreBackends,
    check_prefix_reads,
    check_ttl,
)
from warmd.store.breaker import CircuitBreaker
from warmd.store.chunking import size_batches

SCHEME = "sqlite"
PURGE_EVERY = 1000  # writes between two deletions of expired rows
_CHUNK = 500  # keys per statement (SQLite bounds a statement's parameters)
PUT_BATCH_BYTES = 4 << 20  # value bytes one put_many transaction writes at most
_LIVE = "(expires IS NULL OR expires > ?)"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL,
                               expires INTEGER) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_expires ON kv (expires) WHERE expires IS NOT NULL;
"""
# sqlite3's error names (Python 3.11+) -> StoreFailed kinds; any other is "error"
_KINDS = (("SQLITE_BUSY", "down"), ("SQLITE_LOCKED", "down"), ("SQLITE_CANTOPEN", "down"),
          ("SQLITE_IOERR", "down"), ("SQLITE_READONLY", "readonly"), ("SQLITE_FULL", "oom"),
          ("SQLITE_PERM", "denied"), ("SQLITE_AUTH", "denied"))


def sqlite_path(url: str) -> Path:
    """The file a ``sqlite:///path`` URL names (an absolute path; no host)."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME or parts.netloc or not parts.path or parts.query:
        raise WarmdInputError(f"invalid SQLite store URL {url!r}: expected "
                              "sqlite:///absolute/path/to/file.db")
    return Path(unquote(parts.path))


def is_sqlite_url(url: str) -> bool:
    return url.partition(":")[0].lower() == SCHEME


def usable_sqlite_path(url: str) -> Path:
    """The file of a sqlite:/// URL, its directory made; WarmdInputError when the URL is
    malformed or the file cannot be written there (bad input, not a store that is down)."""
    path = sqlite_path(url)
    problem = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        problem = exc.strerror or type(exc).__name__
    if problem is None and path.is_dir():
        problem = "a directory"
    elif problem is None and not os.access(path if path.exists() else path.parent, os.W_OK):
        problem = "not writable"
    if problem:
        raise WarmdInputError(f"SQLite store {path}: cannot write there ({problem})")
    return path


def open_sqlite(url: str, *, count: Callable[[str], None], timeout: float,
                breaker: CircuitBreaker | None = None) -> StoreBackends:
    """A shared cache's store in one SQLite file: one backend for every use, waiters poll."""
    return StoreBackends.one(SqliteBackend(usable_sqlite_path(url), timeout=timeout,
                                           count=count, breaker=breaker))


class SqliteBackend(KeyValueBackend):
    def __init__(self, path: Path | str, *, timeout: float = 5.0,
                 clock: Callable[[], float] = time.time,
                 count: Callable[[str], None] = lambda _name: None,
                 breaker: CircuitBreaker | None = None) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self._clock = clock  # wall clock: expiries are shared between processes
        self._count = count  # the store's counters (store_errors, store_skipped)
        self.breaker = breaker or CircuitBreaker()
        self._last_error: str | None = None
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._writes = 0

    @classmethod
    def from_url(cls, url: str, **kw) -> SqliteBackend:
        return cls(sqlite_path(url), **kw)

    @property
    def display_url(self) -> str:
        return f"{SCHEME}://{self.path}"

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def reachable(self) -> bool:
        return not self.breaker.is_open

    def _failed(self, exc: BaseException, what: str) -> StoreFailed:
        failed = _failure(exc, self.path, what)
        self._last_error = str(failed)
        if failed.kind == "down":
            self.breaker.failure()
            self._count("store_errors")
        else:
            self.breaker.success()
        return failed

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreFailed("disabled", f"{self.path}: closed")
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                                   check_same_thread=False)
            try:
                self._set_up(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _set_up(self, conn: sqlite3.Connection) -> None:
        """WAL, and the table. Switching a new file to WAL answers "database is locked" at
        once, without waiting, while another connection is setting it up too (the
        processes of a node opening a new store together): tried again until timeout."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)

    @contextlib.contextmanager
    def _transaction(self, what: str, write: bool = False) -> Iterator[sqlite3.Connection]:
        """One transaction (IMMEDIATE for writes), this process's threads one at a time;
        a sqlite3 or file error becomes StoreFailed."""
        if not self._closed and not self.breaker.allow():
            self._count("store_skipped")
            raise StoreFailed("open", f"{self.path}: circuit breaker open")
        with self._lock:
            try:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except (sqlite3.Error, OSError) as exc:
                raise self._failed(exc, what) from None
            try:
                yield conn
                if write:
                    self._writes += 1
                    if self._writes % PURGE_EVERY == 0:
                        conn.execute("DELETE FROM kv WHERE expires <= ?", (self._now(),))
                conn.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self._failed(exc, what) from None
                raise
            self.breaker.success()

    def _expiry(self, ttl_ms: int | None) -> int | None:
        return None if ttl_ms is None else self._now() + ttl_ms

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        found: dict[str, bytes] = {}
        with self._transaction("get") as conn:
            now = self._now()
            for chunk in _chunks(list(dict.fromkeys(keys))):
                marks = ",".join("?" * len(chunk))
                found.update(conn.execute(
                    f"SELECT key, value FROM kv WHERE key IN ({marks}) AND {_LIVE}",
                    (*chunk, now)))
        return [found.get(key) for key in keys]

    def get_prefixes(self, reads: list[tuple[str, int]]) -> list[bytes]:
        check_prefix_reads(reads)
        out = []
        with self._transaction("get") as conn:
            now = self._now()
            for key, size in reads:
                row = conn.execute(f"SELECT substr(value, 1, ?) FROM kv WHERE key = ? AND "
                                   f"{_LIVE}", (size, key, now)).fetchone()
                out.append(b"" if row is None else bytes(row[0]))
        return out

    def _live_value(self, conn: sqlite3.Connection, key: str) -> bytes | None:
        row = conn.execute(f"SELECT value FROM kv WHERE key = ? AND {_LIVE}",
                           (key, self._now())).fetchone()
        return None if row is None else row[0]

    def _write(self, conn: sqlite3.Connection, key: str, value: bytes, ttl_ms: int | None
               ) -> None:
        conn.execute("INSERT OR REPLACE INTO kv (key, value, expires) VALUES (?, ?, ?)",
                     (key, bytes(value), self._expiry(ttl_ms)))

    def put_many(self, puts: list[Put]) -> list[bool]:
        """One transaction per PUT_BATCH_BYTES of values: the write lock is never held for
        a whole publication of large artifacts, which other processes would wait on."""
        for put in puts:
            check_ttl(put.ttl_ms)
        stored: list[bool] = []
        for batch in size_batches(puts, PUT_BATCH_BYTES, size=lambda put: len(put.value)):
            with self._transaction("put", write=True) as conn:
                for put in batch:
                    refused = put.if_absent and self._live_value(conn, put.key) is not None
                    if not refused:
                        self._write(conn, put.key, put.value, put.ttl_ms)
                    stored.append(not refused)
        return stored

    def increment(self, key: str, ttl_ms: int | None = None) -> int | None:
        check_ttl(ttl_ms)
        with self._transaction("increment", write=True) as conn:
            current = self._live_value(conn, key)
            text = b"0" if current is None else bytes(current)
            if not text.lstrip(b"-").isdigit() or len(text) > 19:
                return None  # not a count: nothing counted
            count = int(text) + 1
            self._write(conn, key, str(count).encode(), ttl_ms)
        return count

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes | None,
                        ttl_ms: int | None = None) -> bool:
        check_ttl(ttl_ms)
        with self._transaction("compare-and-set", write=True) as conn:
            current = self._live_value(conn, key)
            if current != (None if expected is None else bytes(expected)):
                return False
            if value is None:
                conn.execute("DELETE FROM kv WHERE key = ?", (key,))
            else:
                self._write(conn, key, value, ttl_ms)
        return True

    def expire_many(self, keys: list[str], ttl_ms: int) -> list[bool]:
        check_ttl(ttl_ms)
        with self._transaction("expire", write=True) as conn:
            now = self._now()
            return [conn.execute(f"UPDATE kv SET expires = ? WHERE key = ? AND {_LIVE}",
                                 (now + ttl_ms, key, now)).rowcount > 0 for key in keys]

    def ttl_ms(self, key: str) -> int | None:
        with self._transaction("ttl") as conn:
            now = self._now()
            row = conn.execute(f"SELECT expires FROM kv WHERE key = ? AND {_LIVE}",
                               (key, now)).fetchone()
        if row is None:
            return None
        return NO_EXPIRY if row[0] is None else max(1, row[0] - now)

    def delete(self, keys: list[str]) -> int:
        removed = 0
        with self._transaction("delete", write=True) as conn:
            now = self._now()
            for chunk in _chunks(list(dict.fromkeys(keys))):
                marks = ",".join("?" * len(chunk))
                removed += conn.execute(
                    f"SELECT COUNT(*) FROM kv WHERE key IN ({marks}) AND {_LIVE}",
                    (*chunk, now)).fetchone()[0]
                conn.execute(f"DELETE FROM kv WHERE key IN ({marks})", chunk)
        return removed

    def scan(self, prefix: str) -> Iterator[str]:
        """The live keys under prefix when the scan started (read in one transaction)."""
        upper = _after_prefix(prefix)
        query, args = f"SELECT key FROM kv WHERE key >= ? AND {_LIVE}", [prefix]
        if upper is not None:
            query, args = query + " AND key < ?", [prefix, upper]
        with self._transaction("scan") as conn:
            found = [row[0] for row in conn.execute(query, (args[0], self._now(), *args[1:]))]
        yield from found

    def server_size(self) -> dict | None:
        """The file's bytes (with its write-ahead log) and live keys; no limit, no eviction."""
        with self._transaction("size") as conn:
            keys = conn.execute(f"SELECT COUNT(*) FROM kv WHERE {_LIVE}",
                                (self._now(),)).fetchone()[0]
        files = (self.path, self.path.with_name(self.path.name + "-wal"))
        used = sum(f.stat().st_size for f in files if f.exists())
        return {"used_memory": used, "keys": int(keys), "maxmemory": 0, "maxmemory_policy": ""}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None


def _failure(exc: BaseException, path: Path, what: str) -> StoreFailed:
    name = getattr(exc, "sqlite_errorname", "") or ""
    kind = next((k for prefix, k in _KINDS if name.startswith(prefix)), None)
    if kind is None:
        kind = "down" if isinstance(exc, OSError) else "error"
    return StoreFailed(kind, f"{path}: {what}: {type(exc).__name__}: {exc}")


def _chunks(keys: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(keys), _CHUNK):
        yield keys[start:start + _CHUNK]


def _after_prefix(prefix: str) -> str | None:
    """The least string above every string that starts with prefix (None: no bound). Text
    compares as UTF-8 bytes, which order as code points do."""
    while prefix:
        last = ord(prefix[-1]) + 1
        if last <= 0x10FFFF:
            return prefix[:-1] + chr(0xE000 if 0xD800 <= last <= 0xDFFF else last)
        prefix = prefix[:-1]
    return None
