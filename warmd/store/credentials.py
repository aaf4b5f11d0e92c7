"""Secrets out of the environment warmd's children inherit.

A store URL's password (WARMD_REDIS_URL=redis://user:pw@host/0, or ?password=...) is
moved, before any child starts, into a file only the user can read (<state dir>/secrets,
0700; the file 0600, named by a digest of its content so runs reuse it), and the variable is
rewritten to point at it: WARMD_REDIS_URL=redis://user@host/0?password_file=PATH. Workers,
ninja and nvcc (and a Ray worker started from this process) then carry no secret in
/proc/<pid>/environ, while any of them that opens the store still can. A signing key
given as WARMD_SIGNING_KEY is moved the same way: the variable becomes
"warmd-secret-file:<path>" (settings.SECRET_FILE_PREFIX), which settings.signing_key() reads.

No Redis import here: the CLI calls protect_environment() before it knows a store is used.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode

from warmd import settings
from warmd.errors import WarmdInputError

log = logging.getLogger("warmd.store")

PASSWORD_FILE = "password_file"  # the store URL's query parameter naming a password file
USERNAME_FILE = "username_file"  # ...and one naming a file holding a userinfo without ':'
SECRET_QUERY = re.compile(r"(password|passwd|token|username)=([^&]*)", re.IGNORECASE)
_USERINFO_DELIMITERS = "@/?#"


def split_userinfo(url: str) -> tuple[str, str, str]:
    """(scheme://, userinfo, rest). The userinfo runs to the LAST '@' after '://', not to
    the first '/', '?' or '#' as urlsplit has it: a password may hold those characters."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, after = rest.rpartition("@")
    if not at:
        return scheme + sep, "", rest
    return scheme + sep, userinfo, after


def unencoded_userinfo(url: str) -> bool:
    """Whether the user name or password holds a raw '@', '/', '?' or '#': then redis-py,
    urlsplit and warmd's redaction could each see a different host (refused)."""
    _head, userinfo, _rest = split_userinfo(url)
    return any(c in userinfo for c in _USERINFO_DELIMITERS)


def protect_environment() -> None:
    """Move the password of WARMD_REDIS_URL and the key in WARMD_SIGNING_KEY into 0600 files
    (see the module's docstring);
    a no-op when there is none. Bad input is left for the URL's
    parser to refuse; a state directory that cannot be written leaves the variables as
    they are (with a warning)."""
    try:
        _protect_environment()
    except OSError as exc:
        log.warning("cannot move secrets out of the environment (%s); child processes "
                    "will inherit them", exc)


def _protect_environment() -> None:
    url = settings.redis_url()
    if url and not settings.store_is_off(url) and not unencoded_userinfo(url):
        safe = url_without_secrets(url)
        if safe != url:
            os.environ["WARMD_REDIS_URL"] = safe
    key = settings.signing_key_text()
    if key and not key.startswith(settings.SECRET_FILE_PREFIX):
        # Rewritten in place (not moved to WARMD_SIGNING_KEY_FILE), so whoever set the variable
        # in this process also restores it.
        path = secret_file("signing-key", key)
        os.environ["WARMD_SIGNING_KEY"] = settings.SECRET_FILE_PREFIX + str(path)


def url_without_secrets(url: str) -> str:
    """url with its password (userinfo or query) replaced by a password_file parameter. A
    userinfo without ':' and no password anywhere (redis://TOKEN@host) may be a token:
    redaction hides it, and it moves to a username_file (redis-py reads it as the user
    name, and still does from the file)."""
    head, userinfo, rest = split_userinfo(url)
    user, colon, password = userinfo.partition(":")
    password = unquote(password) if colon else ""
    base, qmark, query = rest.partition("?")
    query, hash_, fragment = query.partition("#")
    kept = []
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name.lower() == "password" and not password:
            password = value
        else:
            kept.append((name, value))
    token = ""
    if user and not colon and not password and all(n != PASSWORD_FILE for n, _ in kept):
        token, user = unquote(user), ""
    if not password and not token:
        return url
    if password:
        kept.append((PASSWORD_FILE, str(secret_file("redis-password", password))))
    if token:
        kept.append((USERNAME_FILE, str(secret_file("redis-username", token))))
    return f"{head}{user + '@' if user else ''}{base}?{urlencode(kept)}{hash_}{fragment}"


def with_password_file(netloc: str, query: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """query with its password_file (username_file) parameter resolved into a password
    (username) parameter, what redis-py reads for every scheme, unix:// included. Raises
    WarmdInputError for an unreadable file or a URL that also carries what the file does."""
    userinfo = netloc.rpartition("@")[0]
    for param, field, also in ((PASSWORD_FILE, "password", ":" in userinfo),
                               (USERNAME_FILE, "username", bool(userinfo))):
        files = [value for name, value in query if name == param]
        if not files:
            continue
        query = [(name, value) for name, value in query if name != param]
        if len(files) > 1 or also or any(name.lower() == field for name, _ in query):
            raise WarmdInputError(f"invalid Redis URL: {param} with another {field}")
        query.append((field, _read_secret(param, files[0])))
    return query


def _read_secret(param: str, path: str) -> str:
    try:
        return Path(path).read_text().rstrip("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise WarmdInputError(f"cannot read the Redis {param} {path}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None


def secret_file(kind: str, secret: str) -> Path:
    """A 0600 file holding secret under <state dir>/secrets (0700), written once."""
    directory = settings.state_dir() / "secrets"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    path = directory / f"{kind}-{hashlib.sha256(secret.encode()).hexdigest()[:16]}"
    if path.exists() and path.read_text() == secret:
        return path
    tmp = directory / f".{path.name}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret)
    os.replace(tmp, path)
    return path
