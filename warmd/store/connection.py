"""Store URLs (redis://, rediss://, unix://, and Redis Cluster), redaction, bounded clients,
and the classification of store errors into what warmd does about them."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from warmd.errors import WarmdInputError
from warmd.store.credentials import (
    SECRET_QUERY,
    split_userinfo,
    unencoded_userinfo,
    with_password_file,
)

CONNECT_TIMEOUT = 0.15  # seconds: a store that does not answer this fast is treated as down
SOCKET_TIMEOUT = 2.0

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_SCHEMES = ("redis", "rediss", "unix", *_CLUSTER_SCHEMES)
_TRUE = ("1", "true", "yes", "on")


# What the URL may ask of a Redis Cluster client's reads (redis-py's LoadBalancingStrategy
# values; read_from_replicas=true is round_robin, its older spelling).
READ_STRATEGIES = ("round_robin", "round_robin_replicas", "random", "random_replica")
_READ_KEYS = ("read_from_replicas", "load_balancing_strategy")


@dataclass(frozen=True)
class StoreURL:
    url: str = field(repr=False)  # what redis-py is given (no cluster markers); has secrets
    cluster: bool = False
    read_from: str | None = None  # a READ_STRATEGIES value: reads may go to replicas

    @property
    def display(self) -> str:
        notes = ["cluster"] if self.cluster else []
        notes += [f"reads: {self.read_from}"] if self.read_from else []
        return redact(self.url) + (f" ({', '.join(notes)})" if notes else "")


def redact(url: str) -> str:
    """The URL without its password (a user name before ':' stays: it is not a secret;
    userinfo without ':' may be a password and is masked whole)."""
    head, userinfo, rest = split_userinfo(url)
    if userinfo:
        user, colon, _password = userinfo.partition(":")
        head += f"{user}:***@" if colon else "***@"
    return head + SECRET_QUERY.sub(lambda m: f"{m.group(1)}=***", rest)


def _secrets(url: str) -> list[str]:
    _head, userinfo, rest = split_userinfo(url)
    found = [userinfo.partition(":")[2] or userinfo] if userinfo else []
    found += [m.group(2) for m in SECRET_QUERY.finditer(rest)]
    return [s for secret in found if secret for s in {secret, unquote(secret)} if s]


def scrub(text: str, url: str | None) -> str:
    """text with any secret of url replaced (for error messages that might echo it)."""
    if not url:
        return text
    secrets = sorted(_secrets(url), key=len, reverse=True)
    pieces = []
    for piece in text.split(url):
        for secret in secrets:
            piece = piece.replace(secret, "***")
        pieces.append(piece)
    return redact(url).join(pieces)


def parse_store_url(url: str) -> StoreURL:
    """Check a store URL; cluster mode from a +cluster scheme or a cluster=true query."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}{_hint(url)}") from None
    if parts.scheme not in _SCHEMES:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}: the scheme must be one of "
                              f"{', '.join(s + '://' for s in _SCHEMES)}")
    if unencoded_userinfo(url):
        # urlsplit, redis-py and redact() would not agree on where the host is: never guess
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}: an unencoded '@', '/', "
                              f"'?' or '#' in the user name or password{_hint(url)}")
    if parts.scheme != "unix" and not parts.hostname:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}: no host{_hint(url)}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}: bad port{_hint(url)}"
                              ) from None
    query = with_password_file(parts.netloc, parse_qsl(parts.query, keep_blank_values=True))
    cluster = parts.scheme in _CLUSTER_SCHEMES
    kept, reads = [], {}
    for key, value in query:
        if key == "cluster":
            cluster = cluster or value.lower() in _TRUE
        elif key in _READ_KEYS:
            reads[key] = value
        else:
            kept.append((key, value))
    scheme = _CLUSTER_SCHEMES.get(parts.scheme, parts.scheme)
    if cluster and scheme == "unix":
        raise WarmdInputError("a Redis Cluster URL must be redis:// or rediss://")
    read_from = _read_strategy(url, reads)
    if read_from and not cluster:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}: replica reads "
                              f"({', '.join(reads)}) need a Redis Cluster URL "
                              "(redis+cluster://host:port)")
    # Built by hand: urlunsplit turns unix:///tmp/x.sock into unix:/tmp/x.sock.
    clean = f"{scheme}://{parts.netloc}{parts.path}"
    clean += f"?{urlencode(kept)}" if kept else ""
    clean += f"#{parts.fragment}" if parts.fragment else ""
    try:
        redis.connection.parse_url(clean)  # what redis-py will do with it, checked now
    except ValueError as exc:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}: "
                              f"{scrub(str(exc), url)}") from None
    return StoreURL(clean, cluster, read_from)


