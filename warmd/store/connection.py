"""Store URLs (redis://, rediss://, unix://, and Redis Cluster), redaction, bounded clients,
and the classification of store errors into what warmd does about them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from warmd.errors import WarmdInputError

CONNECT_TIMEOUT = 0.15  # seconds: a store that does not answer this fast is treated as down
SOCKET_TIMEOUT = 2.0

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_SCHEMES = ("redis", "rediss", "unix", *_CLUSTER_SCHEMES)
_SECRET_QUERY = re.compile(r"(password|passwd|token|ssl_password)=([^&]*)", re.IGNORECASE)
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class StoreURL:
    url: str = field(repr=False)  # what redis-py is given (no cluster markers); has secrets
    cluster: bool = False

    @property
    def display(self) -> str:
        return redact(self.url) + (" (cluster)" if self.cluster else "")


def redact(url: str) -> str:
    """The URL without its password (user names stay: they are not secrets)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo or user else f"***@{host}"
    query = _SECRET_QUERY.sub(lambda m: f"{m.group(1)}=***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub(text: str, url: str | None) -> str:
    """text with any secret of url replaced (for error messages that might echo it)."""
    if not url:
        return text
    try:
        parts = urlsplit(url)
        secrets = [parts.password] + [v for k, v in parse_qsl(parts.query)
                                      if _SECRET_QUERY.match(f"{k}=")]
    except ValueError:
        return text
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text.replace(url, redact(url))


def parse_store_url(url: str) -> StoreURL:
    """Check a store URL; cluster mode from a +cluster scheme or a cluster=true query."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}") from None
    if parts.scheme not in _SCHEMES:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}: the scheme must be one of "
                              f"{', '.join(s + '://' for s in _SCHEMES)}")
    if parts.scheme != "unix" and not parts.hostname:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}: no host")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise WarmdInputError(f"invalid Redis URL {redact(url)!r}: bad port") from None
    query = parse_qsl(parts.query, keep_blank_values=True)
    cluster = parts.scheme in _CLUSTER_SCHEMES
    kept = []
    for key, value in query:
        if key == "cluster":
            cluster = cluster or value.lower() in _TRUE
        else:
            kept.append((key, value))
    scheme = _CLUSTER_SCHEMES.get(parts.scheme, parts.scheme)
    if cluster and scheme == "unix":
        raise WarmdInputError("a Redis Cluster URL must be redis:// or rediss://")
    clean = urlunsplit((scheme, parts.netloc, parts.path, urlencode(kept), parts.fragment))
    return StoreURL(clean, cluster)


def make_client(store_url: StoreURL, connect_timeout: float = CONNECT_TIMEOUT,
                socket_timeout: float = SOCKET_TIMEOUT):
    """A client with bounded timeouts and no hidden retries (the breaker decides instead).
    A cluster client contacts the cluster here, so this may raise a store error."""
    options = {"socket_connect_timeout": connect_timeout, "socket_timeout": socket_timeout,
               "retry": Retry(NoBackoff(), 0), "retry_on_timeout": False}
    if store_url.cluster:
        from redis.cluster import RedisCluster

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


# RedisClusterException (slot map, blocked commands) is not a RedisError.
STORE_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)