def _read_strategy(url: str, reads: dict[str, str]) -> str | None:
    """The read strategy the URL asks for (None: every read from the primaries)."""
    strategy = reads.get("load_balancing_strategy", "").lower() or None
    if strategy is not None and strategy not in READ_STRATEGIES:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}: load_balancing_strategy "
                              f"must be one of {', '.join(READ_STRATEGIES)}")
    if strategy is None and reads.get("read_from_replicas", "").lower() in _TRUE:
        strategy = "round_robin"
    return strategy


def _hint(url: str) -> str:
    if "@" in url:
        return (" (percent-encode '@', '/', '?' and '#' in a user name or password: %40, %2F, "
                "%3F, %23)")
    return ""


def make_client(store_url: StoreURL, connect_timeout: float = CONNECT_TIMEOUT,
                socket_timeout: float = SOCKET_TIMEOUT, replicas: bool = False):
    """A client with bounded timeouts and no hidden retries (the transport retries and the
    breaker decides instead). With replicas, a cluster client whose reads follow the URL's
    read strategy (read_from_replicas / load_balancing_strategy); else every command goes to
    the primaries. A cluster client contacts the cluster here, so this may raise a store
    error."""
    options = {"socket_connect_timeout": connect_timeout, "socket_timeout": socket_timeout,
               "retry": Retry(NoBackoff(), 0), "retry_on_timeout": False}
    if store_url.cluster:
        from redis.cluster import LoadBalancingStrategy, RedisCluster

        if replicas and store_url.read_from:
            options["load_balancing_strategy"] = LoadBalancingStrategy(store_url.read_from)
        return RedisCluster.from_url(store_url.url, **options)
    return redis.Redis.from_url(store_url.url, **options)


# What warmd does about an error, by kind: "down" opens the breaker; the others are
# per-operation failures that leave reads working.
def classify(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, redis.exceptions.NoPermissionError) or any(
            mark in text for mark in ("NOPERM", "no permissions", "can't run this command")):
        return "denied"
    if isinstance(exc, redis.exceptions.OutOfMemoryError) or "OOM command not allowed" in text:
        return "oom"
    if isinstance(exc, redis.exceptions.ReadOnlyError) or (
            "READONLY" in text or "read only replica" in text):
        return "readonly"
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return "auth"
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                        redis.exceptions.ClusterError, redis.exceptions.RedisClusterException,
                        OSError)):
        return "down"
    return "error"


_NEVER_ANSWERS = (ConnectionRefusedError, FileNotFoundError, ssl.SSLCertVerificationError)
_NEVER_ANSWERS_TEXT = ("Connection refused", "No such file or directory",
                       "CERTIFICATE_VERIFY_FAILED")


def is_refused(exc: BaseException) -> bool:
    """Whether waiting cannot help: nothing listens where the store should be (the
    connection refused, no socket file at the path), or its certificate is not trusted
    here. A store that is down or misconfigured, not a slow one."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, _NEVER_ANSWERS) or any(t in str(exc) for t in _NEVER_ANSWERS_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# RedisClusterException (slot map, blocked commands) is not a RedisError.
STORE_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)
